"""A one-shot call's latency, cold and warm (BENCHMARKS.md, Stateless revision): two
`box serve --listen --state none` hosts on the docker backend, one with a warm pool
(`--pool default=2`), one without; a 2026-07-28 client (Python mcp SDK) makes ONE_SHOT (20)
`read` calls without a handle on each, alternating, each in a session and unit of its own
removed after the call, waiting after each round until the pool is full again. Prints
p50/p10 of each, the ratio and the pool's claims by outcome (from /metrics) as one JSON line.

    .venv/bin/python scripts/bench-one-shot.py target/x86_64-unknown-linux-gnu/debug/box
"""
import asyncio, json, os, re, statistics, subprocess, sys, tempfile, time, urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
from mcp.client.client import Client
from serve_http import free_port, wait_listening

BOX = sys.argv[1]
ONE_SHOT = int(os.environ.get("ONE_SHOT", "20"))


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


async def pool_full(port, size):
    for _ in range(600):
        ready = re.search(r'box_pool_ready\{profile="default"\} (\d+)', metrics(port))
        if ready and int(ready.group(1)) >= size:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the pool did not fill")


async def one_call(url, times):
    async with Client(url, mode="2026-07-28") as client:
        start = time.perf_counter()
        result = await client.call_tool("read", {"path": "small.txt"})
        times.append(time.perf_counter() - start)
        assert not result.is_error, result


async def main():
    work = tempfile.mkdtemp()
    with open(os.path.join(work, "small.txt"), "w") as f:
        f.write("hello\n" * 20)
    hosts = {}
    for label, extra in (("cold", []), ("warm", ["--pool", "default=2"])):
        port = free_port()
        process = subprocess.Popen(
            [BOX, "serve", "--backend", "docker", "--listen", f"127.0.0.1:{port}", "--workspace", work,
             "--state", "none", *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_listening(port, process)
        hosts[label] = (port, process)
    try:
        times = {"cold": [], "warm": []}
        await pool_full(hosts["warm"][0], 2)
        # A first round each, dropped (the clients' imports, the engine's caches).
        for label in ("cold", "warm"):
            await one_call(f"http://127.0.0.1:{hosts[label][0]}/mcp", [])
        for _ in range(ONE_SHOT):
            await pool_full(hosts["warm"][0], 2)
            for label in ("cold", "warm"):
                await one_call(f"http://127.0.0.1:{hosts[label][0]}/mcp", times[label])
        claims = dict(re.findall(r'box_pool_claims_total\{[^}]*outcome="(\w+)"[^}]*\} (\d+)', metrics(hosts["warm"][0])))
        ms = lambda v: round(v * 1000, 1)
        print(json.dumps({
            "calls": ONE_SHOT,
            "cold_p50_ms": ms(statistics.median(times["cold"])), "cold_p10_ms": ms(pct(times["cold"], 0.1)),
            "warm_p50_ms": ms(statistics.median(times["warm"])), "warm_p10_ms": ms(pct(times["warm"], 0.1)),
            "ratio_p50": round(statistics.median(times["warm"]) / statistics.median(times["cold"]), 3),
            "warm_claims": claims,
        }))
    finally:
        for _, process in hosts.values():
            process.terminate()
            process.wait(timeout=60)


asyncio.run(main())
