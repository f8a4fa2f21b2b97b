#!/usr/bin/env bash
# Run one command in a CI job through box: an MCP session with `box serve`
# (stdio) driven by the Python `mcp` SDK, as an agent would (docs/deploy.md).
#
#   scripts/ci-session.sh [--profile ci] [--workspace DIR] [--envelope FILE] [--live] -- COMMAND [ARG...]
#
# The command runs in the session's workspace unit (the checkout, read-write,
# no network under the `ci` profile); its output is printed and its exit
# status is this script's (124: timed out, 125: box or the session failed).
#   BOX         the box binary (default: `box` on PATH)
#   BOX_PYTHON  a Python with the `mcp` SDK 2.x (default: this repository's
#               .venv/bin/python when it exists, else python3);
#               install it with: python3 -m venv .venv && .venv/bin/pip install 'mcp>=2,<3'
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

case "${1:-}" in
    -h | --help)
        sed -n '2,15s/^# \{0,1\}//p' "$0"
        exit 0
        ;;
esac

box=${BOX:-$(command -v box || true)}
if [ -z "$box" ] || [ ! -x "$box" ]; then
    echo "ci-session: no box binary: put box on PATH or set BOX=/path/to/box" >&2
    exit 125
fi
python=${BOX_PYTHON:-}
if [ -z "$python" ]; then
    if [ -x "$here/.venv/bin/python" ]; then python=$here/.venv/bin/python; else python=python3; fi
fi
"$python" -c 'import mcp.client.client' 2>/dev/null || {
    echo "ci-session: $python has no mcp SDK 2.x: python3 -m venv .venv && .venv/bin/pip install 'mcp>=2,<3', then BOX_PYTHON=.venv/bin/python" >&2
    exit 125
}
exec "$python" "$here/tests/e2e/ci_session.py" "$box" "$@"
