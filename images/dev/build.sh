#!/usr/bin/env bash
# Build box-dev:SUITE, the toolchain unit image, on box-base:SUITE.
# `box image build dev` runs this same file (embedded in the binary).
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: build.sh [--force] [--suite NAME] [--base IMAGE] [--tag IMAGE]

Builds the toolchain unit image: box-base plus Python (venv, pip, pytest), Node (npm),
Rust (cargo, rustc), Go, a C toolchain and make, git and curl, installed with
apt inside the build from the Debian mirror the base image was built from (its
own apt sources): nothing is pulled from a container registry. About 1.5 GB
more than the base; a few minutes (most of it unpacking packages).

Needs: a Docker engine and the base image (`box image build` makes
box-base:bookworm).

Options:
  --suite NAME   the Debian suite [BOX_IMAGE_SUITE]; default bookworm: builds
                 box-dev:NAME on box-base:NAME
  --base IMAGE   the image to build on [BOX_DEV_BASE]; default box-base:SUITE
  --tag IMAGE    the tag to give it [BOX_DEV_TAG]; default box-dev:SUITE
  --force        rebuild even if the tag exists
  -h, --help     this text
USAGE
}

say() { echo "box-dev: $*" >&2; }
die() {
    echo "box-dev: error: $*" >&2
    exit 1
}

SUITE=${BOX_IMAGE_SUITE:-bookworm}
BASE=${BOX_DEV_BASE:-}
TAG=${BOX_DEV_TAG:-}
FORCE=0
while [ $# -gt 0 ]; do
    case "$1" in
        --force) FORCE=1; shift ;;
        --suite) [ $# -ge 2 ] || die "--suite needs a name"; SUITE=$2; shift 2 ;;
        --suite=*) SUITE=${1#*=}; shift ;;
        --base) [ $# -ge 2 ] || die "--base needs an image"; BASE=$2; shift 2 ;;
        --tag) [ $# -ge 2 ] || die "--tag needs an image"; TAG=$2; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument $1" ;;
    esac
done
[[ "$SUITE" =~ ^[a-z][a-z0-9.-]*$ ]] || die "--suite $SUITE is not a Debian suite name (like bookworm)"
BASE=${BASE:-box-base:$SUITE}
TAG=${TAG:-box-dev:$SUITE}

docker version --format '{{.Server.Version}}' >/dev/null 2>&1 \
    || die "no Docker engine answers (is dockerd running, and may this user use /var/run/docker.sock?)"
HERE=$(cd "$(dirname "$0")" && pwd)
# The recipe's digest, kept as a label: an image built from another recipe (an
# older Dockerfile) is stale and rebuilt, so a checkout never runs on a dev
# image that lacks what its Dockerfile installs.
RECIPE=$(sha256sum "$HERE/Dockerfile" | cut -c1-16)
if [ "$FORCE" = 0 ] && docker image inspect "$TAG" >/dev/null 2>&1; then
    have=$(docker image inspect --format '{{ index .Config.Labels "box.recipe" }}' "$TAG" 2>/dev/null || true)
    if [ "$have" = "$RECIPE" ]; then
        say "$TAG exists, skipping (--force rebuilds)"
        exit 0
    fi
    say "$TAG was built from another recipe (${have:-none} != $RECIPE): rebuilding"
fi
docker image inspect "$BASE" >/dev/null 2>&1 \
    || die "the base image $BASE is missing: build it with \`box image build\` first"

STAGE=$(mktemp -d /tmp/box-dev-build.XXXXXX)
trap 'rm -rf "$STAGE"' EXIT
cp "$HERE/Dockerfile" "$STAGE/Dockerfile"

say "building $TAG on $BASE (apt from the base image's mirror; a few minutes)"
start=$(date +%s)
# The classic builder: BuildKit may be absent, and nothing here needs it.
if ! DOCKER_BUILDKIT=0 docker build --quiet --build-arg "BASE=$BASE" --label "box.recipe=$RECIPE" --tag "$TAG" "$STAGE" >"$STAGE/build.log" 2>&1; then
    cat "$STAGE/build.log" >&2
    die "docker build of $TAG failed (is the Debian mirror in $BASE's /etc/apt/sources.list reachable from a container?)"
fi
say "built $TAG in $(($(date +%s) - start))s"
