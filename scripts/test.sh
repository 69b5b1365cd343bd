#!/usr/bin/env bash
# One command: set up ./.venv, then run the whole quick suite (unit + integration with real Ray,
# real PySpark and real SQLite). Long soak variants are marked `soak` and run by scripts/soak.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
export RAY_USAGE_STATS_ENABLED=0
exec .venv/bin/python -m pytest -q "$@"
