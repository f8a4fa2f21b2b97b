"""End to end: the Python `mcp` SDK (2.x, in the handshake era: mode "legacy", initialize; its "auto"
mode speaks 2026-07-28 to box, see stateless_sdk.py) drives `box serve` over stdio, then hangs up;
box must exit 0.

    serve_stdio.py BOX --backend docker --tool bash --args '{"command": "echo hi"}' --expect hi

Prints one JSON line summarising what it saw; exits non-zero with the reason on any failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

import serve_common


async def main() -> None:
    options = serve_common.arguments(__doc__ or "")
    serve_common.ask_box(options)
    args = ["serve", "--backend", options.backend]
    if options.workspace:
        args += ["--workspace", options.workspace]
    # The SDK hands the child a minimal environment; box's own variables (RUST_LOG, ...) pass on.
    parameters = StdioServerParameters(command=options.box, args=args, env=dict(os.environ))
    async with Client(parameters, mode="legacy") as client:
        summary = await serve_common.exercise(client, options)
    print(json.dumps({"transport": "stdio", **summary}))


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception as error:  # noqa: BLE001 - the script's whole job is to report it
        print(f"serve_stdio.py: {type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(1)
