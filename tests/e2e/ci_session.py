"""A CI job's MCP session through `box serve`: the Python `mcp` SDK (2.x) starts `box serve` over stdio,
checks the envelope, runs one command in the workspace unit with the bash tool, and exits with its status.
It stands in for an agent in the recipes of docs/deploy.md (run it through scripts/ci-session.sh).

    ci_session.py BOX [--profile ci] [--workspace DIR] [--envelope FILE] [--live] [--timeout S] -- COMMAND [ARG...]

Prints the command's output (the bash tool's result: its head, at most 50 KiB) on stdout, and one line
per unit (backend, image, hardening) on stderr. Exits with the command's status; 124 when the call timed
out or was canceled; 125 when box or the session failed (with the reason on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import sys
from typing import Any

import mcp.types as types
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

EXECUTOR_KEY = "io.github.christopherdavenport.dax/executor"
# How the bash tool ends its result (src/executor/bash.rs, `Run::render`).
ENDING = re.compile(r"\[(exit (?P<code>-?\d+)|killed after [^\]]+|canceled)\]\s*$")


class SessionError(Exception):
    """box or the session failed: not the command's own failure."""


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("box", help="the box binary")
    parser.add_argument("--profile", default="ci", help="the profile (box serve --profile); default ci")
    parser.add_argument("--profiles", action="append", default=[], help="more profile directories (repeatable)")
    parser.add_argument("--backend", default="auto", choices=["auto", "docker", "local"])
    parser.add_argument("--workspace", default=None, help="the checkout the unit works on; default the current directory")
    parser.add_argument("--timeout", type=int, default=1800, help="the command's timeout in seconds (default 1800)")
    parser.add_argument("--envelope", default=None, help="write the initialize answer's box envelope here (JSON)")
    parser.add_argument("--live", action="store_true", help="stream the command's output to stderr while it runs")
    argv = sys.argv[1:]
    if "--" not in argv:
        parser.error("no command: give it after --")
    split = argv.index("--")
    options = parser.parse_args(argv[:split])
    options.command = argv[split + 1 :]
    if not options.command:
        parser.error("no command: give it after --")
    return options


def envelope_of(client: Client) -> dict[str, Any]:
    result = client.session.initialize_result
    if result is None:
        raise SessionError("no initialize result")
    executor = (result.capabilities.experimental or {}).get(EXECUTOR_KEY) or {}
    box = executor.get("box")
    if not box or not box.get("units"):
        raise SessionError(f"the initialize answer has no box envelope: {executor!r}")
    return box


def describe(unit: dict[str, Any]) -> str:
    hardening = unit.get("hardening") or {}
    network = (unit.get("network") or {}).get("mode")
    return (
        f"ci-session: unit {unit.get('name')}: {unit.get('backend')} {unit.get('image') or ''} "
        f"user {unit.get('user')} network {network} seccomp {hardening.get('seccomp')} "
        f"landlock {hardening.get('landlockEnforced')} readOnlyRoot {hardening.get('readOnlyRoot')}"
    )


def status_of(text: str) -> int:
    match = ENDING.search(text)
    if match is None:
        raise SessionError(f"the bash tool's result does not say how the command ended: {text[-200:]!r}")
    return int(match.group("code")) if match.group("code") is not None else 124


async def session(options: argparse.Namespace) -> int:
    args = ["serve", "--profile", options.profile, "--backend", options.backend]
    for directory in options.profiles:
        args += ["--profiles", directory]
    if options.workspace:
        args += ["--workspace", options.workspace]
    parameters = StdioServerParameters(command=options.box, args=args, env=dict(os.environ))
    async with Client(parameters, mode="legacy") as client:
        box = envelope_of(client)
        if box.get("profile") != options.profile:
            raise SessionError(f"box served profile {box.get('profile')!r}, not {options.profile!r}")
        for unit in box["units"]:
            print(describe(unit), file=sys.stderr)
        if options.envelope:
            with open(options.envelope, "w", encoding="utf-8") as file:
                json.dump(box, file, indent=2)
        tools = [tool.name for tool in (await client.list_tools()).tools]
        if "bash" not in tools:
            raise SessionError(f"the workspace unit has no bash tool: {tools}")

        async def live(value: float, total: float | None, message: str | None) -> None:
            if message:
                sys.stderr.write(message)
                sys.stderr.flush()

        command = shlex.join(options.command)
        result = await client.call_tool(
            "bash",
            {"command": command, "timeout_seconds": options.timeout},
            progress_callback=live if options.live else None,
        )
        text = "".join(block.text for block in result.content if isinstance(block, types.TextContent))
        if result.is_error and ENDING.search(text) is None:
            raise SessionError(f"the bash tool failed: {text}")
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return status_of(text)


def leaves(error: BaseException) -> list[BaseException]:
    """The errors an exception group (the SDK's task groups) wraps, else the error itself."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


def main() -> None:
    options = arguments()
    try:
        code = asyncio.run(session(options))
    except Exception as error:  # noqa: BLE001 - the script's whole job is to report it
        for leaf in leaves(error):
            print(f"ci-session: {type(leaf).__name__}: {leaf}", file=sys.stderr)
        sys.exit(125)
    sys.exit(code if 0 <= code <= 255 else 1)


if __name__ == "__main__":
    main()
