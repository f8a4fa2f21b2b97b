"""Two (or more) `box` binaries' executors side by side (BENCHMARKS.md, The
installed binary): whether a build profile made the tools slower. Each binary
serves `box execute --landlock off` on a pipe to this client (raw JSON-RPC
lines), which times READS (3000) `read` calls of a 20-line file, then GREPS
(5) `grep` calls over TREE (a directory copied into the workspace, e.g. part
of ~/.cargo/registry/src); the binaries take turns, ROUNDS (3) times. Prints
per binary each round's read p50 and p99 (µs) and grep median (ms).

    python3 scripts/bench-binaries.py TREE old/box target/x86_64-unknown-linux-gnu/release/box
"""
import json, os, shutil, statistics, subprocess, sys, tempfile, time

READS = int(os.environ.get("READS", "3000"))
GREPS = int(os.environ.get("GREPS", "5"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
PATTERN = os.environ.get("PATTERN", "fn spawn_blocking")


def session(binary, root):
    child = subprocess.Popen(
        [binary, "execute", "--root", root, "--kind", "local", "--landlock", "off"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
    last = [0]

    def call(method, params, notify=False):
        message = {"jsonrpc": "2.0", "method": method, "params": params}
        if not notify:
            last[0] += 1
            message["id"] = last[0]
        child.stdin.write((json.dumps(message) + "\n").encode())
        while not notify:
            answer = json.loads(child.stdout.readline())
            if answer.get("id") == last[0]:
                assert "result" in answer, answer
                return answer

    call("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                        "clientInfo": {"name": "bench-binaries", "version": "0"}})
    call("notifications/initialized", {}, notify=True)
    return child, call


def bench(binary, root):
    child, call = session(binary, root)
    reads = []
    for _ in range(READS):
        started = time.perf_counter()
        call("tools/call", {"name": "read", "arguments": {"path": "small.txt"}})
        reads.append(time.perf_counter() - started)
    greps = []
    for _ in range(GREPS):
        started = time.perf_counter()
        call("tools/call", {"name": "grep", "arguments": {"pattern": PATTERN, "path": "tree"}})
        greps.append(time.perf_counter() - started)
    child.stdin.close()
    child.wait()
    reads.sort()
    return (statistics.median(reads) * 1e6, reads[int(len(reads) * 0.99)] * 1e6,
            statistics.median(greps) * 1e3)


def main():
    tree, binaries = sys.argv[1], sys.argv[2:]
    root = tempfile.mkdtemp()
    try:
        with open(os.path.join(root, "small.txt"), "w") as small:
            small.writelines(f"line {n}\n" for n in range(1, 21))
        shutil.copytree(tree, os.path.join(root, "tree"), symlinks=True)
        rows = {binary: [] for binary in binaries}
        for _ in range(ROUNDS):
            for binary in binaries:
                rows[binary].append(bench(binary, root))
        for binary, runs in rows.items():
            print(binary,
                  "read p50 µs", [round(run[0]) for run in runs],
                  "p99 µs", [round(run[1]) for run in runs],
                  "grep median ms", [round(run[2]) for run in runs])
    finally:
        shutil.rmtree(root)


main()
