#!/usr/bin/env bash
# The pull benchmark (BENCHMARKS.md, "Image pull"): a 100 MiB image pulled from
# a local registry by `box image pull` against `docker pull` of the same image,
# each from an empty local cache, in the same run, alternating which goes first.
#
#   scripts/bench-pull.sh [ROUNDS]      default 5 rounds (each: one pull of each)
#
# BOX names the box binary (default: the release build, else the debug one,
# under CARGO_TARGET_DIR when set). The image is built here like box-test-big
# (box-base:bookworm plus one layer of 100 MiB of random, incompressible data)
# but with data of its own, so after `docker rmi` no layer of it but
# box-base's is on the engine: every pull downloads the 100 MiB layer. The
# registry is scripts/registry.sh's (Debian's docker-registry on loopback).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${1:-5}
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "bench-pull: ROUNDS must be a whole number from 1" >&2; exit 2; }

say() { echo "bench-pull: $*" >&2; }
die() {
    echo "bench-pull: error: $*" >&2
    exit 1
}

TARGET=${CARGO_TARGET_DIR:-target}
if [ -z "${BOX:-}" ]; then
    # The workspace builds for an explicit target triple (.cargo/config.toml).
    for candidate in "$TARGET"/release/box "$TARGET"/*/release/box "$TARGET"/debug/box "$TARGET"/*/debug/box; do
        if [ -x "$candidate" ]; then
            BOX=$candidate
            break
        fi
    done
fi
[ -n "${BOX:-}" ] && [ -x "$BOX" ] || die "no box binary: build one (cargo build --release) or set BOX"
docker image inspect box-base:bookworm >/dev/null 2>&1 \
    || die "box-base:bookworm is missing: run scripts/images.sh (or box image build)"

STAGE=$(mktemp -d /tmp/box-bench-pull.XXXXXX)
REGISTRY=$(scripts/registry.sh start)
REPO="$REGISTRY/box-bench-pull"
cleanup() {
    docker rmi -f "$REPO:big" >/dev/null 2>&1 || true
    [ -n "${DIGEST:-}" ] && docker rmi -f "$REPO@$DIGEST" >/dev/null 2>&1 || true
    scripts/registry.sh stop "$REGISTRY" || true
    rm -rf "$STAGE"
}
trap cleanup EXIT

say "building a 100 MiB image and pushing it to $REGISTRY"
head -c 100M /dev/urandom >"$STAGE/random"
printf 'FROM box-base:bookworm\nCOPY random /big/random\n' >"$STAGE/Dockerfile"
DOCKER_BUILDKIT=0 docker build --quiet --tag "$REPO:big" "$STAGE" >/dev/null 2>"$STAGE/build.log" || { cat "$STAGE/build.log" >&2; die "docker build failed"; }
rm -f "$STAGE/random"
DIGEST=$(docker push "$REPO:big" | grep -o 'sha256:[0-9a-f]\{64\}' | tail -1)
[ -n "$DIGEST" ] || die "docker push printed no digest"
PINNED="$REPO@$DIGEST"

# The image gone from the engine, its 100 MiB layer with it (box-base's stay).
empty_cache() {
    docker rmi -f "$REPO:big" >/dev/null 2>&1 || true
    docker rmi -f "$PINNED" >/dev/null 2>&1 || true
    if docker image inspect "$PINNED" >/dev/null 2>&1; then
        die "$PINNED is still on the engine"
    fi
}

now() { date +%s.%N; }

# Seconds one pull takes, from an empty cache.
timed() { # docker|box
    empty_cache
    sync
    local start end
    start=$(now)
    case "$1" in
        docker) docker pull --quiet "$PINNED" >/dev/null ;;
        box) "$BOX" image pull "$PINNED" >/dev/null 2>&1 ;;
    esac
    end=$(now)
    awk -v a="$start" -v b="$end" 'BEGIN {print b - a}'
}

DOCKER_TIMES=()
BOX_TIMES=()
for round in $(seq "$ROUNDS"); do
    if [ $((round % 2)) = 1 ]; then
        d=$(timed docker)
        b=$(timed box)
    else
        b=$(timed box)
        d=$(timed docker)
    fi
    DOCKER_TIMES+=("$d")
    BOX_TIMES+=("$b")
    printf 'bench-pull: round %d: docker pull %.2f s, box image pull %.2f s\n' "$round" "$d" "$b" >&2
done

median() {
    printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'
}
MD=$(median "${DOCKER_TIMES[@]}")
MB=$(median "${BOX_TIMES[@]}")
RATIO=$(awk -v b="$MB" -v d="$MD" 'BEGIN {print b / d}')
printf 'pull of 100 MiB from %s, %d rounds: docker pull median %.2f s (%s), box image pull median %.2f s (%s), ratio %.3f (goal <= 1.1)\n' \
    "$REGISTRY" "$ROUNDS" "$MD" "$(printf '%.2f ' "${DOCKER_TIMES[@]}")" \
    "$MB" "$(printf '%.2f ' "${BOX_TIMES[@]}")" "$RATIO"
