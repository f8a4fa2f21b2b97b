"""End to end: a box session opened as a handle by the Python `mcp` SDK (2.x) pinned to MCP 2026-07-28
survives `kill -9` of its host.

    stateless_reattach_sdk.py BOX --backend docker --workspace DIR --state DIR

Starts `box serve --listen` with a session store (`--state`) and an instance id, opens a session with
box/session.open, writes a file in the workspace and one in the unit's /tmp with the handle, kills the
host with SIGKILL, starts the next host on the same state and instance, and carries on with the same
handle: the first request reattaches the session (its units, the file in /tmp); then it closes the
session, finds no session left (/metrics), and sends SIGTERM: box must exit 0.

Prints one JSON line; exits non-zero with the reason on any failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from typing import Any

import mcp.types as types
from mcp.client.client import Client

import serve_http
from stateless_sdk import CloseRequest, OpenParams, OpenRequest, Opened, VERSION, text_of


def host(options: argparse.Namespace, port: int) -> subprocess.Popen[bytes]:
    command = [
        options.box, "serve", "--backend", options.backend, "--workspace", options.workspace,
        "--state", options.state, "--instance", options.instance, "--listen", f"127.0.0.1:{port}",
    ]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    serve_http.wait_listening(port, process)
    return process


async def before(url: str) -> dict[str, Any]:
    async with Client(url, mode=VERSION) as client:
        opened = await client.session.send_request(OpenRequest(params=OpenParams(profile="default")), Opened)
        meta = {"box/session": {"id": opened.id, "secret": opened.secret}}
        await client.call_tool("write", {"path": "before.txt", "content": "written before the kill\n"}, meta=meta)
        result = await client.call_tool("bash", {"command": "echo in-tmp > /tmp/kept && echo stored"}, meta=meta)
        if result.is_error or "stored" not in text_of(result):
            raise AssertionError(f"bash before the kill: {text_of(result)!r}")
        return {"id": opened.id, "secret": opened.secret, "units": [unit["id"] for unit in opened.units]}


async def after(url: str, handle: dict[str, Any]) -> str:
    meta = {"box/session": {"id": handle["id"], "secret": handle["secret"]}}
    async with Client(url, mode=VERSION) as client:
        result = await client.call_tool("bash", {"command": "cat /tmp/kept before.txt"}, meta=meta)
        text = text_of(result)
        if result.is_error or "in-tmp" not in text or "written before the kill" not in text:
            raise AssertionError(f"after the kill, the handle's unit reads {text!r}")
        await client.session.send_request(CloseRequest(params=types.RequestParams(_meta=meta)), types.EmptyResult)
        return text


def metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("box")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--state", required=True)
    parser.add_argument("--instance", default=f"sdk-reattach-{os.getpid()}")
    options = parser.parse_args()
    first_port = serve_http.free_port()
    first = host(options, first_port)
    second = None
    try:
        handle = await before(f"http://127.0.0.1:{first_port}/mcp")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        second_port = serve_http.free_port()
        second = host(options, second_port)
        text = await after(f"http://127.0.0.1:{second_port}/mcp", handle)
        for _ in range(100):
            if "box_sessions_active 0" in metrics(second_port):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"the closed session is still active:\n{metrics(second_port)}")
        second.send_signal(signal.SIGTERM)
        code = second.wait(timeout=60)
        if code != 0:
            raise AssertionError(f"the next box serve exited {code} after SIGTERM, expected 0")
        print(json.dumps({"session": handle["id"], "units": handle["units"], "read": text.split()}))
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception as error:  # noqa: BLE001 - the script's whole job is to report it
        print(f"stateless_reattach_sdk.py: {type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(1)
