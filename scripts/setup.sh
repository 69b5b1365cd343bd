#!/usr/bin/env bash
# Creates ./.venv (if missing) and installs the project with its test extras. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install --quiet -e ".[test]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import eventing, ray, pyspark, msgpack, faker, pytest" \
  || { echo "error: installation incomplete; see the pip output above" >&2; exit 1; }
