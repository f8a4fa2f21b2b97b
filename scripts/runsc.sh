#!/usr/bin/env bash
# gVisor for box's runsc units: install Debian's runsc package and register it
# with the local Docker engine as the runtime `runsc`, then check it runs.
#
#   scripts/runsc.sh            install + register (idempotent; quick when done)
#   scripts/runsc.sh check      also run `true` in a runsc container of box-base
#
# Registration merges into /etc/docker/daemon.json (every other key kept):
#   "runtimes": {"runsc": {"path": "/usr/bin/runsc",
#                          "runtimeArgs": ["--network=none", "--host-uds=open"]}}
# --network=none: this engine's `--network none` containers do not start under
#   runsc without it; box's units have no network of their own anyway.
# --host-uds=open: a process in the sandbox may connect to a host Unix socket
#   bind-mounted into it (box's control channel and egress proxy); without it
#   gVisor refuses the connect (docs/gvisor.md).
# Then dockerd is sent SIGHUP, which reloads its runtimes without touching
# running containers, and `docker info` must list runsc.
# Needs root and the engine on this machine (its daemon.json is the one edited).
set -euo pipefail

DAEMON_JSON=${BOX_DOCKER_DAEMON_JSON:-/etc/docker/daemon.json}
RUNSC=/usr/bin/runsc
ARGS='["--network=none", "--host-uds=open"]'

say() { echo "runsc: $*" >&2; }
die() {
    echo "runsc: error: $*" >&2
    exit 1
}

listed() {
    docker info --format '{{json .Runtimes}}' 2>/dev/null | python3 -c 'import json, sys; sys.exit(0 if "runsc" in json.load(sys.stdin) else 1)'
}

install() {
    [ -x "$RUNSC" ] && return
    say "installing runsc (apt-get)"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q runsc; } >&2 \
        || die "cannot install Debian's runsc package (apt-get install runsc)"
    [ -x "$RUNSC" ] || die "runsc installed but $RUNSC is missing"
}

# Merge the runtime into daemon.json; prints "changed" or "same".
merge() {
    python3 - "$DAEMON_JSON" "$RUNSC" "$ARGS" <<'PY'
import json, os, sys

path, runsc, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
try:
    with open(path) as f:
        text = f.read()
    config = json.loads(text) if text.strip() else {}
except FileNotFoundError:
    config = {}
except json.JSONDecodeError as error:
    sys.exit(f"runsc: error: {path} is not JSON ({error}); fix it by hand first")
if not isinstance(config, dict):
    sys.exit(f"runsc: error: {path} is not a JSON object")
runtimes = config.setdefault("runtimes", {})
want = {"path": runsc, "runtimeArgs": args}
if runtimes.get("runsc") == want:
    print("same")
    sys.exit(0)
if "runsc" in runtimes:
    print(f"runsc: replacing the runsc runtime in {path}: {json.dumps(runtimes['runsc'])}", file=sys.stderr)
runtimes["runsc"] = want
os.makedirs(os.path.dirname(path), exist_ok=True)
tmp = path + ".box-runsc.tmp"
with open(tmp, "w") as f:
    json.dump(config, f, indent=2)
    f.write("\n")
if os.path.exists(path):
    os.chmod(tmp, os.stat(path).st_mode & 0o7777)
os.replace(tmp, path)
print("changed")
PY
}

dockerd_pid() {
    local pid=""
    [ -r /var/run/docker.pid ] && pid=$(cat /var/run/docker.pid)
    if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
        pid=$(pidof dockerd || true)
    fi
    [[ "$pid" =~ ^[0-9]+$ ]] || die "no dockerd runs on this machine (/var/run/docker.pid, pidof dockerd): the engine's own host must register runsc"
    echo "$pid"
}

register() {
    docker version --format '{{.Server.Version}}' >/dev/null 2>&1 || die "no Docker engine answers (docker version)"
    local pid state
    pid=$(dockerd_pid)
    state=$(merge)
    if [ "$state" = same ] && listed; then
        return
    fi
    say "registered runsc in $DAEMON_JSON; reloading dockerd ($pid) with SIGHUP (running containers are unaffected)"
    kill -HUP "$pid"
    for _ in $(seq 50); do
        listed && return
        sleep 0.1
    done
    die "dockerd did not list runsc after SIGHUP (docker info); see its log"
}

check() {
    local image=${BOX_RUNSC_CHECK_IMAGE:-box-base:bookworm} out
    out=$(docker run --rm --runtime=runsc --network none --read-only --cap-drop ALL \
        --security-opt no-new-privileges "$image" dmesg 2>&1) \
        || die "a runsc container of $image did not run: $out"
    grep -qi gvisor <<<"$out" || die "a runsc container's kernel log does not name gVisor: $out"
}

case "${1:-}" in
    "" | check) ;;
    -h | --help) sed -n '2,19s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) die "unknown argument $1; usage: scripts/runsc.sh [check]" ;;
esac
[ "$(id -u)" = 0 ] || die "needs root (apt-get, $DAEMON_JSON, SIGHUP to dockerd)"
install
register
[ "${1:-}" = check ] && check
say "ready: runtime runsc ($("$RUNSC" --version 2>/dev/null | head -n1))"
