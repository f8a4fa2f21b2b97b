"""Per-call cost of the reattach call journal (BENCHMARKS.md, Reattach): two
`box serve --listen` hosts (docker backend) side by side, one keeping state
(`--state DIR`: the session is kept and every call journalled), one with
`--state none`; CALLS (1000) sequential `read` calls of a small file per host
through the Python mcp SDK, interleaved in blocks of 20. Prints p50/p10 and
their ratio as one JSON line.

    .venv/bin/python scripts/bench-journal.py target/release/box
"""
import asyncio, json, os, subprocess, sys, tempfile, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
from mcp.client.client import Client
from serve_http import free_port, wait_listening

BOX = sys.argv[1]
N = int(os.environ.get("CALLS", "1000"))

async def main():
    work = tempfile.mkdtemp()
    with open(os.path.join(work, "small.txt"), "w") as f:
        f.write("hello\n" * 20)
    state = tempfile.mkdtemp()
    hosts = []
    for label, st in (("state", state), ("none", "none")):
        port = free_port()
        p = subprocess.Popen([BOX, "serve", "--backend", "docker", "--listen", str(port),
                              "--workspace", work, "--state", st, "--instance", f"jb-{label}-{os.getpid()}"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_listening(port, p)
        hosts.append((label, port, p))
    try:
        ports = {l: p for l, p, _ in hosts}
        async with Client(f"http://127.0.0.1:{ports['state']}/mcp") as a, Client(f"http://127.0.0.1:{ports['none']}/mcp") as b:
            clients = {"state": a, "none": b}
            times = {"state": [], "none": []}
            for _ in range(20):
                for c in clients.values():
                    await c.call_tool("read", {"path": "small.txt"})
            for block in range(N // 20):
                for label, c in clients.items():
                    for _ in range(20):
                        t = time.perf_counter()
                        r = await c.call_tool("read", {"path": "small.txt"})
                        times[label].append(time.perf_counter() - t)
                        assert not r.is_error
            journal = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(state) for f in fs)
            out = {}
            for label, ts in times.items():
                ts.sort()
                out[label] = {"p50_ms": round(ts[len(ts)//2]*1000, 3), "p10_ms": round(ts[len(ts)//10]*1000, 3)}
            out["ratio_p50"] = round(out["state"]["p50_ms"] / out["none"]["p50_ms"], 3)
            out["ratio_p10"] = round(out["state"]["p10_ms"] / out["none"]["p10_ms"], 3)
            out["state_dir_bytes"] = journal
            print(json.dumps(out))
    finally:
        for _, _, p in hosts:
            p.terminate(); p.wait()

asyncio.run(main())
