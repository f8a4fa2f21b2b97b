#!/usr/bin/env bash
# The README's one command for a fresh machine: build and install box, build the
# unit images when a Docker engine answers, then run the main job: one command
# in a sandboxed unit (`box run -- uname -a`).
set -euo pipefail
cd "$(dirname "$0")/.."

cargo install --locked --path . --root "${BOX_INSTALL_ROOT:-$HOME/.local}"
bin="${BOX_INSTALL_ROOT:-$HOME/.local}/bin/box"
echo "install.sh: installed $bin" >&2

if [ -x scripts/images.sh ]; then
    scripts/images.sh
fi

if "$bin" run --help >/dev/null 2>&1; then
    "$bin" run -- uname -a
else
    "$bin" --help
fi
