"""End to end: the Python `mcp` SDK (2.x), unmodified, asks box for a profile and a tightening without
box's experimental capability (the SDK cannot send one): over streamable HTTP through the `Box-*`
headers and through the `/mcp/p/{profile}` path, and over stdio through `box serve --profile --tighten`.
Each time it checks what the host says it applied (the initialize result's executor capability: the
profile, the units' envelopes, the read limit), then calls a tool.

    serve_asks.py BOX --backend fake
    serve_asks.py BOX --backend docker --workspace DIR --tool bash --args '{"command": "echo CI=$CI"}' --expect CI=true

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
from typing import Any

import httpx2
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

import serve_common
from serve_http import free_port, wait_listening

# A tightening whose effect every backend reports: the session's start deadline, in each envelope.
TIGHTEN = {"limits": {"start_timeout": "45s"}}
MAX_READ_BYTES = 4096


def applied(client: Client, *, max_read_bytes: int | None) -> dict[str, Any]:
    """What the host says it applied; raises unless it is profile `ci` narrowed by TIGHTEN."""
    result = client.session.initialize_result
    if result is None:
        raise AssertionError("no initialize result")
    executor = (result.capabilities.experimental or {}).get(serve_common.EXECUTOR_KEY) or {}
    box = executor.get("box") or {}
    if box.get("profile") != "ci":
        raise AssertionError(f"box.profile: expected ci, got {box.get('profile')!r} in {executor!r}")
    units = box.get("units") or []
    if not units:
        raise AssertionError(f"no units in {executor!r}")
    for unit in units:
        deadline = (unit.get("limits") or {}).get("startTimeoutMs")
        if deadline != 45_000:
            raise AssertionError(f"unit {unit.get('name')}: startTimeoutMs {deadline!r}, expected 45000 (the tightening)")
    if max_read_bytes is not None and executor.get("maxReadBytes") != max_read_bytes:
        raise AssertionError(f"maxReadBytes: asked {max_read_bytes}, got {executor.get('maxReadBytes')!r}")
    return {"profile": box["profile"], "units": [unit["name"] for unit in units]}


async def use(client: Client, options: argparse.Namespace) -> None:
    result = await client.call_tool(options.tool, json.loads(options.args))
    text = serve_common.text_of(result)
    if result.is_error or options.expect not in text:
        raise AssertionError(f"{options.tool}: expected {options.expect!r} in a successful result, got {text!r}")


def serve_args(options: argparse.Namespace) -> list[str]:
    args = ["serve", "--backend", options.backend]
    if options.workspace:
        args += ["--workspace", options.workspace]
    return args


async def over_http(options: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    process = subprocess.Popen(
        [options.box, *serve_args(options), "--listen", f"127.0.0.1:{port}"],
        stdin=subprocess.DEVNULL,
    )
    seen: dict[str, Any] = {}
    try:
        wait_listening(port, process)
        base = f"http://127.0.0.1:{port}"
        tighten = json.dumps(TIGHTEN)
        cases = {
            "headers": (
                f"{base}/mcp",
                {"Box-Profile": "ci", "Box-Tighten": tighten, "Box-Max-Read-Bytes": str(MAX_READ_BYTES)},
                MAX_READ_BYTES,
            ),
            "path": (f"{base}/mcp/p/ci", {"Box-Tighten": tighten}, None),
        }
        for name, (url, headers, max_read_bytes) in cases.items():
            # The SDK's documented way to send headers: an HTTP client of one's own.
            http_client = httpx2.AsyncClient(headers=headers, timeout=30)
            async with http_client, Client(streamable_http_client(url, http_client=http_client), mode="legacy") as client:
                seen[name] = applied(client, max_read_bytes=max_read_bytes)
                await use(client, options)
        # A disagreement is refused at initialize, naming both places.
        http_client = httpx2.AsyncClient(headers={"Box-Profile": "default"}, timeout=30)
        try:
            async with http_client, Client(streamable_http_client(f"{base}/mcp/p/ci", http_client=http_client), mode="legacy"):
                raise AssertionError("a path and a Box-Profile that disagree were accepted")
        except Exception as error:  # noqa: BLE001 - the refusal is what is checked
            if "Box-Profile header asks for `default`" not in describe(error):
                raise AssertionError(f"the refusal does not name both places: {describe(error)}") from error
        process.send_signal(signal.SIGTERM)
        if process.wait(timeout=60) != 0:
            raise AssertionError(f"box serve exited {process.returncode} after SIGTERM, expected 0")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return seen


def describe(error: BaseException) -> str:
    """An error and everything it groups or wraps, as one string."""
    parts = [f"{type(error).__name__}: {error}"]
    for inner in getattr(error, "exceptions", ()) or ():
        parts.append(describe(inner))
    if error.__cause__ is not None:
        parts.append(describe(error.__cause__))
    return " | ".join(parts)


async def over_stdio(options: argparse.Namespace) -> dict[str, Any]:
    args = [*serve_args(options), "--profile", "ci", "--tighten", json.dumps(TIGHTEN)]
    # The SDK hands the child a minimal environment; box's own variables (RUST_LOG, ...) pass on.
    parameters = StdioServerParameters(command=options.box, args=args, env=dict(os.environ))
    async with Client(parameters, mode="legacy") as client:
        seen = applied(client, max_read_bytes=None)
        await use(client, options)
    return seen


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("box", help="the box binary")
    parser.add_argument("--backend", default="fake")
    parser.add_argument("--workspace", default=None)
    parser.add_argument("--tool", default="echo", help="a tool to call in each session")
    parser.add_argument("--args", default='{"a": 1}', help="its arguments, JSON")
    parser.add_argument("--expect", default='{"a":1}', help="text its result must contain")
    options = parser.parse_args()
    http = await over_http(options)
    stdio = await over_stdio(options)
    print(json.dumps({"http": http, "stdio": stdio}))


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception as error:  # noqa: BLE001 - the script's whole job is to report it
        print(f"serve_asks.py: {describe(error)}", file=sys.stderr)
        sys.exit(1)
