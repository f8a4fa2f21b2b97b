#!/usr/bin/env bash
# Probe what a process inside a docker unit observes of its hardening, under
# each runtime named (default: runc runsc), with the settings box gives a unit
# (docs/docker-unit.md) and a host Unix socket bind-mounted in. docs/gvisor.md
# records the output; run it again to check them on another machine.
#
#   scripts/gvisor-probe.sh [RUNTIME...]      (BOX_PROBE_IMAGE, default box-base:bookworm)
#
# Per runtime: `docker run` of scripts/hardening-probe.c (compiled static here,
# bind-mounted read-only), then the same through `docker exec` into a running
# unit, then the host's `box execute --landlock required` (when a static box is
# given in BOX_PROBE_BOX) answering an MCP initialize.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${BOX_PROBE_IMAGE:-box-base:bookworm}
RUNTIMES=("$@")
[ ${#RUNTIMES[@]} -gt 0 ] || RUNTIMES=(runc runsc)

WORK=$(mktemp -d /tmp/box-gvisor-probe.XXXXXX)
SERVER=""
CONTAINER=""
cleanup() {
    [ -n "$CONTAINER" ] && docker rm -f "$CONTAINER" >/dev/null 2>&1
    [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

gcc -static -O2 -Wall -o "$WORK/hardening-probe" scripts/hardening-probe.c
mkdir -m 0777 "$WORK/sock"
# A host Unix socket that answers each line with "pong from the host".
python3 - "$WORK/sock/s" <<'PY' &
import os, socket, sys
path = sys.argv[1]
server = socket.socket(socket.AF_UNIX)
server.bind(path)
os.chmod(path, 0o777)
server.listen()
while True:
    conn, _ = server.accept()
    with conn:
        if conn.recv(64):
            conn.sendall(b"pong from the host\n")
PY
SERVER=$!
for _ in $(seq 50); do [ -S "$WORK/sock/s" ] && break; sleep 0.05; done

# The unit's settings (docs/docker-unit.md) with the default profile's limits,
# as `docker run` flags. (A much lower pids limit kills a runsc unit: the
# limit counts gVisor's own host threads, docs/gvisor.md.)
# shellcheck disable=SC2054 # the commas are inside --tmpfs options
UNIT=(--network none --read-only --cap-drop ALL --security-opt no-new-privileges
    --init --user 1000:1000 --memory 2g --memory-swap 2g --cpus 2 --pids-limit 512
    --ulimit nofile=4096:4096 --tmpfs /tmp:rw,nosuid,nodev,size=256m,nr_inodes=65536,mode=1777
    -v "$WORK/hardening-probe:/probe:ro" -v "$WORK/sock:/sock")

for runtime in "${RUNTIMES[@]}"; do
    echo "=== $runtime: docker run"
    timeout 60 docker run --rm --runtime="$runtime" "${UNIT[@]}" "$IMAGE" /probe /sock/s 2>&1 || echo "(exit $?)"
    echo "=== $runtime: docker exec"
    CONTAINER=box-gvisor-probe-$$-$runtime
    docker run -d --name "$CONTAINER" --runtime="$runtime" "${UNIT[@]}" "$IMAGE" sleep infinity >/dev/null
    # A bounded wait: when a sandbox dies, `docker exec` into it never returns.
    timeout 60 docker exec "$CONTAINER" /probe /sock/s 2>&1 || echo "(exit $?)"
    echo "=== $runtime: processes seen by docker exec ps"
    timeout 60 docker exec "$CONTAINER" ps -eo pid,user,comm 2>&1 || echo "(exit $?)"
    docker rm -f "$CONTAINER" >/dev/null
    CONTAINER=""
    if [ -n "${BOX_PROBE_BOX:-}" ]; then
        echo "=== $runtime: box execute --landlock required"
        init='{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","clientInfo":{"name":"probe","version":"0"},"capabilities":{}}}'
        echo "$init" | timeout 60 docker run --rm -i --runtime="$runtime" "${UNIT[@]}" \
            -v "$BOX_PROBE_BOX:/.box/box:ro" --tmpfs /workspace:rw,size=64m,mode=1777 -w /workspace \
            "$IMAGE" /.box/box execute --root /workspace --kind container --ref "$IMAGE" --landlock required 2>&1 \
            | cut -c1-300 || echo "(exit $?)"
    fi
done
