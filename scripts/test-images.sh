#!/usr/bin/env bash
# Build the test fixture images (images/README.md, "Test images"), offline:
#   box-test-scratch:latest  FROM scratch + Debian's static busybox
#   box-test-musl:latest     musl loader and libc + a musl program + busybox; no glibc
#   box-test-big:latest      box-base:bookworm + a 100 MiB layer of random data
#   box-test-tools:latest    box-base:bookworm + curl and python3 (egress tests);
#                            the one fixture that installs with apt inside the build
# Skips every image that exists; --force rebuilds. Debian packages come from
# this host's apt (`apt-get download`, so nothing is installed for busybox or
# musl's runtime; musl-tools is installed to compile the musl program).
# Without a Docker engine there is nothing to build into: says so loudly and
# exits 0 (the Docker tests then fail under CI with their own message).
set -euo pipefail
cd "$(dirname "$0")/.."

FORCE=0
case "${1:-}" in
    "") ;;
    --force) FORCE=1 ;;
    -h | --help)
        sed -n '2,10s/^# \{0,1\}//p' "$0"
        exit 0
        ;;
    *)
        echo "test-images.sh: unknown argument $1; usage: scripts/test-images.sh [--force]" >&2
        exit 2
        ;;
esac

say() { echo "test-images: $*" >&2; }
die() {
    echo "test-images: error: $*" >&2
    exit 1
}

if ! docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
    say "NOTE: no Docker engine answers; test images NOT built (the docker tests need them)"
    exit 0
fi

have_image() {
    [ "$FORCE" = 0 ] && docker image inspect "$1" >/dev/null 2>&1
}

build() { # IMAGE DOCKERFILE CONTEXT
    # The classic builder: BuildKit may be absent, and nothing here needs it.
    if ! DOCKER_BUILDKIT=0 docker build --quiet --tag "$1" --file "$2" "$3" >"$STAGE/build.log" 2>&1; then
        cat "$STAGE/build.log" >&2
        die "docker build of $1 failed"
    fi
    say "built $1"
}

STAGE=$(mktemp -d /tmp/box-test-images.XXXXXX)
trap 'rm -rf "$STAGE"' EXIT

# One Debian package's files, unpacked under $STAGE/pkg/NAME (cached for this run).
unpack() {
    local name=$1 dir=$STAGE/pkg/$1
    if [ ! -d "$dir" ]; then
        mkdir -p "$dir"
        if ! (cd "$STAGE/pkg" && apt-get -q -o APT::Sandbox::User=root download "$name" >/dev/null 2>&1); then
            say "apt-get download $name failed; updating the package lists once"
            apt-get update -q >/dev/null 2>&1 || true
            (cd "$STAGE/pkg" && apt-get -q -o APT::Sandbox::User=root download "$name" >/dev/null) \
                || die "cannot download Debian's $name package (apt-get download $name)"
        fi
        dpkg-deb -x "$STAGE/pkg/${name}"_*.deb "$dir"
    fi
    echo "$dir"
}

# Static busybox at ROOT/bin/busybox and one absolute symlink per applet.
install_busybox() {
    local root=$1 pkg applet
    pkg=$(unpack busybox-static)
    install -D -m 0755 "$pkg/bin/busybox" "$root/bin/busybox"
    "$root/bin/busybox" --list-full | while read -r applet; do
        [ "$applet" = bin/busybox ] && continue
        mkdir -p "$root/$(dirname "$applet")"
        ln -sfn /bin/busybox "$root/$applet"
    done
}

build_scratch() {
    local image=box-test-scratch:latest ctx=$STAGE/scratch
    if have_image "$image"; then
        say "$image exists, skipping"
        return
    fi
    install_busybox "$ctx/rootfs"
    build "$image" images/test-scratch/Dockerfile "$ctx"
}

build_musl() {
    local image=box-test-musl:latest ctx=$STAGE/musl pkg loader libc
    if have_image "$image"; then
        say "$image exists, skipping"
        return
    fi
    if ! command -v musl-gcc >/dev/null 2>&1; then
        say "installing musl-tools (apt-get) to compile the musl program"
        { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q musl-tools; } >/dev/null 2>&1 \
            || die "cannot install musl-tools (apt-get install musl-tools)"
    fi
    pkg=$(unpack musl)
    # Debian's musl: /lib/ld-musl-x86_64.so.1 -> x86_64-linux-musl/libc.so (one
    # file is both the loader and the libc). Keep the same layout.
    loader=lib/ld-musl-x86_64.so.1
    libc=lib/x86_64-linux-musl/libc.so
    [ -f "$pkg/$libc" ] || die "Debian's musl package has no /$libc"
    install -D -m 0755 "$pkg/$libc" "$ctx/rootfs/$libc"
    ln -sfn x86_64-linux-musl/libc.so "$ctx/rootfs/$loader"
    install_busybox "$ctx/rootfs"
    mkdir -p "$ctx/rootfs/usr/bin" "$ctx/rootfs/etc"
    musl-gcc -O2 -o "$ctx/rootfs/usr/bin/musl-hello" images/test-musl/musl-hello.c \
        || die "musl-gcc could not compile images/test-musl/musl-hello.c"
    printf '%s\n' 'NAME="box test musl"' 'ID=box-test-musl' \
        'PRETTY_NAME="box test fixture: musl libc, no glibc"' >"$ctx/rootfs/etc/os-release"
    build "$image" images/test-musl/Dockerfile "$ctx"
}

build_big() {
    local image=box-test-big:latest ctx=$STAGE/big
    if have_image "$image"; then
        say "$image exists, skipping"
        return
    fi
    docker image inspect box-base:bookworm >/dev/null 2>&1 \
        || die "$image is built on box-base:bookworm, which is missing: run scripts/images.sh first"
    mkdir -p "$ctx"
    head -c 100M /dev/urandom >"$ctx/random"
    build "$image" images/test-big/Dockerfile "$ctx"
}

build_tools() {
    local image=box-test-tools:latest
    if have_image "$image"; then
        say "$image exists, skipping"
        return
    fi
    docker image inspect box-base:bookworm >/dev/null 2>&1 \
        || die "$image is built on box-base:bookworm, which is missing: run scripts/images.sh first"
    mkdir -p "$STAGE/tools"
    build "$image" images/test-tools/Dockerfile "$STAGE/tools"
}

build_scratch
build_musl
build_big
build_tools
say "ready: box-test-scratch:latest box-test-musl:latest box-test-big:latest box-test-tools:latest"
