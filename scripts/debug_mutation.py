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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from eventing.cli import main as eventing_main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if args else 2
    return eventing_main(["debug", *args])


if __name__ == "__main__":
    sys.exit(main())
