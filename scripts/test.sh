#!/usr/bin/env bash
# The test command (README): installs what the tests need, then runs them all.
# - the Python `mcp` SDK, a real and independent MCP client, in .venv, and opentelemetry-proto
#   (the OTLP definitions the tracing test's receiver decodes with)
# - the unit images, when a Docker engine answers (scripts/images.sh skips what exists)
# - the test fixture images (scripts/test-images.sh, the same)
# - docker-registry and gVisor's runsc, registered with the engine (scripts/registry.sh, runsc.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! .venv/bin/python -c 'import mcp' 2>/dev/null; then
    echo "test.sh: installing the Python mcp SDK into .venv" >&2
    python3 -m venv .venv
    .venv/bin/pip install --quiet --disable-pip-version-check 'mcp>=2,<3'
fi
# The tracing test's OTLP receiver decodes with the official definitions.
if ! .venv/bin/python -c 'import opentelemetry.proto' 2>/dev/null; then
    echo "test.sh: installing opentelemetry-proto into .venv" >&2
    .venv/bin/pip install --quiet --disable-pip-version-check 'opentelemetry-proto>=1.20,<2'
fi
export BOX_TEST_PYTHON="$PWD/.venv/bin/python"

if [ -x scripts/images.sh ]; then
    scripts/images.sh
fi
# The `fetch` example profile's server image (its end-to-end test runs it).
if [ -x images/fetch/build.sh ] && docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
    images/fetch/build.sh
fi
# Test fixtures (images/README.md, "Test images"): any OCI image as a unit, pulls.
if [ -x scripts/test-images.sh ]; then
    scripts/test-images.sh
fi
# A local registry (installed here, started by the tests: scripts/registry.sh
# start) and gVisor registered as the engine's runtime `runsc`. The tests that
# need them say so, and fail under CI, when they are missing.
if docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
    scripts/registry.sh install \
        || echo "test.sh: NOTE: no docker-registry; the registry tests cannot run" >&2
    scripts/runsc.sh \
        || echo "test.sh: NOTE: runsc not registered; the gVisor tests cannot run" >&2
fi

if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --no-fail-fast "$@"
else
    cargo test --workspace --no-fail-fast "$@"
fi
