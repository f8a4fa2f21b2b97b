"""End to end: the spans of a unit's life beyond its start, received as OTLP/HTTP protobuf.

    tracing_units_sdk.py BOX --backend local --workspace DIR --state DIR

Starts the OTLP receiver of tracing_sdk.py and `box serve --listen --pool traced=1 --state DIR
--otlp-endpoint URL` with a profile whose secret a command echoes. The Python `mcp` SDK,
unmodified, pinned to MCP 2026-07-28, sends each request with a W3C `traceparent` in `_meta`:
`box/session.open` (its trace holds `unit.claim workspace`, `box.pool.warm` true, under the
unit's start under the request span), `box/fork` and `box/merge` (`unit.fork CHILD` and
`unit.merge` under their request spans, in the client's traces), `agentworkspace/process.start`
(the executor's `process.start` span, sent home in a batch, under the request span, with no
argument). Then it kills the host with SIGKILL, starts the next host on the same state, and the
first call carrying the handle has `session.reattach` under its own request span, before the
executor's span of the call, and no span of a `box/session.open` made up for it. Then it kills
that host too, and on the third the first request carrying the handle is refused after the
reattach it caused (a call for a unit the session lacks, -32602): `session.reattach` is under the
refused call's span, which ends with its error, and the next call's trace has none.
No byte box exported holds the secret's value, raw or in base64.

Prints one JSON line; exits non-zero with the reason on any failure.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import http.server
import json
import os
import secrets as random
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.request
from typing import Any

import mcp.types as types
from mcp.client.client import Client
from mcp.shared.exceptions import MCPError
from opentelemetry.proto.trace.v1 import trace_pb2

import serve_http
from stateless_sdk import ANSWER, BoxRequest, CloseRequest, OpenParams, OpenRequest, Opened, VERSION, text_of
from tracing_sdk import SECRET_NAME, SECRET_VALUE, Receiver, attributes, wait_for


def traceparent() -> tuple[str, str, dict[str, str]]:
    trace_id, parent_id = random.token_hex(16), random.token_hex(8)
    return trace_id, parent_id, {"traceparent": f"00-{trace_id}-{parent_id}-01"}


def request_span(spans: list[trace_pb2.Span], name: str, parent_id: str) -> trace_pb2.Span:
    """The request's span: a server span under the client's."""
    found = [span for span in spans if span.name == name]
    if len(found) != 1:
        raise AssertionError(f"expected one {name!r} span, got {len(found)}: {sorted(s.name for s in spans)}")
    span = found[0]
    if span.kind != trace_pb2.Span.SPAN_KIND_SERVER or span.parent_span_id.hex() != parent_id:
        raise AssertionError(f"{name}: kind {span.kind}, parent {span.parent_span_id.hex()}, expected SERVER under {parent_id}")
    return span


def child_of(spans: list[trace_pb2.Span], name: str, parent: trace_pb2.Span) -> trace_pb2.Span:
    """`name`'s one span, a child of `parent` and within it: the request's answer waits for it."""
    found = [span for span in spans if span.name == name]
    if len(found) != 1:
        raise AssertionError(f"expected one {name!r} span, got {len(found)}: {sorted(s.name for s in spans)}")
    span = found[0]
    if span.parent_span_id != parent.span_id:
        tree = [(s.name, s.span_id.hex(), s.parent_span_id.hex()) for s in spans]
        raise AssertionError(f"{name} is not a child of {parent.name} ({parent.span_id.hex()}): {tree}")
    if not parent.start_time_unix_nano <= span.start_time_unix_nano <= span.end_time_unix_nano <= parent.end_time_unix_nano:
        raise AssertionError(f"{name} is not within {parent.name}")
    if span.status.code == trace_pb2.Status.STATUS_CODE_ERROR or "error.type" in attributes(span):
        raise AssertionError(f"{name} failed: {span.status} {attributes(span)}")
    return span


def host(options: argparse.Namespace, port: int, profiles: str, endpoint: str, pool: bool) -> subprocess.Popen[bytes]:
    command = [
        options.box, "serve", "--backend", options.backend, "--workspace", options.workspace,
        "--profiles", profiles, "--profile", "traced", "--state", options.state,
        "--instance", options.instance, "--listen", f"127.0.0.1:{port}", "--otlp-endpoint", endpoint,
    ]
    if pool:
        command += ["--pool", "traced=1"]
    env = {**os.environ, "OTEL_BSP_SCHEDULE_DELAY": "100", SECRET_NAME: SECRET_VALUE}
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, env=env)
    serve_http.wait_listening(port, process)
    return process


async def request(client: Client, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return await client.session.send_request(BoxRequest(method=method, params=params), ANSWER)


async def bash(client: Client, command: str, meta: dict[str, Any]) -> str:
    result = await client.call_tool("bash", {"command": command}, meta=meta)
    text = text_of(result)
    if result.is_error or SECRET_VALUE in text:
        raise AssertionError(f"bash {command!r}: {text!r}")
    return text


async def warm_open(url: str, port: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A session on the pool's warm unit, forked and merged, each request in its own trace."""
    summary: dict[str, Any] = {}
    # The pool's unit is warm once the host says so.
    for _ in range(600):
        if 'box_pool_ready{profile="traced"} 1' in metrics(port):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(f"the pool's unit was not ready within 60 s:\n{metrics(port)}")
    async with Client(url, mode=VERSION) as client:
        trace_id, parent_id, meta = traceparent()
        opened = await client.session.send_request(OpenRequest(params=OpenParams(profile="traced", _meta=meta)), Opened)
        handle = {"box/session": {"id": opened.id, "secret": opened.secret}}
        spans = wait_for(bytes.fromhex(trace_id), {"box/session.open", "unit.start workspace", "unit.claim workspace"})
        # The claim is a step of the unit's start, as a cold start's steps are.
        start = child_of(spans, "unit.start workspace", request_span(spans, "box/session.open", parent_id))
        claim = child_of(spans, "unit.claim workspace", start)
        for span in (start, claim):
            if attributes(span).get("box.pool.warm") is not True:
                raise AssertionError(f"{span.name}: box.pool.warm is not true: {attributes(span)}")
        summary["open"] = sorted(span.name for span in spans)

        await bash(client, f"echo token=${SECRET_NAME}; echo base > base.txt", handle)
        trace_id, parent_id, meta = traceparent()
        forked = await request(client, "box/fork", {"mode": "copy", "_meta": {**handle, **meta}})
        unit = forked["unit"]
        spans = wait_for(bytes.fromhex(trace_id), {"box/fork", f"unit.fork {unit}", f"unit.start {unit}"})
        fork = child_of(spans, f"unit.fork {unit}", request_span(spans, "box/fork", parent_id))
        wanted = {"box.unit.name": unit, "box.fork.from": "workspace"}
        if any(attributes(fork).get(key) != value for key, value in wanted.items()):
            raise AssertionError(f"unit.fork: attributes {attributes(fork)}, expected {wanted}")
        # The child's start is the fork's.
        child_of(spans, f"unit.start {unit}", fork)
        summary["fork"] = sorted(span.name for span in spans)

        await bash(client, "echo from-child > child.txt", {**handle, "box/unit": unit})
        trace_id, parent_id, meta = traceparent()
        merged = await request(client, "box/merge", {"unit": unit, "_meta": {**handle, **meta}})
        if "child.txt" not in merged.get("merged", []):
            raise AssertionError(f"box/merge: {merged}")
        spans = wait_for(bytes.fromhex(trace_id), {"box/merge", "unit.merge"})
        merge = child_of(spans, "unit.merge", request_span(spans, "box/merge", parent_id))
        if attributes(merge).get("box.unit.name") != unit:
            raise AssertionError(f"unit.merge: attributes {attributes(merge)}")
        summary["merge"] = sorted(span.name for span in spans)
        summary["process"] = await process_start(client, handle)
    return handle, summary


async def process_start(client: Client, handle: dict[str, Any]) -> list[str]:
    """`agentworkspace/process.start`: the executor's `process.start` span (sent home in a batch) under
    the request's span, naming no argument."""
    trace_id, parent_id, meta = traceparent()
    started = await request(client, "agentworkspace/process.start", {
        "args": ["sh", "-c", f"echo ${SECRET_NAME}; sleep 30"], "_meta": {**handle, **meta},
    })
    spans = wait_for(bytes.fromhex(trace_id), {"agentworkspace/process.start", "process.start"})
    executor = child_of(spans, "process.start", request_span(spans, "agentworkspace/process.start", parent_id))
    recorded = attributes(executor)
    if recorded != {"mcp.method.name": "agentworkspace/process.start"}:
        raise AssertionError(f"process.start: attributes {recorded}, expected the method's name only")
    await request(client, "agentworkspace/process.close", {"id": started["id"], "_meta": handle})
    return sorted(span.name for span in spans)


async def reattach(url: str, handle: dict[str, Any]) -> list[str]:
    """The first call carrying the handle on the next host reattaches the session, in its trace."""
    async with Client(url, mode=VERSION) as client:
        trace_id, parent_id, meta = traceparent()
        text = await bash(client, "cat base.txt child.txt", {**handle, **meta})
        if "base" not in text or "from-child" not in text:
            raise AssertionError(f"after the kill, the handle's unit reads {text!r}")
        spans = wait_for(bytes.fromhex(trace_id), {"tools/call bash", "session.reattach", "execute_tool bash"})
        # The reattach is a step of the call: under the call's own request span, with the call's
        # attributes; no `box/session.open` is made up for it.
        call = request_span(spans, "tools/call bash", parent_id)
        reattached = child_of(spans, "session.reattach", call)
        executor = child_of(spans, "execute_tool bash", call)
        if reattached.end_time_unix_nano > executor.start_time_unix_nano:
            raise AssertionError("the call ran in its unit before the session was reattached")
        wanted = {"mcp.method.name": "tools/call", "gen_ai.tool.name": "bash"}
        if any(attributes(call).get(key) != value for key, value in wanted.items()) \
                or attributes(call).get("jsonrpc.request.id") == "box-reattach":
            raise AssertionError(f"the call's span: attributes {attributes(call)}, expected {wanted}")
        if any(span.name == "box/session.open" for span in spans):
            raise AssertionError(f"the transport's own open has a span: {sorted(s.name for s in spans)}")
        return sorted(span.name for span in spans)


async def refused_reattach(url: str, handle: dict[str, Any]) -> list[str]:
    """The first request carrying the handle on the next host reattaches the session and is then
    refused: the reattach is under the refused request's span, never under the next request's."""
    async with Client(url, mode=VERSION) as client:
        trace_id, parent_id, meta = traceparent()
        try:
            await client.call_tool("bash", {"command": "echo no"}, meta={**handle, **meta, "box/unit": "nowhere"})
        except MCPError as error:
            if "nowhere" not in str(error):
                raise AssertionError(f"a call for no unit: refused, but not for its unit: {error}") from error
        else:
            raise AssertionError("a call for a unit the session lacks was not refused")
        spans = wait_for(bytes.fromhex(trace_id), {"tools/call bash", "session.reattach"})
        refused = request_span(spans, "tools/call bash", parent_id)
        child_of(spans, "session.reattach", refused)
        if attributes(refused).get("error.type") != "-32602":
            raise AssertionError(f"the refused call's span: attributes {attributes(refused)}, expected error.type -32602")
        # The session is reattached: the next call runs in it, in a trace of its own without the reattach.
        next_trace, next_parent, next_meta = traceparent()
        text = await bash(client, "cat base.txt", {**handle, **next_meta})
        if "base" not in text:
            raise AssertionError(f"after the refused reattach, the handle's unit reads {text!r}")
        following = wait_for(bytes.fromhex(next_trace), {"tools/call bash", "execute_tool bash"})
        call = request_span(following, "tools/call bash", next_parent)
        child_of(following, "execute_tool bash", call)
        if any(span.name == "session.reattach" for span in following):
            raise AssertionError(f"the reattach's span moved: {sorted(s.name for s in following)}")
        await client.session.send_request(CloseRequest(params=types.RequestParams(_meta=handle)), types.EmptyResult)
        return sorted(span.name for span in spans)


def metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("box")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--state", required=True)
    parser.add_argument("--instance", default=f"sdk-traced-units-{os.getpid()}")
    options = parser.parse_args()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    profiles = tempfile.mkdtemp()
    with open(os.path.join(profiles, "traced.toml"), "w") as profile:
        profile.write(f'extends = "default"\n[env]\nsecrets = [{{name = "{SECRET_NAME}", as_env = true}}]\n')
    first_port = serve_http.free_port()
    first = host(options, first_port, profiles, endpoint, pool=True)
    second = third = None
    try:
        handle, summary = await warm_open(f"http://127.0.0.1:{first_port}/mcp", first_port)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        second_port = serve_http.free_port()
        second = host(options, second_port, profiles, endpoint, pool=False)
        summary["reattach"] = await reattach(f"http://127.0.0.1:{second_port}/mcp", handle)
        second.send_signal(signal.SIGKILL)
        second.wait(timeout=30)
        third_port = serve_http.free_port()
        third = host(options, third_port, profiles, endpoint, pool=False)
        summary["refused"] = await refused_reattach(f"http://127.0.0.1:{third_port}/mcp", handle)
        third.send_signal(signal.SIGTERM)
        code = third.wait(timeout=60)
        if code != 0:
            raise AssertionError(f"the next box serve exited {code} after SIGTERM, expected 0")
        exported = Receiver.all_bytes()
        for form in (SECRET_VALUE.encode(), base64.b64encode(SECRET_VALUE.encode())):
            if form in exported:
                raise AssertionError("the secret's value is in the exported traces")
        summary["exports"] = len(Receiver.received)
        print(json.dumps(summary))
    finally:
        for process in (first, second, third):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
        server.shutdown()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception as error:  # noqa: BLE001 - the script's whole job is to report it
        # The SDK's task groups wrap the failure: report the innermost.
        while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
            error = error.exceptions[0]
        print(f"tracing_units_sdk.py: {type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(1)
