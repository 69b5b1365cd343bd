#!/usr/bin/env bash
# The long fault-injection variants (pytest marker `soak`): repeated metadata-store locks under load,
# repeated 10x bursts with worker memory watched across them, one document mutated 5,000 times, service and
# worker RSS over 1M and 10M mutations, 400 random lifecycle sequences checked against the lifecycle model.
# Minutes rather than seconds, so scripts/test.sh leaves them out. Figures are printed (-s) and kept
# as JSON under $EVENTING_FAULT_FIGURES (see scripts/fault_report.py). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
export RAY_USAGE_STATS_ENABLED=0
exec .venv/bin/python -m pytest -m soak -s -q tests/integration/test_faults.py tests/integration/test_ray_runtime.py \
    tests/integration/test_memory_soak.py tests/unit/test_lifecycle_property.py "$@"
