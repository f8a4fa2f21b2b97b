"""End to end: the Python `mcp` SDK (2.x) pinned to MCP 2026-07-28 (stateless: no initialize) drives `box serve`.

    stateless_sdk.py BOX --backend docker --transport stdio --workspace DIR
    stateless_sdk.py BOX --backend local --transport http --workspace DIR

It discovers box (server/discover: the executor capability under box's key in the revision's
extensions, the profiles), opens a box session as a handle (box/session.open, sent with the SDK's
raw request API: the SDK has no method of box's), lists the tools and runs bash with the handle in
`_meta["box/session"]`, forks the workspace and merges the fork back through it, checks that a
wrong secret is refused, and closes the session
(box/session.close). The SDK's default mode ("auto") then finds 2026-07-28 served and calls without a
handle: over stdio in the process's session, over HTTP in a unit removed after the call, while a
handshake-era client (mode "legacy") works on the same endpoint at once. Over HTTP it then checks
that no session is left (/metrics) and that box exits 0 on SIGTERM.

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
from typing import Any, Literal

import mcp.types as types
from pydantic import TypeAdapter
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

import serve_http

EXECUTOR_KEY = "io.github.christopherdavenport.dax/executor"
VERSION = "2026-07-28"


class OpenParams(types.RequestParams):
    profile: str | None = None


class OpenRequest(types.Request[OpenParams, Literal["box/session.open"]]):
    method: Literal["box/session.open"] = "box/session.open"
    params: OpenParams


class CloseRequest(types.Request[types.RequestParams, Literal["box/session.close"]]):
    method: Literal["box/session.close"] = "box/session.close"
    params: types.RequestParams


BoxRequest = types.Request[dict[str, Any], str]
ANSWER = TypeAdapter(dict[str, Any])


class Opened(types.Result):
    """box/session.open's answer: the handle, the units' envelopes, the executor's capability."""

    id: str
    secret: str
    profile: str
    units: list[dict[str, Any]]
    executor: dict[str, Any]


def text_of(result: types.CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, types.TextContent))


async def exercise(client: Client, options: argparse.Namespace) -> dict[str, Any]:
    if client.protocol_version != VERSION:
        raise AssertionError(f"the client speaks {client.protocol_version}, expected {VERSION}")
    # A pinned client adopted a discover result of its own making; ask box for its own.
    discovered = types.DiscoverResult.model_validate(await client.session.send_discover(VERSION))
    if VERSION not in discovered.supported_versions:
        raise AssertionError(f"server/discover lists {discovered.supported_versions}, without {VERSION}")
    extensions = discovered.capabilities.extensions or {}
    box = (extensions.get(EXECUTOR_KEY) or {}).get("box") or {}
    if "default" not in box.get("profiles", []) or box.get("session", {}).get("open") != "box/session.open":
        raise AssertionError(f"server/discover: no box profiles or way to open a session in {extensions!r}")

    opened = await client.session.send_request(OpenRequest(params=OpenParams(profile="default")), Opened)
    handle = {"id": opened.id, "secret": opened.secret}
    backends = {unit.get("backend") for unit in opened.units}
    if backends != {options.backend}:
        raise AssertionError(f"box/session.open: units on {backends}, expected {options.backend}")
    if not opened.executor.get("tools"):
        raise AssertionError(f"box/session.open: no executor capability: {opened.executor!r}")

    meta = {"box/session": handle}
    tools = await client.list_tools(meta=meta)
    names = [tool.name for tool in tools.tools]
    if "bash" not in names:
        raise AssertionError(f"bash is not listed: {names}")
    await client.call_tool("write", {"path": "stateless.txt", "content": "kept\n"}, meta=meta)
    result = await client.call_tool("bash", {"command": "cat stateless.txt; echo hi"}, meta=meta)
    text = text_of(result)
    if result.is_error or "kept" not in text or "hi" not in text:
        raise AssertionError(f"bash: expected the file the session wrote and hi, got {text!r}")

    # Forks and merges through the handle, as a session-era client does them.
    fork = await client.session.send_request(BoxRequest(method="box/fork", params={"mode": "copy", "_meta": meta}), ANSWER)
    in_fork = {**meta, "box/unit": fork["unit"]}
    await client.call_tool("write", {"path": "forked.txt", "content": "from the fork\n"}, meta=in_fork)
    await client.session.send_request(BoxRequest(method="box/merge", params={"unit": fork["unit"], "_meta": meta}), ANSWER)
    merged = await client.call_tool("read", {"path": "forked.txt"}, meta=meta)
    if merged.is_error or "from the fork" not in text_of(merged):
        raise AssertionError(f"box/merge through the handle: the workspace reads {text_of(merged)!r}")

    wrong = {"box/session": {"id": opened.id, "secret": "0" * 32}}
    try:
        await client.call_tool("bash", {"command": "echo no"}, meta=wrong)
    except MCPError as error:
        if "secret" not in str(error):
            raise AssertionError(f"a wrong secret: refused, but not for its secret: {error}") from error
    else:
        raise AssertionError("a wrong secret was not refused")

    await client.session.send_request(CloseRequest(params=types.RequestParams(_meta=meta)), types.EmptyResult)
    return {"session": opened.id, "units": [unit["name"] for unit in opened.units], "tools": len(names)}


async def without_handle(client: Client, what: str) -> str:
    """The SDK in its default mode ("auto"): it discovers box, speaks 2026-07-28, and calls without a handle."""
    if client.protocol_version != VERSION:
        raise AssertionError(f"mode auto: the client speaks {client.protocol_version}, expected {VERSION}")
    result = await client.call_tool("bash", {"command": f"echo {what}"})
    if result.is_error or what not in text_of(result):
        raise AssertionError(f"bash without a handle: expected {what!r}, got {text_of(result)!r}")
    return client.protocol_version


async def handshake_era(url: str) -> str:
    """A handshake-era client (initialize, Mcp-Session-Id) on the same endpoint at the same time."""
    async with Client(url, mode="legacy") as client:
        result = await client.call_tool("bash", {"command": "echo legacy"})
        if result.is_error or "legacy" not in text_of(result):
            raise AssertionError(f"the handshake-era client: expected legacy, got {text_of(result)!r}")
        return client.protocol_version


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("box")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--transport", choices=["stdio", "http"], required=True)
    parser.add_argument("--workspace", required=True)
    options = parser.parse_args()
    serve = [options.box, "serve", "--backend", options.backend, "--workspace", options.workspace]
    if options.transport == "stdio":
        # The SDK hands the child a minimal environment; box's own variables (RUST_LOG, ...) pass on.
        parameters = StdioServerParameters(command=serve[0], args=serve[1:], env=dict(os.environ))
        async with Client(parameters, mode=VERSION) as client:
            summary = await exercise(client, options)
        # Over stdio a call without a handle is the process's session's.
        async with Client(parameters) as client:
            auto = await without_handle(client, "auto")
        print(json.dumps({"transport": "stdio", "auto": auto, **summary}))
        return
    port = serve_http.free_port()
    process = subprocess.Popen([*serve, "--listen", f"127.0.0.1:{port}"], stdin=subprocess.DEVNULL)
    try:
        serve_http.wait_listening(port, process)
        url = f"http://127.0.0.1:{port}/mcp"

        async def pinned() -> dict[str, Any]:
            async with Client(url, mode=VERSION) as client:
                return await exercise(client, options)

        async def auto() -> str:
            # Over HTTP a call without a handle runs in a unit removed after it.
            async with Client(url) as client:
                return await without_handle(client, "one-shot")

        summary, legacy, auto_version = await asyncio.gather(pinned(), handshake_era(url), auto())
        summary = {**summary, "legacy": legacy, "auto": auto_version}
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            metrics = response.read().decode()
        # The close ends the session: its units are removed, none is left running.
        for _ in range(100):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                metrics = response.read().decode()
            if "box_sessions_active 0" in metrics:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"the closed session is still active:\n{metrics}")
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
        if code != 0:
            raise AssertionError(f"box serve exited {code} after SIGTERM, expected 0")
        print(json.dumps({"transport": "http", **summary}))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception as error:  # noqa: BLE001 - the script's whole job is to report it
        print(f"stateless_sdk.py: {type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(1)
