"""End to end: `box serve --listen 127.0.0.1:PORT` driven by the Python `mcp` SDK (2.x) over streamable HTTP.

Starts box itself, runs two clients at once (two sessions, each with its own units; in the handshake
era, mode "legacy": "auto" speaks 2026-07-28 to box, see stateless_sdk.py), checks /metrics, then
sends SIGTERM: box must remove every unit and exit 0.

    serve_http.py BOX --backend docker --tool bash --args '{"command": "echo hi"}' --expect hi

Prints one JSON line; exits non-zero with the reason on any failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from mcp.client.client import Client

import serve_common


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"box serve exited early with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("box serve did not listen within 30 s")


async def main() -> None:
    options = serve_common.arguments(__doc__ or "")
    serve_common.ask_box(options)
    port = free_port()
    args = [options.box, "serve", "--backend", options.backend, "--listen", f"127.0.0.1:{port}"]
    if options.workspace:
        args += ["--workspace", options.workspace]
    process = subprocess.Popen(args, stdin=subprocess.DEVNULL)
    try:
        wait_listening(port, process)
        url = f"http://127.0.0.1:{port}/mcp"

        async def one() -> dict:
            async with Client(url, mode="legacy") as client:
                return await serve_common.exercise(client, options)

        first, second = await asyncio.gather(one(), one())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            metrics = response.read().decode()
        if "box_sessions_started_total 2" not in metrics:
            raise AssertionError(f"/metrics does not count two sessions:\n{metrics}")
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
        if code != 0:
            raise AssertionError(f"box serve exited {code} after SIGTERM, expected 0")
        print(json.dumps({"transport": "http", "sessions": [first, second]}))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception as error:  # noqa: BLE001 - the script's whole job is to report it
        print(f"serve_http.py: {type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(1)
