"""End to end: two concurrent HTTP sessions of `box serve --listen` cannot see each other's files.

    isolation_http.py BOX --backend docker --profiles DIR --profile isolated

The profile must give every session a fresh, empty workspace (`source = "empty"`). Session A writes a
canary file; session B, open at the same time, must not find it by `read`, `ls` or `bash`. Prints one
JSON line; exits non-zero with the reason on any failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys

from mcp.client.client import Client

import serve_common
import serve_http


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("box")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--profiles", required=True)
    parser.add_argument("--profile", required=True)
    options = parser.parse_args()
    serve_common.ask_box(
        argparse.Namespace(max_read_bytes=None, profile=options.profile, tighten=None)
    )
    port = serve_http.free_port()
    process = subprocess.Popen(
        [options.box, "serve", "--backend", options.backend, "--profiles", options.profiles,
         "--listen", f"127.0.0.1:{port}"],
        env=dict(os.environ),
    )
    try:
        serve_http.wait_listening(port, process)
        url = f"http://127.0.0.1:{port}/mcp"
        async with Client(url, mode="legacy") as a, Client(url, mode="legacy") as b:
            wrote = await a.call_tool("write", {"path": "canary.txt", "content": "session A only"})
            if wrote.is_error:
                raise AssertionError(f"session A could not write: {serve_common.text_of(wrote)}")
            seen_a = await a.call_tool("read", {"path": "canary.txt"})
            if "session A only" not in serve_common.text_of(seen_a):
                raise AssertionError(f"session A cannot read its own file: {serve_common.text_of(seen_a)}")
            read_b = await b.call_tool("read", {"path": "canary.txt"})
            if not read_b.is_error:
                raise AssertionError(f"session B read session A's file: {serve_common.text_of(read_b)}")
            ls_b = serve_common.text_of(await b.call_tool("ls", {}))
            if "canary" in ls_b:
                raise AssertionError(f"session B lists session A's file: {ls_b}")
            bash_b = serve_common.text_of(
                await b.call_tool("bash", {"command": "find / -name canary.txt 2>/dev/null | head; echo done"})
            )
            if "canary.txt" in bash_b.replace("-name canary.txt", ""):
                raise AssertionError(f"session B's shell finds session A's file: {bash_b}")
        print(json.dumps({"isolated": True, "backend": options.backend}))
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
        if code != 0:
            raise AssertionError(f"box serve exited {code} after SIGTERM")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception as error:  # noqa: BLE001 - the script's whole job is to report it
        print(f"isolation_http.py: {type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(1)
