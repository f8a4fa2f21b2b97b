#!/usr/bin/env bash
# Build the unit images when a Docker engine answers; skip what exists:
# box-rootfs and box-base (images/build.sh, which takes this script's arguments),
# then box-dev, the toolchain image, on box-base (images/dev/build.sh; --force and
# the suite, BOX_IMAGE_SUITE or --suite, reach it too).
# Without an engine there is nothing to build into: say so loudly and exit 0
# (the Docker tests then fail under CI with their own message).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
    echo "images.sh: NOTE: no Docker engine answers; unit images NOT built (the docker backend and its tests need them)" >&2
    exit 0
fi
images/build.sh "$@"
dev=()
while [ $# -gt 0 ]; do
    case "$1" in
        --force) dev+=(--force); shift ;;
        --suite) dev+=(--suite "$2"); shift 2 ;;
        --suite=*) dev+=("$1"); shift ;;
        *) shift ;;
    esac
done
exec images/dev/build.sh ${dev[@]+"${dev[@]}"}
