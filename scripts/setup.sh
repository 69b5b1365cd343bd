#!/usr/bin/env bash
# Creates ./.venv (if missing) and installs the project with its test extras. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
# The console's browser test drives Debian's chromium; install it (quietly) only when missing and root.
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } >/dev/null 2>&1 \
    || echo "warning: could not install chromium; the console's browser test will be skipped" >&2
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install --quiet -e ".[test]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import eventing, ray, pyspark, msgpack, faker, pytest" \
  || { echo "error: installation incomplete; see the pip output above" >&2; exit 1; }
