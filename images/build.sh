#!/usr/bin/env bash
# Build box's unit images offline: nothing is pulled from a registry.
#   1. box-rootfs:bookworm  debootstrap (minbase) from the Debian mirror in
#                           /etc/apt/sources.list*, imported with `docker import`.
#   2. box-base:bookworm    images/base/Dockerfile on top of it (non-root user
#                           1000 `box`, /workspace).
# Skips every image that already exists (`docker image inspect`); --force
# rebuilds. Needs root (debootstrap) and a Docker engine.
set -euo pipefail
cd "$(dirname "$0")"

ROOTFS_IMAGE=box-rootfs:bookworm
BASE_IMAGE=box-base:bookworm
SUITE=bookworm
PACKAGES=bash,git,ca-certificates,procps,iproute2
FORCE=0
[ "${1:-}" = "--force" ] && FORCE=1

say() { echo "images: $*" >&2; }

have_image() {
    [ "$FORCE" = 0 ] && docker image inspect "$1" >/dev/null 2>&1
}

# The Debian mirror this machine's apt uses (deb822 "URIs:" or one-line "deb URL").
debian_mirror() {
    local files=(/etc/apt/sources.list /etc/apt/sources.list.d/*)
    local uri
    uri=$(grep -hs -E '^[[:space:]]*URIs:' "${files[@]}" 2>/dev/null \
        | awk '{print $2}' | grep -v -- '-security' | head -n1 || true)
    if [ -z "$uri" ]; then
        uri=$(grep -hs -E '^[[:space:]]*deb[[:space:]]' "${files[@]}" 2>/dev/null \
            | sed -E 's/^[[:space:]]*deb[[:space:]]+(\[[^]]*\][[:space:]]+)?//' \
            | awk '{print $1}' | grep -v -- '-security' | head -n1 || true)
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}

build_rootfs() {
    if have_image "$ROOTFS_IMAGE"; then
        say "$ROOTFS_IMAGE exists, skipping"
        return
    fi
    if ! command -v debootstrap >/dev/null 2>&1; then
        say "installing debootstrap (apt-get)"
        apt-get update -q >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >&2
    fi
    local mirror dir
    mirror=$(debian_mirror)
    dir=$(mktemp -d /tmp/box-rootfs.XXXXXX)
    # shellcheck disable=SC2064
    trap "rm -rf '$dir'" EXIT
    say "debootstrap --variant=minbase $SUITE from $mirror into $dir (a few minutes)"
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$dir" "$mirror" >&2
    # Caches and logs are not part of the image.
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/* \
        "$dir"/var/log/* "$dir"/tmp/* "$dir"/debootstrap
    say "importing $dir as $ROOTFS_IMAGE"
    tar -C "$dir" --numeric-owner -c . \
        | docker import --change 'CMD ["/bin/bash"]' \
            --message "box rootfs: debootstrap minbase $SUITE" - "$ROOTFS_IMAGE" >&2
    rm -rf "$dir"
    trap - EXIT
}

build_base() {
    if have_image "$BASE_IMAGE"; then
        say "$BASE_IMAGE exists, skipping"
        return
    fi
    say "building $BASE_IMAGE from images/base/Dockerfile"
    # The classic builder: BuildKit may be absent, and nothing here needs it.
    DOCKER_BUILDKIT=0 docker build --quiet --tag "$BASE_IMAGE" base >&2
}

build_rootfs
build_base
say "ready: $ROOTFS_IMAGE $BASE_IMAGE"
