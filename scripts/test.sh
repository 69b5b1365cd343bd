#!/usr/bin/env bash
# One command: set up ./.venv, lint (ruff) and type-check (mypy) the packages, and run the whole quick
# suite (unit + integration with real Ray, real PySpark and real SQLite). Long soak variants are marked
# `soak` and run by scripts/soak.sh. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== ruff"
.venv/bin/ruff check --output-format concise .
.venv/bin/ruff format --check --quiet . || { echo "run: .venv/bin/ruff format ." >&2; exit 1; }
if [ $# -ne 0 ]; then
  echo "== mypy"
  .venv/bin/mypy
fi
# The tests start thousands of Python processes (commands, workers, the docs pages' copies of the checkout):
# they keep what they compile (__pycache__), even where PYTHONDONTWRITEBYTECODE is set as on the CI machine,
# where compiling the same modules again made the docs pages ~30% slower.
unset PYTHONDONTWRITEBYTECODE
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
export RAY_USAGE_STATS_ENABLED=0
echo "== pytest"
# The unit tests share nothing but the machine: they run on four processes (pytest-xdist) on two cores,
# as most of their time is spent waiting on a subprocess, a server, a socket or a thread (167 s of tests
# took 76 s of their processes' CPU). Idle machine, compiled modules kept: 60-64 s on three, 56-60 s on four.
# The integration tests then run on two, each with its own Ray instance and Spark session (three were no
# faster, and the load they make brought out races). A module's tests stay on
# one process (its clusters are started once per module), the docs pages are spread one by one
# (tests/conftest.py). Arguments given are passed to a single pytest run.
#
# The unit tests' temporary files (their data directories) live in memory, under /dev/shm where it is
# writable: they check what the code does, not that SQLite's fsyncs reach the disk, and waiting on those
# fsyncs was a tenth of their time.
#
# On a fresh clone every test process would compile the packages and rewrite the test modules' asserts for
# itself (~4 s of CPU each): both are done once first, on both cores, and kept in __pycache__.
warm_up() {
  .venv/bin/python -m compileall -q -j 0 eventing functions metadata sharding >/dev/null || true  # the tests say what fails
  local half=() other=() i=0 file
  for file in tests/unit/test_*.py; do
    if (( i++ % 2 )); then half+=("$file"); else other+=("$file"); fi
  done
  .venv/bin/python -m pytest -q --collect-only -p no:cacheprovider "${half[@]}" >/dev/null 2>&1 &
  .venv/bin/python -m pytest -q --collect-only -p no:cacheprovider "${other[@]}" >/dev/null 2>&1 || true
  wait || true
}
unit_tests() {
  local tmp status=0
  warm_up
  if [ -d /dev/shm ] && [ -w /dev/shm ]; then tmp=$(mktemp -d /dev/shm/eventing-unit.XXXXXX); else tmp=$(mktemp -d); fi
  TMPDIR="$tmp" .venv/bin/python -m pytest -q -m "not integration" -n 4 --basetemp="$tmp/pytest" "$@" || status=$?
  rm -rf "$tmp"
  return "$status"
}
if [ $# -eq 0 ]; then
  unit_tests
  # The type check runs beside the integration tests, which leave part of the machine idle; its verdict
  # is printed at the end and fails the run like a failing test.
  mypy_log=$(mktemp)
  .venv/bin/mypy >"$mypy_log" 2>&1 &
  mypy_pid=$!
  status=0
  .venv/bin/python -m pytest -q -m "integration" -n 2 --dist loadscope || status=$?
  echo "== mypy"
  mypy_status=0
  wait "$mypy_pid" || mypy_status=$?
  cat "$mypy_log"
  rm -f "$mypy_log"
  if [ "$status" -eq 0 ]; then status=$mypy_status; fi
  exit "$status"
fi
if [ "$*" = "-m not integration" ]; then
  unit_tests
  exit
fi
exec .venv/bin/python -m pytest -q "$@"
