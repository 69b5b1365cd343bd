#!/usr/bin/env bash
# One command for a new user: set up ./.venv, then run the main job on embedded defaults
# (local buckets under ./.eventing, a local Ray instance). Extra arguments go to `eventing demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
exec .venv/bin/eventing demo "$@"
