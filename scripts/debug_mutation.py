"""Debug one mutation of a deployed function: a thin script over `eventing debug`.

    python scripts/debug_mutation.py fn_email --key customer::0001 --trace
    python scripts/debug_mutation.py fn_email --vb 17 --pdb
    python scripts/debug_mutation.py fn_email --wait 30 --json

The mutation is never consumed: the worker that owns its vBucket still handles it in its place.
Every option of `eventing debug` is accepted (`eventing debug --help`).
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _use_project_venv() -> None:
    """Run under the project's .venv (scripts/setup.sh makes it) when this Python lacks its dependencies,
    so the script works without activating the venv first."""
    try:
        import msgpack  # noqa: F401 - one of the project's dependencies
    except ImportError:
        venv = os.path.join(ROOT, ".venv")
        python = os.path.join(venv, "bin", "python")
        if os.path.exists(python) and os.path.realpath(sys.prefix) != os.path.realpath(venv):
            os.execv(python, [python, os.path.abspath(__file__), *sys.argv[1:]])
        sys.exit(
            f"error: the project's dependencies are not installed for {sys.executable}; run "
            "scripts/setup.sh first (it creates .venv), or run this script with .venv/bin/python"
        )


_use_project_venv()

from eventing.cli import main as eventing_main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if args else 2
    return eventing_main(["debug", *args])


if __name__ == "__main__":
    sys.exit(main())
