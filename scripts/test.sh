#!/usr/bin/env bash
# The test command (README): installs what the tests need, then runs them all.
# - the Python `mcp` SDK, a real and independent MCP client, in .venv
# - the unit images, when a Docker engine answers (scripts/images.sh skips what exists)
# - the test fixture images (scripts/test-images.sh, the same)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! .venv/bin/python -c 'import mcp' 2>/dev/null; then
    echo "test.sh: installing the Python mcp SDK into .venv" >&2
    python3 -m venv .venv
    .venv/bin/pip install --quiet --disable-pip-version-check 'mcp>=2,<3'
fi
export BOX_TEST_PYTHON="$PWD/.venv/bin/python"

if [ -x scripts/images.sh ]; then
    scripts/images.sh
fi
# Test fixtures (images/README.md, "Test images"): any OCI image as a unit, pulls.
if [ -x scripts/test-images.sh ]; then
    scripts/test-images.sh
fi

if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --no-fail-fast "$@"
else
    cargo test --workspace --no-fail-fast "$@"
fi
