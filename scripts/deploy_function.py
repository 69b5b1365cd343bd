"""Deploy (or pause, resume, undeploy, delete, export, import) a function: a thin script over `eventing`.

python scripts/deploy_function.py functions/fn_email.json            # save + deploy
python scripts/deploy_function.py functions/fn_email.json --boundary from_now
python scripts/deploy_function.py --action pause fn_email
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from eventing.cli import main as eventing_main  # noqa: E402

ACTIONS = ("deploy", "pause", "resume", "undeploy", "delete", "export", "import", "create", "status")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("target", help="definition file (deploy, create, import) or function name")
    parser.add_argument("--action", choices=ACTIONS, default="deploy")
    parser.add_argument("--boundary", choices=["everything", "from_now"])
    parser.add_argument("--data-dir")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    forwarded = [args.action, args.target]
    if args.boundary and args.action == "deploy":
        forwarded += ["--boundary", args.boundary]
    if args.data_dir:
        forwarded += ["--data-dir", args.data_dir]
    if args.json:
        forwarded.append("--json")
    return eventing_main(forwarded)


if __name__ == "__main__":
    sys.exit(main())
