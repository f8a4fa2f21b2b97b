"""End to end: OpenTelemetry traces of a tool call, received as OTLP/HTTP protobuf.

    tracing_sdk.py BOX --backend local --workspace DIR

Starts an OTLP receiver (decoding with the official definitions, the `opentelemetry-proto`
package) and `box serve --listen` exporting to it (the standard OTEL_EXPORTER_OTLP_ENDPOINT),
with a profile whose secret the command echoes. The Python `mcp` SDK, unmodified, calls `bash`
with a W3C `traceparent` in `_meta`: first in MCP 2026-07-28 (no session: the unit starts for the
call), then in the handshake era (mode "legacy"). The receiver must get one trace per call: the
request span by the MCP conventions, parented by the client's span, the unit's start spans (the
stateless call's, with the backend's steps under `unit.start`: docker's pull, create and boot, the
local backend's spawn, confine and connect) and the executor's span for the command, parented by box's (the executor sends
its spans home in batches, after its answers); requests box answers itself (`ping`, the kept
`tools/list`) have their request spans too; the secret's value in no byte box exported, raw or in
base64.

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
import tempfile
import threading
import time
import urllib.request
from typing import Any

from mcp.client.client import Client
from mcp import types
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

import serve_http

SECRET_NAME = "BOX_TRACE_TOKEN"
SECRET_VALUE = "tr4ce-s3cret-" + random.token_hex(8)


class Receiver(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP collector's trace endpoint: keeps every body as it came."""

    received: list[tuple[str, str, bytes]] = []
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with Receiver.lock:
            Receiver.received.append((self.path, self.headers.get("Content-Type", ""), body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass

    @classmethod
    def spans(cls) -> list[trace_pb2.Span]:
        with cls.lock:
            bodies = list(cls.received)
        spans = []
        for path, content_type, body in bodies:
            if path != "/v1/traces" or content_type != "application/x-protobuf":
                raise AssertionError(f"the export went to {path} as {content_type}")
            request = trace_service_pb2.ExportTraceServiceRequest()
            request.ParseFromString(body)
            for resource_spans in request.resource_spans:
                service = {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}
                if service.get("service.name") != "box":
                    raise AssertionError(f"resource without service.name box: {service}")
                for scope_spans in resource_spans.scope_spans:
                    spans.extend(scope_spans.spans)
        return spans

    @classmethod
    def all_bytes(cls) -> bytes:
        with cls.lock:
            return b"".join(body for _, _, body in cls.received)


def attributes(span: trace_pb2.Span) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind) if kind else None
    return out


def text_of(result: types.CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, types.TextContent))


async def traced_call(client: Client, trace_id: str, parent_id: str) -> str:
    meta = {"traceparent": f"00-{trace_id}-{parent_id}-01", "tracestate": "client=e2e"}
    result = await client.call_tool(
        "bash",
        {"command": f"echo token=${SECRET_NAME}; cat /run/secrets/{SECRET_NAME}; echo done"},
        meta=meta,
    )
    text = text_of(result)
    if result.is_error or "done" not in text or SECRET_VALUE in text:
        raise AssertionError(f"bash: expected done and no secret, got {text!r}")
    if result.meta and any(key.startswith("box/") for key in result.meta):
        raise AssertionError(f"box's own _meta reached the client: {result.meta!r}")
    return text


def wait_for(trace_id: bytes, names: set[str]) -> list[trace_pb2.Span]:
    deadline = time.monotonic() + 30
    while True:
        spans = [span for span in Receiver.spans() if span.trace_id == trace_id]
        if names <= {span.name for span in spans}:
            return spans
        if time.monotonic() > deadline:
            raise AssertionError(f"trace {trace_id.hex()}: spans {sorted(s.name for s in spans)}, missing {sorted(names - {s.name for s in spans})}")
        time.sleep(0.1)


async def host_answered(client: Client, session: bool) -> dict[str, Any]:
    """`ping` and the kept `tools/list` are answered by box itself: each still has its request span
    by the conventions, parented by the client's span."""
    calls = {
        "ping": lambda meta: client.send_ping(meta=meta),
        "tools/list": lambda meta: client.list_tools(meta=meta),
    }
    seen = {}
    for name, send in calls.items():
        trace_id, parent_id = random.token_hex(16), random.token_hex(8)
        await send({"traceparent": f"00-{trace_id}-{parent_id}-01"})
        spans = wait_for(bytes.fromhex(trace_id), {name})
        span = next(span for span in spans if span.name == name)
        attrs = attributes(span)
        if span.kind != trace_pb2.Span.SPAN_KIND_SERVER or span.parent_span_id.hex() != parent_id:
            raise AssertionError(f"{name}: kind {span.kind}, parent {span.parent_span_id.hex()}, expected SERVER under {parent_id}")
        if attrs.get("mcp.method.name") != name or "jsonrpc.request.id" not in attrs:
            raise AssertionError(f"{name}: attributes {attrs}")
        if session != ("mcp.session.id" in attrs):
            raise AssertionError(f"{name}: mcp.session.id {'absent' if session else 'present'}: {attrs}")
        if "error.type" in attrs or "box.unit.name" in attrs:
            raise AssertionError(f"{name}: an error.type, or a unit, on a request box answered: {attrs}")
        seen[name] = len(spans)
    return seen


def check_trace(spans: list[trace_pb2.Span], parent_id: str, version: str, stateless: bool) -> dict[str, Any]:
    by_name = {span.name: span for span in spans}
    request = by_name["tools/call bash"]
    if request.kind != trace_pb2.Span.SPAN_KIND_SERVER:
        raise AssertionError(f"the request span's kind is {request.kind}, expected SERVER")
    if request.parent_span_id.hex() != parent_id:
        raise AssertionError(f"the request span's parent is {request.parent_span_id.hex()}, expected the client's {parent_id}")
    if "client=e2e" not in request.trace_state:
        raise AssertionError(f"the client's tracestate was not kept: {request.trace_state!r}")
    attrs = attributes(request)
    expected = {"mcp.method.name": "tools/call", "gen_ai.tool.name": "bash", "mcp.protocol.version": version}
    for key, value in expected.items():
        if attrs.get(key) != value:
            raise AssertionError(f"request span: {key} = {attrs.get(key)!r}, expected {value!r}: {attrs}")
    if "jsonrpc.request.id" not in attrs:
        raise AssertionError(f"request span: no jsonrpc.request.id: {attrs}")
    if stateless == ("mcp.session.id" in attrs):
        raise AssertionError(f"request span: mcp.session.id {'present' if stateless else 'absent'} ({version}): {attrs}")
    if "error.type" in attrs:
        raise AssertionError(f"request span: an error.type on a call that worked: {attrs}")
    executor = by_name["execute_tool bash"]
    if executor.parent_span_id != request.span_id:
        raise AssertionError("the executor's span is not a child of the request span")
    if not request.start_time_unix_nano <= executor.start_time_unix_nano <= executor.end_time_unix_nano <= request.end_time_unix_nano:
        raise AssertionError("the executor's span is not within the request span")
    ids = {span.span_id for span in spans}
    for span in spans:
        if span is not request and span.parent_span_id not in ids:
            raise AssertionError(f"span {span.name} hangs outside the trace")
    return {"spans": sorted(span.name for span in spans)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("box")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--workspace", required=True)
    options = parser.parse_args()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    profiles = tempfile.mkdtemp()
    with open(os.path.join(profiles, "traced.toml"), "w") as profile:
        profile.write(f'extends = "default"\n[env]\nsecrets = [{{name = "{SECRET_NAME}", as_env = true}}]\n')
    port = serve_http.free_port()
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        SECRET_NAME: SECRET_VALUE,
    }
    serve = [options.box, "serve", "--backend", options.backend, "--workspace", options.workspace,
             "--profiles", profiles, "--profile", "traced", "--listen", f"127.0.0.1:{port}"]
    process = subprocess.Popen(serve, stdin=subprocess.DEVNULL, env=env)
    try:
        serve_http.wait_listening(port, process)
        url = f"http://127.0.0.1:{port}/mcp"
        summary: dict[str, Any] = {"backend": options.backend}

        # 2026-07-28 without a handle: the unit starts for the call, in its trace.
        trace_id, parent_id = random.token_hex(16), random.token_hex(8)
        async with Client(url) as client:
            version = client.protocol_version
            await traced_call(client, trace_id, parent_id)
        expected = {"tools/call bash", "execute_tool bash", "unit.start workspace", "unit.initialize workspace"}
        # The backend's steps, under the unit's start.
        steps = {"unit.pull", "unit.create", "unit.boot"} if options.backend == "docker" \
            else {"unit.spawn", "unit.confine", "unit.connect"}
        expected |= steps
        spans = wait_for(bytes.fromhex(trace_id), expected)
        starts = [span for span in spans if span.name == "unit.start workspace"]
        for span in spans:
            if span.name in steps:
                start = next((s for s in starts if s.span_id == span.parent_span_id), None)
                if start is None:
                    raise AssertionError(f"{span.name} is not under the unit's start")
                if not start.start_time_unix_nano <= span.start_time_unix_nano <= span.end_time_unix_nano <= start.end_time_unix_nano:
                    raise AssertionError(f"{span.name} is not within the unit's start")
                if span.status.code == trace_pb2.Status.STATUS_CODE_ERROR:
                    raise AssertionError(f"{span.name} failed: {span.status}")
        summary["stateless"] = check_trace(spans, parent_id, version, stateless=True)

        # The handshake era: the session's units started at initialize; the call's trace has
        # the request and the executor's spans, and names the session.
        trace_id, parent_id = random.token_hex(16), random.token_hex(8)
        async with Client(url, mode="legacy") as client:
            await traced_call(client, trace_id, parent_id)
            legacy = client.protocol_version
            summary["host_answered"] = await host_answered(client, session=True)
        spans = wait_for(bytes.fromhex(trace_id), {"tools/call bash", "execute_tool bash"})
        summary["legacy"] = check_trace(spans, parent_id, legacy, stateless=False)

        # MCP's duration histogram, beside box's own metrics.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            metrics = response.read().decode()
        histogram = [line for line in metrics.splitlines()
                     if line.startswith("mcp_server_operation_duration_seconds_count")
                     and 'mcp_method_name="tools/call"' in line and 'gen_ai_tool_name="bash"' in line]
        if not histogram or sum(float(line.rsplit(" ", 1)[1]) for line in histogram) < 2:
            raise AssertionError(f"/metrics: no mcp_server_operation_duration_seconds for the two bash calls:\n{metrics}")

        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
        if code != 0:
            raise AssertionError(f"box serve exited {code} after SIGTERM, expected 0")
        exported = Receiver.all_bytes()
        for form in (SECRET_VALUE.encode(), base64.b64encode(SECRET_VALUE.encode())):
            if form in exported:
                raise AssertionError("the secret's value is in the exported traces")
        summary["exports"] = len(Receiver.received)
        print(json.dumps(summary))
    finally:
        if process.poll() is None:
            process.kill()
        server.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
