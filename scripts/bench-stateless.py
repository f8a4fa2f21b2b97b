"""Per-call cost of MCP 2026-07-28 on box (BENCHMARKS.md, Stateless revision): one
`box serve --listen` host; a handshake-era client (Python mcp SDK, mode "legacy",
`Mcp-Session-Id`) and a 2026-07-28 client carrying its session handle in `_meta` each
make CALLS (600) sequential `read` calls of a small file, interleaved in blocks of 20;
then ONE_SHOT (20) calls without a handle, each in a unit started for it and removed
after it. Prints p50/p10 of each and the handle's ratio as one JSON line.

    .venv/bin/python scripts/bench-stateless.py target/release/box local
"""
import asyncio, json, os, statistics, subprocess, sys, tempfile, time
from typing import Any, Literal

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
import mcp.types as types
from mcp.client.client import Client
from serve_http import free_port, wait_listening
from stateless_sdk import OpenParams, OpenRequest, Opened

BOX = sys.argv[1]
BACKEND = sys.argv[2] if len(sys.argv) > 2 else "local"
N = int(os.environ.get("CALLS", "600"))
ONE_SHOT = int(os.environ.get("ONE_SHOT", "20"))


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


async def main():
    work = tempfile.mkdtemp()
    with open(os.path.join(work, "small.txt"), "w") as f:
        f.write("hello\n" * 20)
    port = free_port()
    p = subprocess.Popen([BOX, "serve", "--backend", BACKEND, "--listen", str(port), "--workspace", work,
                          "--state", "none"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(port, p)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        async with Client(url, mode="legacy") as legacy, Client(url, mode="2026-07-28") as modern:
            opened = await modern.session.send_request(OpenRequest(params=OpenParams(profile="default")), Opened)
            meta = {"box/session": {"id": opened.id, "secret": opened.secret}}
            calls = {
                "session": lambda: legacy.call_tool("read", {"path": "small.txt"}),
                "handle": lambda: modern.call_tool("read", {"path": "small.txt"}, meta=meta),
            }
            times = {label: [] for label in calls}
            for _ in range(20):
                for call in calls.values():
                    await call()
            for _ in range(N // 20):
                for label, call in calls.items():
                    for _ in range(20):
                        start = time.perf_counter()
                        await call()
                        times[label].append(time.perf_counter() - start)
        one_shot = []
        async with Client(url, mode="2026-07-28") as client:
            await client.list_tools()
            for _ in range(ONE_SHOT):
                start = time.perf_counter()
                result = await client.call_tool("read", {"path": "small.txt"})
                one_shot.append(time.perf_counter() - start)
                assert not result.is_error, result
        ms = lambda v: round(v * 1000, 2)
        summary = {
            "backend": BACKEND, "calls": N,
            "session_p50_ms": ms(statistics.median(times["session"])), "session_p10_ms": ms(pct(times["session"], 0.1)),
            "handle_p50_ms": ms(statistics.median(times["handle"])), "handle_p10_ms": ms(pct(times["handle"], 0.1)),
            "ratio_p50": round(statistics.median(times["handle"]) / statistics.median(times["session"]), 3),
            "ratio_p10": round(pct(times["handle"], 0.1) / pct(times["session"], 0.1), 3),
            "one_shot_p50_ms": ms(statistics.median(one_shot)), "one_shot_p10_ms": ms(pct(one_shot, 0.1)),
        }
        print(json.dumps(summary))
    finally:
        p.terminate()
        p.wait(timeout=60)


asyncio.run(main())
