#!/usr/bin/env bash
# A throw-away local container registry for tests and benchmarks: Debian's
# docker-registry package (the CNCF distribution registry), run directly (never
# its systemd service), on a free 127.0.0.1 port with its storage in a temp dir.
#
#   scripts/registry.sh install        installs the package when missing (quick when present)
#   scripts/registry.sh start          prints the address, e.g. localhost:40123
#   scripts/registry.sh stop ADDRESS   stops it and removes its storage
#   scripts/registry.sh status ADDRESS exit 0 when it answers
#
# Docker treats 127.0.0.0/8 as an insecure registry by default, so
# `docker push localhost:PORT/NAME:TAG` needs no daemon configuration.
# Installs docker-registry with apt-get when it is missing.
set -euo pipefail

BIN=/usr/bin/docker-registry

say() { echo "registry: $*" >&2; }
die() {
    echo "registry: error: $*" >&2
    exit 1
}
usage() {
    sed -n '2,14s/^# \{0,1\}//p' "$0"
}

# The state of the registry on PORT (config, storage, pid, log).
state_dir() { echo "${TMPDIR:-/tmp}/box-registry-$1"; }

port_of() { # ADDRESS (localhost:PORT, 127.0.0.1:PORT or PORT)
    local port=${1##*:}
    [[ "$port" =~ ^[0-9]+$ ]] || die "$1 is not a registry address (localhost:PORT)"
    echo "$port"
}

answers() { # PORT
    curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$1/v2/" 2>/dev/null
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

ensure_installed() {
    [ -x "$BIN" ] && return
    say "installing docker-registry (apt-get)"
    # On a systemd host the package also enables its own service (port 5000);
    # this script never uses it and leaves it as the package set it.
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-registry; } >&2 \
        || die "cannot install Debian's docker-registry package (apt-get install docker-registry)"
    [ -x "$BIN" ] || die "docker-registry installed but $BIN is missing"
}

start() {
    command -v curl >/dev/null 2>&1 || die "curl is needed to check that the registry answers"
    ensure_installed
    local attempt port dir pid
    for attempt in 1 2 3 4 5; do
        port=$(free_port)
        dir=$(state_dir "$port")
        rm -rf "$dir"
        mkdir -p "$dir/storage"
        cat >"$dir/config.yml" <<YAML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $dir/storage
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$port
  secret: $(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
YAML
        # Its own session, so the caller's terminal signals do not reach it; it
        # lives until `stop`.
        setsid "$BIN" serve "$dir/config.yml" >"$dir/log" 2>&1 </dev/null &
        pid=$!
        echo "$pid" >"$dir/pid"
        for _ in $(seq 100); do
            if answers "$port"; then
                echo "localhost:$port"
                return
            fi
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
        kill "$pid" 2>/dev/null || true
        if grep -q 'address already in use' "$dir/log"; then
            say "port $port was taken meanwhile (attempt $attempt); another"
            rm -rf "$dir"
            continue
        fi
        cat "$dir/log" >&2
        rm -rf "$dir"
        die "docker-registry did not answer on 127.0.0.1:$port within 5 s (its log is above)"
    done
    die "no free port after 5 attempts"
}

stop() {
    local port dir pid
    port=$(port_of "$1")
    dir=$(state_dir "$port")
    [ -f "$dir/pid" ] || die "no registry started by this script on port $port ($dir/pid is missing)"
    pid=$(cat "$dir/pid")
    # Only the process this script started: its pid, checked to still be the registry.
    if kill -0 "$pid" 2>/dev/null && grep -qF "$dir/config.yml" "/proc/$pid/cmdline" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
    fi
    rm -rf "$dir"
}

case "${1:-}" in
    install) [ $# -eq 1 ] || die "usage: registry.sh install"; ensure_installed ;;
    start) [ $# -eq 1 ] || die "usage: registry.sh start"; start ;;
    stop) [ $# -eq 2 ] || die "usage: registry.sh stop ADDRESS"; stop "$2" ;;
    status) [ $# -eq 2 ] || die "usage: registry.sh status ADDRESS"; answers "$(port_of "$2")" ;;
    -h | --help) usage ;;
    *) usage >&2; exit 2 ;;
esac
