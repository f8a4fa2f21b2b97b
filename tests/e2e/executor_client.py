"""End to end: the Python `mcp` SDK (2.x) drives `box execute` over stdio.

Usage: executor_client.py BOX_BINARY WORKSPACE_ROOT

The workspace holds notes.txt ("one\ntwo\nthree\n") and src/main.rs. Every check
asserts; any failure exits non-zero with the reason.
"""

import asyncio
import json
import os
import shutil
import sys

from mcp import Client
from mcp.client.stdio import StdioServerParameters

EXECUTOR = "io.github.christopherdavenport.dax/executor"
FACTS = "io.github.christopherdavenport.agenttool/facts"
TOOL_META = "io.github.christopherdavenport.agenttool/tool"
ORDER = ["read", "write", "edit", "glob", "grep", "ls", "bash", "copy", "move", "remove"]
MISMATCH = (
    "what this call touches changed since it was allowed "
    "(a path leads somewhere else now); ask again"
)


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def text_of(result):
    check(len(result.content) == 1, f"one text block expected: {result}")
    return result.content[0].text


async def raw(client, method, params):
    """A custom JSON-RPC request (not a typed MCP method): the raw result."""
    return await client.session._dispatcher.send_raw_request(method, params, {})


async def main(box, root):
    server = StdioServerParameters(command=box, args=["execute", "--root", root, "--landlock", "off"])
    # The handshake era: in mode "auto" the SDK finds 2026-07-28 served and speaks it.
    async with Client(server, mode="legacy") as client:
        info = client.server_info
        check(info is not None and info.name == "box", f"serverInfo: {info}")
        experimental = client.server_capabilities.experimental or {}
        check(experimental.get(FACTS) == {}, f"facts capability: {experimental}")
        executor = experimental.get(EXECUTOR)
        check(executor is not None and executor["version"] == 1, f"executor capability: {executor}")
        check(executor["descriptor"]["root"] == os.path.realpath(root), f"descriptor: {executor['descriptor']}")
        check([t["name"] for t in executor["tools"]] == ORDER, f"capability tools: {executor['tools']}")
        check(executor["files"] == {"uriTemplate": "agentworkspace:///{op}{?path}"}, "files template")

        listed = (await client.list_tools()).tools
        check(sorted(t.name for t in listed) == sorted(ORDER), f"tools/list: {[t.name for t in listed]}")
        for tool in listed:
            check("dax_stamp" in tool.input_schema["properties"], f"{tool.name} has no dax_stamp")
            flags = (tool.meta or {}).get(TOOL_META)
            check(flags and flags["facts"] and flags["replay"], f"{tool.name} flags: {flags}")
            check(bool(flags.get("sequential")) == (tool.name == "bash"), f"{tool.name} sequential")

        # Every file tool, called.
        result = await client.call_tool("read", {"path": "notes.txt"})
        check(not result.is_error and text_of(result) == "     1\tone\n     2\ttwo\n     3\tthree\n", f"read: {result}")
        result = await client.call_tool("write", {"path": "new/file.txt", "content": "hello\n"})
        check(text_of(result) == "wrote 6 bytes to new/file.txt", f"write: {result}")
        result = await client.call_tool("edit", {"path": "notes.txt", "old_string": "two", "new_string": "2"})
        check(text_of(result) == "edited notes.txt", f"edit: {result}")
        result = await client.call_tool("glob", {"pattern": "**/*.txt"})
        check(text_of(result) == "new/file.txt\nnotes.txt\n", f"glob: {result}")
        result = await client.call_tool("grep", {"pattern": "hel+o"})
        check(text_of(result) == "new/file.txt:1:hello\n", f"grep: {result}")
        result = await client.call_tool("ls", {})
        check(text_of(result) == "new/\nnotes.txt  12\nsrc/\n", f"ls: {result}")
        # box's namespace tools (issue 23, item 8).
        result = await client.call_tool("copy", {"source": "new/file.txt", "destination": "new/copy.txt"})
        check(text_of(result) == "copied new/file.txt to new/copy.txt (6 bytes)", f"copy: {result}")
        result = await client.call_tool("copy", {"source": "new/file.txt", "destination": "new/copy.txt"})
        check(result.is_error and "already exists" in text_of(result), f"copy over: {result}")
        result = await client.call_tool("move", {"source": "new/copy.txt", "destination": "new/moved.txt"})
        check(text_of(result) == "moved new/copy.txt to new/moved.txt", f"move: {result}")
        result = await client.call_tool("remove", {"path": "new/moved.txt"})
        check(text_of(result) == "removed new/moved.txt", f"remove: {result}")
        result = await client.call_tool("remove", {"path": "new"})
        check(result.is_error and "not recursive" in text_of(result), f"remove a directory: {result}")
        result = await client.call_tool("read", {"path": "../outside"})
        check(result.is_error and "outside the workspace" in text_of(result), f"outside: {result}")
        result = await client.call_tool("read", {"path": "notes.txt", "Path": ".env"})
        check(result.is_error and "in another case" in text_of(result), f"exact keys: {result}")

        # Facts and stamps, including a stamp refused after the path became a link.
        answer = await raw(client, "execution/facts", {"calls": [
            {"name": "read", "arguments": {"path": "notes.txt"}},
            {"name": "nope", "arguments": {}},
        ]})
        results = answer["results"]
        check(len(results) == 2, f"facts: {answer}")
        check(results[0]["facts"]["calls"] == [{"tool": "", "args": {"path": "notes.txt"}, "text": "notes.txt"}],
              f"facts calls: {results[0]}")
        check(results[1] == {"error": 'unknown tool "nope"', "replay": "unknown"}, f"unknown tool: {results[1]}")
        rewrite = results[0]["facts"]["rewrite"]
        result = await client.call_tool("read", rewrite)
        check(not result.is_error, f"stamped read: {result}")
        with open(os.path.join(root, "secret"), "w") as secret:
            secret.write("s3cret\n")
        os.remove(os.path.join(root, "notes.txt"))
        os.symlink("secret", os.path.join(root, "notes.txt"))
        result = await client.call_tool("read", rewrite)
        check(result.is_error and text_of(result) == MISMATCH, f"stale stamp: {result}")

        # Resources.
        templates = (await client.list_resource_templates()).resource_templates
        check([t.uri_template for t in templates] == ["agentworkspace:///{op}{?path}"], f"templates: {templates}")
        read = await client.read_resource("agentworkspace:///stat?path=src%2Fmain.rs")
        document = json.loads(read.contents[0].text)
        check(document["info"]["name"] == "main.rs" and document["info"]["mode"] & 0o777, f"stat: {document}")
        read = await client.read_resource("agentworkspace:///read?path=..%2Fx")
        check(json.loads(read.contents[0].text)["error"]["kind"] == "outside", f"outside resource: {read}")

        # Hostile names (issue 8, item 5): shown quoted, one entry one line, named back;
        # bash output carries no live terminal control sequence.
        os.mkdir(os.path.join(root, "names"))
        with open(os.path.join(root.encode(), b"names", b"bad-\xff\x1b]0;t\x07\nx"), "wb") as hostile:
            hostile.write(b"hostile\n")
        result = await client.call_tool("ls", {"path": "names"})
        check(text_of(result) == '"bad-\\xff\\x1b]0;t\\x07\\nx"  8\n', f"ls of a hostile name: {result}")
        result = await client.call_tool("read", {"path": 'names/"bad-\\xff\\x1b]0;t\\x07\\nx"'})
        check(text_of(result) == "     1\thostile\n", f"read by the shown name: {result}")
        result = await client.call_tool("bash", {"command": "printf '\\033[2J\\033]0;t\\007'"})
        check(text_of(result) == "\\x1b[2J\\x1b]0;t\\x07\n[exit 0]", f"bash controls: {result}")
        shutil.rmtree(os.path.join(root.encode(), b"names"))

        # A batch with a cancelling failure.
        answer = await raw(client, "execution/batch", {"calls": [
            {"name": "ls", "arguments": {}},
            {"name": "edit", "arguments": {"path": "src/main.rs", "old_string": "absent", "new_string": "x"}},
            {"name": "write", "arguments": {"path": "after.txt", "content": "x"}},
        ]})
        results = answer["results"]
        check(len(results) == 3, f"batch: {answer}")
        check(not results[0]["isError"], f"batch ls: {results[0]}")
        check(results[1]["isError"], f"batch edit: {results[1]}")
        check(results[2]["content"][0]["text"]
              == "skipped: edit failed earlier in this batch, so this call was cancelled", f"skipped: {results[2]}")
        check(not os.path.exists(os.path.join(root, "after.txt")), "a skipped write ran")
    print("executor_client: all checks passed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
