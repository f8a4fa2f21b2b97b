"""End to end: the Python `mcp` SDK (2.x) pinned to MCP 2026-07-28 opens and closes a box session
with box's tools, as a client that can only call tools does, and (on the fake backend, whose `ask`
tool elicits) answers a unit's request for input through the revision's "input required" retries.

    stateless_tools_sdk.py BOX --backend docker --transport stdio --workspace DIR
    stateless_tools_sdk.py BOX-TESTHOST --backend fake --transport http --workspace DIR

It lists the tools (box_session_open and box_session_close among them), calls box_session_open
(the handle {id, secret} in the structured content and the text), runs bash with the handle in
`_meta["box/session"]`, and calls box_session_close. With `--backend fake` it then calls `ask` with
a handle, and before that without one: the SDK gets `resultType: "input_required"` with the
elicitation, answers it through its elicitation callback, and retries with the request state; the
retry's answer is the call's result (over HTTP, a call without a handle keeps its session of its own
until then).
Over HTTP it then checks that no session is left (/metrics).

Prints one JSON line; exits non-zero with the reason on any failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import urllib.request
from typing import Any

import mcp.types as types
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

import serve_http

VERSION = "2026-07-28"


def text_of(result: types.CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, types.TextContent))


async def elicited(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    """The client's answer to the unit's elicitation, which the `ask` tool returns."""
    return types.ElicitResult(action="accept", content={"answer": "from the sdk"})


async def exercise(client: Client, options: argparse.Namespace) -> dict[str, Any]:
    if client.protocol_version != VERSION:
        raise AssertionError(f"the client speaks {client.protocol_version}, expected {VERSION}")
    listed = [tool.name for tool in (await client.list_tools()).tools]
    if "box_session_open" not in listed or "box_session_close" not in listed:
        raise AssertionError(f"box's session tools are not listed: {listed}")

    summary: dict[str, Any] = {}
    if options.backend == "fake":
        # Without a handle: over HTTP the call runs in a session of its own, kept while it
        # waits for the retry; over stdio in the process's one session.
        asked = await client.call_tool("ask", {})
        if asked.is_error or "from the sdk" not in text_of(asked):
            raise AssertionError(f"ask without a handle: expected the elicitation's answer, got {text_of(asked)!r}")
        summary["input_without_handle"] = text_of(asked)

    opened = await client.call_tool("box_session_open", {"profile": "default"})
    answer = opened.structured_content or {}
    if opened.is_error or not answer.get("id") or not answer.get("secret"):
        raise AssertionError(f"box_session_open: no handle in {opened!r}")
    if json.loads(text_of(opened)) != answer:
        raise AssertionError(f"box_session_open: the text is not the structured content: {text_of(opened)!r}")
    backends = {unit.get("backend") for unit in answer.get("units", [])}
    if backends != {options.backend}:
        raise AssertionError(f"box_session_open: units on {backends}, expected {options.backend}")
    meta = {"box/session": {"id": answer["id"], "secret": answer["secret"]}}

    if options.backend == "fake":
        # The fake executor's tools: echo answers its arguments.
        ran = await client.call_tool("echo", {"n": 1}, meta=meta)
        if ran.is_error or '"n":1' not in text_of(ran):
            raise AssertionError(f"echo with the tool's handle: got {text_of(ran)!r}")
    else:
        await client.call_tool("write", {"path": "tools.txt", "content": "kept\n"}, meta=meta)
        ran = await client.call_tool("bash", {"command": "cat tools.txt; echo hi"}, meta=meta)
        if ran.is_error or "kept" not in text_of(ran) or "hi" not in text_of(ran):
            raise AssertionError(f"bash with the tool's handle: expected the file and hi, got {text_of(ran)!r}")

    summary["session"] = answer["id"]
    if options.backend == "fake":
        # The unit elicits during the call: answered as input required, retried by the SDK.
        asked = await client.call_tool("ask", {}, meta=meta)
        if asked.is_error or "from the sdk" not in text_of(asked) or "accept" not in text_of(asked):
            raise AssertionError(f"ask: expected the elicitation's answer back, got {text_of(asked)!r}")
        summary["input"] = text_of(asked)

    closed = await client.call_tool("box_session_close", {}, meta=meta)
    if closed.is_error or (closed.structured_content or {}).get("closed") != answer["id"]:
        raise AssertionError(f"box_session_close: {closed!r}")
    return summary


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("box")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--transport", choices=["stdio", "http"], required=True)
    parser.add_argument("--workspace", required=True)
    options = parser.parse_args()
    serve = [options.box, "serve", "--backend", options.backend, "--workspace", options.workspace]
    if options.transport == "stdio":
        parameters = StdioServerParameters(command=serve[0], args=serve[1:], env=dict(os.environ))
        async with Client(parameters, mode=VERSION, elicitation_callback=elicited) as client:
            summary = await exercise(client, options)
        print(json.dumps({"transport": "stdio", **summary}))
        return
    port = serve_http.free_port()
    process = subprocess.Popen([*serve, "--listen", f"127.0.0.1:{port}"], stdin=subprocess.DEVNULL)
    try:
        serve_http.wait_listening(port, process)
        url = f"http://127.0.0.1:{port}/mcp"
        async with Client(url, mode=VERSION, elicitation_callback=elicited) as client:
            summary = await exercise(client, options)
        for _ in range(100):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                metrics = response.read().decode()
            if "box_sessions_active 0" in metrics:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"the closed session is still active:\n{metrics}")
        print(json.dumps({"transport": "http", **summary}))
    finally:
        process.terminate()
        process.wait(timeout=60)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception as error:  # noqa: BLE001 - the script's whole job is to report it
        print(f"stateless_tools_sdk.py: {type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(1)
