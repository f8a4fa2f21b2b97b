"""Shared checks of the serve end-to-end scripts (the Python `mcp` SDK, 2.x, as a real client of `box serve`).

Every check raises with a message saying what was expected and what came back.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import mcp.types as types
from mcp.client.session import ClientSession

EXECUTOR_KEY = "io.github.christopherdavenport.dax/executor"


def arguments(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("box", help="the box binary")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--profile", default=None, help="the profile to ask for (box.profile)")
    parser.add_argument("--tighten", default=None, help="tightenings to ask for, JSON (box.tighten)")
    parser.add_argument("--max-read-bytes", type=int, default=None)
    parser.add_argument("--tool", required=True, help="a tool to call")
    parser.add_argument("--args", default="{}", help="its arguments, JSON")
    parser.add_argument("--expect", required=True, help="text its result must contain")
    parser.add_argument("--progress-tool", default=None, help="a tool that reports progress")
    parser.add_argument("--progress-args", default="{}")
    parser.add_argument("--workspace", default=None)
    return parser.parse_args()


def ask_box(options: argparse.Namespace) -> None:
    """Make every ClientSession ask box for the profile, tightenings and read limit.

    The SDK sends no experimental client capability of its own, so the ask is added where it builds them.
    """
    ask: dict[str, Any] = {}
    if options.max_read_bytes is not None:
        ask["maxReadBytes"] = options.max_read_bytes
    box: dict[str, Any] = {}
    if options.profile is not None:
        box["profile"] = options.profile
    if options.tighten is not None:
        box["tighten"] = json.loads(options.tighten)
    if box:
        ask["box"] = box
    if not ask:
        return
    original = ClientSession._build_capabilities

    def with_ask(self: ClientSession, version: str) -> types.ClientCapabilities:
        capabilities = original(self, version)
        capabilities.experimental = {EXECUTOR_KEY: ask}
        return capabilities

    ClientSession._build_capabilities = with_ask  # type: ignore[method-assign]


def check_initialize(session: ClientSession, options: argparse.Namespace) -> dict[str, Any]:
    result = session.initialize_result
    if result is None:
        raise AssertionError("no initialize result: the client did not fall back from server/discover to initialize")
    if result.server_info.name != "box":
        raise AssertionError(f"serverInfo.name: expected box, got {result.server_info.name!r}")
    experimental = result.capabilities.experimental or {}
    executor = experimental.get(EXECUTOR_KEY)
    if not executor:
        raise AssertionError(f"no {EXECUTOR_KEY} capability in {experimental!r}")
    box = executor.get("box") or {}
    units = box.get("units") or []
    if not units:
        raise AssertionError(f"capability box.units is empty: {executor!r}")
    for unit in units:
        if options.backend != "auto" and unit.get("backend") != options.backend:
            raise AssertionError(f"unit {unit.get('name')}: backend {unit.get('backend')!r}, expected {options.backend}")
    if options.profile is not None and box.get("profile") != options.profile:
        raise AssertionError(f"box.profile: expected {options.profile}, got {box.get('profile')!r}")
    if options.max_read_bytes is not None and executor.get("maxReadBytes") != options.max_read_bytes:
        raise AssertionError(f"maxReadBytes: asked {options.max_read_bytes}, got {executor.get('maxReadBytes')!r}")
    return executor


def text_of(result: types.CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, types.TextContent))


async def exercise(client: Any, options: argparse.Namespace) -> dict[str, Any]:
    """The checks every transport runs; returns a summary."""
    executor = check_initialize(client.session, options)
    tools = await client.list_tools()
    names = [tool.name for tool in tools.tools]
    if options.tool not in names:
        raise AssertionError(f"tool {options.tool} is not listed: {names}")
    result = await client.call_tool(options.tool, json.loads(options.args))
    text = text_of(result)
    if result.is_error or options.expect not in text:
        raise AssertionError(f"{options.tool}: expected {options.expect!r} in a successful result, got {text!r}")
    progress: list[float] = []
    if options.progress_tool:

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append(value)

        await client.call_tool(options.progress_tool, json.loads(options.progress_args), progress_callback=on_progress)
        if not progress:
            raise AssertionError(f"{options.progress_tool}: no progress notification reached the client")
    return {"units": [unit["name"] for unit in executor["box"]["units"]], "tools": names, "progress": len(progress)}
