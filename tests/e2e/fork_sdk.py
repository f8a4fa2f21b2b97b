"""End to end: the Python `mcp` SDK (2.x), unmodified, drives box's fork wire through `box serve`,
over stdio or streamable HTTP: `box/fork` (a request of box's own, sent as the SDK's generic
`types.Request`), a tool call in the child (`_meta["box/unit"]`, the SDK's `meta=`), the parent
and the host directory unchanged, `box/merge` of the child into the parent's host directory,
`box/discard`.

    fork_sdk.py BOX --backend docker --workspace DIR --transport stdio|http

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
from pathlib import Path
from typing import Any

import mcp.types as types
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters
from pydantic import TypeAdapter

from serve_common import text_of
from serve_http import free_port, wait_listening

# Any request box answers beyond MCP's own: a method name and open params.
BoxRequest = types.Request[dict[str, Any], str]
ANSWER = TypeAdapter(dict[str, Any])


async def box(client: Client, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return await client.session.send_request(BoxRequest(method=method, params=params), ANSWER)


async def bash(client: Client, command: str, unit: str | None = None) -> str:
    meta = {"box/unit": unit} if unit else None
    result = await client.call_tool("bash", {"command": command}, meta=meta)
    text = text_of(result)
    if result.is_error:
        raise AssertionError(f"bash {command!r} in {unit or 'workspace'}: {text}")
    return text


async def drive(client: Client, workspace: Path) -> dict[str, Any]:
    forked = await box(client, "box/fork", {"mode": "copy", "label": "sdk"})
    unit = forked["unit"]
    if forked["envelope"].get("parent") != "workspace":
        raise AssertionError(f"the child's envelope does not name its parent: {forked}")
    await bash(client, "echo from-child > child.txt && rm gone.txt", unit)
    seen = await bash(client, "ls", None)
    if "child.txt" in seen or "gone.txt" not in seen:
        raise AssertionError(f"the parent sees the child's changes: {seen!r}")
    if (workspace / "child.txt").exists():
        raise AssertionError("the child wrote into the host directory")
    merged = await box(client, "box/merge", {"unit": unit})
    if merged.get("merged") != ["child.txt"] or merged.get("deleted") != ["gone.txt"]:
        raise AssertionError(f"merge answer: {merged}")
    if (workspace / "child.txt").read_text() != "from-child\n" or (workspace / "gone.txt").exists():
        raise AssertionError("the merge did not land in the host directory")
    discarded = await box(client, "box/discard", {"unit": unit})
    if discarded.get("discarded") is not True:
        raise AssertionError(f"discard answer: {discarded}")
    return {"unit": unit, "merged": merged["merged"], "deleted": merged["deleted"]}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("box")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--transport", choices=["stdio", "http"], required=True)
    options = parser.parse_args()
    workspace = Path(options.workspace)
    (workspace / "gone.txt").write_text("deleted by the child\n")
    args = ["serve", "--backend", options.backend, "--workspace", options.workspace]
    if options.transport == "stdio":
        parameters = StdioServerParameters(command=options.box, args=args, env=dict(os.environ))
        async with Client(parameters, mode="legacy") as client:
            summary = await drive(client, workspace)
    else:
        port = free_port()
        process = subprocess.Popen([options.box, *args, "--listen", f"127.0.0.1:{port}"], stdin=subprocess.DEVNULL)
        try:
            wait_listening(port, process)
            async with Client(f"http://127.0.0.1:{port}/mcp", mode="legacy") as client:
                summary = await drive(client, workspace)
            process.send_signal(signal.SIGTERM)
            if (code := process.wait(timeout=60)) != 0:
                raise AssertionError(f"box serve exited {code} after SIGTERM, expected 0")
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    print(json.dumps({"transport": options.transport, "backend": options.backend, **summary}))


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception as error:  # noqa: BLE001 - the script's whole job is to report it
        print(f"fork_sdk.py: {type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(1)
