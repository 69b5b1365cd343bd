#!/usr/bin/env bash
# Creates ./.venv (if missing) and installs the project with its test extras. Idempotent and quiet: pip's
# output (setuptools' notes on editable installs included) goes to .venv/pip-install.log and is shown only
# when the installation fails. Nothing is reinstalled while pyproject.toml is unchanged. Packages are
# byte-compiled as they are installed (pip's default, ~15 s of a fresh install): where PYTHONDONTWRITEBYTECODE
# is set, as on this project's CI machine, nothing compiled at import would be kept, and every process would
# compile Ray again (a whole suite without it took 13.7 min instead of ~10).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
# The console's browser test drives Debian's chromium; install it (quietly) only when missing and root.
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } >/dev/null 2>&1 \
    || echo "warning: could not install chromium; the console's browser test will be skipped" >&2
fi
# The PostgreSQL store's and mirrors' tests start throwaway servers from Debian's postgresql package.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; } >/dev/null 2>&1 \
      || echo "warning: could not install postgresql; install it (apt-get install -y postgresql) for its tests" >&2
  else
    echo "note: PostgreSQL's server is not installed; its tests need it: sudo apt-get install -y postgresql" >&2
  fi
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
LOG=.venv/pip-install.log
STAMP=.venv/.eventing-installed
WANTED="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$WANTED" ] \
  || ! .venv/bin/python -c "import eventing, ray, pyspark, msgpack, faker, pytest, psycopg, psycopg_pool" 2>/dev/null; then
  if ! { .venv/bin/python -m pip install --quiet --upgrade pip \
         && .venv/bin/python -m pip install --quiet -e ".[test]"; } >"$LOG" 2>&1; then
    tail -n 30 "$LOG" >&2
    echo "error: installing the project failed; the full pip output is in $LOG" >&2
    exit 1
  fi
  echo "$WANTED" >"$STAMP"
fi
# The project's own modules compiled ahead: where PYTHONDONTWRITEBYTECODE is set, Python keeps nothing it
# compiles at import, so every `eventing` command and worker would compile them again (~80 ms a command).
.venv/bin/python -m compileall -q eventing metadata sharding functions >/dev/null
.venv/bin/python -c "import eventing, ray, pyspark, msgpack, faker, pytest" \
  || { echo "error: installation incomplete; see $LOG" >&2; exit 1; }
