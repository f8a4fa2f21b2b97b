#!/usr/bin/env bash
# Build box-fetch:latest, the image of the `fetch` example profile's server unit.
# `box image build fetch` runs this same file (embedded in the binary).
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: build.sh [--force] [--base IMAGE] [--tag IMAGE]

Builds the `fetch` example profile's server image: box-base plus the reference
MCP fetch server (mcp-server-fetch) in /opt/fetch. The Python wheels are
downloaded on this host (pip in a throw-away venv, so PyPI or a pip mirror
configured on this host, PIP_INDEX_URL and friends, is used) and installed in
the image offline; python3 comes from the image's Debian mirror.

Needs: a Docker engine, python3 with the venv module on this host, and the base
image (`box image build` makes box-base:bookworm).

Options:
  --base IMAGE   the image to build on [BOX_FETCH_BASE]; default box-base:bookworm
  --tag IMAGE    the tag to give it [BOX_FETCH_TAG]; default box-fetch:latest
  --force        rebuild even if the tag exists
  -h, --help     this text
USAGE
}

say() { echo "box-fetch: $*" >&2; }
die() {
    echo "box-fetch: error: $*" >&2
    exit 1
}

BASE=${BOX_FETCH_BASE:-box-base:bookworm}
TAG=${BOX_FETCH_TAG:-box-fetch:latest}
FORCE=0
while [ $# -gt 0 ]; do
    case "$1" in
        --force) FORCE=1; shift ;;
        --base) BASE=${2:?--base needs an image}; shift 2 ;;
        --tag) TAG=${2:?--tag needs an image}; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument $1" ;;
    esac
done

docker version --format '{{.Server.Version}}' >/dev/null 2>&1 \
    || die "no Docker engine answers (is dockerd running, and may this user use /var/run/docker.sock?)"
if [ "$FORCE" = 0 ] && docker image inspect "$TAG" >/dev/null 2>&1; then
    say "$TAG exists (--force rebuilds)"
    exit 0
fi
docker image inspect "$BASE" >/dev/null 2>&1 \
    || die "the base image $BASE is missing: build it with \`box image build\` first"
python3 -c 'import venv' 2>/dev/null \
    || die "python3 with the venv module is needed on this host to download the wheels (Debian: apt-get install python3-venv)"

# The image's Python decides which wheels fit (bookworm: 3.11).
PYVER=$(docker run --rm --network none --entrypoint /bin/sh "$BASE" -c \
    '. /etc/os-release; echo "$VERSION_CODENAME"')
case "$PYVER" in
    bookworm) PYVER=3.11 ;;
    trixie) PYVER=3.13 ;;
    *) die "unknown Debian suite \`$PYVER\` in $BASE: set the Python version of its python3 in images/fetch/build.sh" ;;
esac

# The engine's architecture, as the wheels' platform tags spell it.
ARCH=$(docker version --format '{{.Server.Arch}}')
case "$ARCH" in
    amd64) ARCH=x86_64 ;;
    arm64) ARCH=aarch64 ;;
esac

STAGE=$(mktemp -d /tmp/box-fetch-build.XXXXXX)
trap 'rm -rf "$STAGE"' EXIT
HERE=$(cd "$(dirname "$0")" && pwd)
cp "$HERE/Dockerfile" "$STAGE/Dockerfile"

say "downloading mcp-server-fetch and its wheels for Python $PYVER"
python3 -m venv "$STAGE/venv"
"$STAGE/venv/bin/pip" download --quiet --disable-pip-version-check \
    --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform "manylinux2014_$ARCH" --platform "manylinux_2_17_$ARCH" \
    --platform "manylinux_2_28_$ARCH" --platform "linux_$ARCH" \
    --dest "$STAGE/wheels" mcp-server-fetch \
    || die "pip could not download mcp-server-fetch (is PyPI or a pip mirror reachable from this host?)"

say "building $TAG on $BASE"
if ! DOCKER_BUILDKIT=0 docker build --quiet --build-arg "BASE=$BASE" --tag "$TAG" "$STAGE" >"$STAGE/build.log" 2>&1; then
    cat "$STAGE/build.log" >&2
    die "docker build of $TAG failed"
fi
say "built $TAG"
