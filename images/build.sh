#!/usr/bin/env bash
# Build box's unit images offline: nothing is pulled from a container registry.
# `box image build` runs this same file (embedded in the binary); `--help` says how.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: build.sh [--mirror URL] [--suite NAME] [--keyring FILE] [--no-check-gpg] [--force]

Builds box's unit images from a Debian package mirror, on any Debian or Ubuntu
host with a Docker engine (needs root for debootstrap):

  box-rootfs:SUITE  debootstrap --variant=minbase SUITE from MIRROR
                    (bash, git, ca-certificates, procps, iproute2), docker import
  box-base:SUITE    base/Dockerfile on top of it: non-root user 1000 `box`,
                    /workspace; the image box's shipped profiles name
                    (box-base:bookworm)

Images that already exist are skipped (`docker image inspect`).

Options (each also read from the environment variable named after it):
  --mirror URL       Debian mirror [BOX_IMAGE_MIRROR]; default: the Debian mirror
                     in this host's apt sources when the host is Debian, else
                     http://deb.debian.org/debian (an Ubuntu archive serves no
                     Debian suite)
  --suite NAME       Debian suite [BOX_IMAGE_SUITE]; default: bookworm. The
                     images are tagged with it.
  --keyring FILE     keyring the mirror's Release file is checked against
                     [BOX_IMAGE_KEYRING]; default:
                     /usr/share/keyrings/debian-archive-keyring.gpg, from the
                     debian-archive-keyring package (installed with apt-get when
                     missing: Ubuntu has it too)
  --no-check-gpg     do not check the mirror's signature [BOX_IMAGE_NO_CHECK_GPG=1];
                     only for a mirror you trust by other means
  --force            rebuild the images even if they exist
  -h, --help         this text

Examples:
  build.sh
  build.sh --mirror http://ftp.de.debian.org/debian --suite bookworm
  BOX_IMAGE_MIRROR=http://mirror.internal/debian box image build
EOF
}

PACKAGES=bash,git,ca-certificates,procps,iproute2
DEFAULT_MIRROR=http://deb.debian.org/debian
DEFAULT_KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

say() { echo "images: $*" >&2; }
die() {
    echo "images: error: $*" >&2
    exit 1
}

# The Debian mirror in this host's apt sources (deb822 "URIs:" or one-line
# "deb URL"), skipping the security archive; empty when there is none.
apt_debian_mirror() {
    local files=(/etc/apt/sources.list /etc/apt/sources.list.d/*)
    {
        grep -hs -E '^[[:space:]]*URIs:' "${files[@]}" 2>/dev/null | awk '{for (i = 2; i <= NF; i++) print $i}'
        grep -hs -E '^[[:space:]]*deb[[:space:]]' "${files[@]}" 2>/dev/null \
            | sed -E 's/^[[:space:]]*deb[[:space:]]+(\[[^]]*\][[:space:]]+)?//' | awk '{print $1}'
    } | grep -E '^(https?|file)://' | grep -v -E -- '-security/?$' | head -n1 || true
}

# The default mirror: the host's own Debian mirror on a Debian host (so a
# machine behind a local mirror keeps using it), else Debian's CDN. An Ubuntu
# or other derivative's apt sources name its own archive, which has no Debian
# suite, so they are never used.
default_mirror() {
    local os_release=${1:-/etc/os-release} id="" uri=""
    # shellcheck disable=SC1090
    [ -r "$os_release" ] && id=$(. "$os_release" && echo "${ID:-}")
    if [ "$id" = debian ]; then
        uri=$(apt_debian_mirror)
    fi
    echo "${uri:-$DEFAULT_MIRROR}"
}

have_image() {
    [ "$FORCE" = 0 ] && docker image inspect "$1" >/dev/null 2>&1
}

apt_install() {
    say "installing $* (apt-get)"
    if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"; } >&2; then
        die "could not install $* with apt-get; install it by hand and run again"
    fi
}

# debootstrap's script for the suite; every Debian suite since buster uses the
# same one (sid), so an older debootstrap (an Ubuntu LTS's) can build a newer
# Debian suite it does not know by name.
suite_script() {
    local scripts=/usr/share/debootstrap/scripts
    if [ -e "$scripts/$SUITE" ]; then
        return
    fi
    [ -e "$scripts/sid" ] || die "debootstrap has no script for $SUITE nor sid in $scripts"
    say "debootstrap does not know $SUITE by name; using its sid script (every Debian suite since buster shares it)"
    echo "$scripts/sid"
}

build_rootfs() {
    if have_image "$ROOTFS_IMAGE"; then
        say "$ROOTFS_IMAGE exists, skipping"
        return
    fi
    [ "$(id -u)" = 0 ] || die "debootstrap needs root: run as root (sudo) to build $ROOTFS_IMAGE"
    command -v debootstrap >/dev/null 2>&1 || apt_install debootstrap
    local check=()
    if [ "$NO_CHECK_GPG" = 1 ]; then
        say "WARNING: --no-check-gpg: the packages from $MIRROR are NOT verified; anyone between this host and the mirror can change what goes into $ROOTFS_IMAGE"
        check=(--no-check-gpg)
    else
        if [ ! -e "$KEYRING" ]; then
            [ "$KEYRING" = "$DEFAULT_KEYRING" ] || die "keyring $KEYRING does not exist"
            apt_install debian-archive-keyring
            [ -e "$KEYRING" ] || die "debian-archive-keyring did not provide $KEYRING; name one with --keyring FILE"
        fi
        check=(--keyring="$KEYRING")
    fi
    local dir script
    script=$(suite_script)
    dir=$(mktemp -d /tmp/box-rootfs.XXXXXX)
    # shellcheck disable=SC2064
    trap "rm -rf '$dir'" EXIT
    say "debootstrap --variant=minbase $SUITE from $MIRROR into $dir (a minute or two)"
    # shellcheck disable=SC2086 # $script is empty or one path
    if ! debootstrap --variant=minbase --include="$PACKAGES" "${check[@]}" \
        "$SUITE" "$dir" "$MIRROR" $script >&2; then
        if [ -e "$dir/debootstrap/debootstrap.log" ]; then
            say "the end of debootstrap's log:"
            tail -n 20 "$dir/debootstrap/debootstrap.log" >&2
        fi
        die "debootstrap of $SUITE from $MIRROR failed; choose another with --mirror URL / --suite NAME"
    fi
    # Caches and logs are not part of the image.
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/* \
        "$dir"/var/log/* "$dir"/tmp/* "$dir"/debootstrap
    say "importing $dir as $ROOTFS_IMAGE"
    tar -C "$dir" --numeric-owner -c . \
        | docker import --change 'CMD ["/bin/bash"]' \
            --message "box rootfs: debootstrap minbase $SUITE from $MIRROR" - "$ROOTFS_IMAGE" >&2
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
    DOCKER_BUILDKIT=0 docker build --quiet --build-arg "SUITE=$SUITE" --tag "$BASE_IMAGE" base >&2
}

main() {
    cd "$(dirname "$0")"
    MIRROR=${BOX_IMAGE_MIRROR:-}
    SUITE=${BOX_IMAGE_SUITE:-bookworm}
    KEYRING=${BOX_IMAGE_KEYRING:-$DEFAULT_KEYRING}
    NO_CHECK_GPG=${BOX_IMAGE_NO_CHECK_GPG:-0}
    FORCE=0
    while [ $# -gt 0 ]; do
        case "$1" in
            --mirror) [ $# -ge 2 ] || die "--mirror needs a URL"; MIRROR=$2; shift 2 ;;
            --mirror=*) MIRROR=${1#*=}; shift ;;
            --suite) [ $# -ge 2 ] || die "--suite needs a name"; SUITE=$2; shift 2 ;;
            --suite=*) SUITE=${1#*=}; shift ;;
            --keyring) [ $# -ge 2 ] || die "--keyring needs a file"; KEYRING=$2; shift 2 ;;
            --keyring=*) KEYRING=${1#*=}; shift ;;
            --no-check-gpg) NO_CHECK_GPG=1; shift ;;
            --force) FORCE=1; shift ;;
            -h | --help) usage; exit 0 ;;
            *) usage >&2; die "unknown argument: $1" ;;
        esac
    done
    case "$NO_CHECK_GPG" in 0 | 1) ;; *) die "BOX_IMAGE_NO_CHECK_GPG must be 0 or 1, not $NO_CHECK_GPG" ;; esac
    [[ "$SUITE" =~ ^[a-z][a-z0-9.-]*$ ]] || die "--suite $SUITE is not a Debian suite name (like bookworm)"
    [ -n "$MIRROR" ] || MIRROR=$(default_mirror /etc/os-release)
    ROOTFS_IMAGE=box-rootfs:$SUITE
    BASE_IMAGE=box-base:$SUITE
    docker version --format '{{.Server.Version}}' >/dev/null 2>&1 \
        || die "no Docker engine answers (docker version); the images are built into one"
    build_rootfs
    build_base
    say "ready: $ROOTFS_IMAGE $BASE_IMAGE"
}

# Sourced (by a test of default_mirror), define the functions only.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main "$@"
fi
