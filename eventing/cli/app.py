"""The `eventing` command's parser and entry point; each command group lives in its own module.

Every subcommand takes --store (a data directory or a postgresql:// URL; default $EVENTING_STORE, else
$EVENTING_DATA_DIR or ./.eventing), --data-dir as its older name, and, where it prints data, --json. User
mistakes print `error: ...` naming the thing and the fix, and exit 2; under --json the error is one JSON
object on stderr, `{"error": "...", "exit": 2}`. Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import logging
import sys

from eventing import __version__
from eventing.cli.common import DEFAULT_DATA_DIR, EXIT_INTERRUPTED, EXIT_USAGE
from eventing.errors import EventingError, InvalidKeyError

# Modules with a `register(sub, add)` function that adds their subcommands, in the order --help lists them.
# Every command builds the whole parser, so these modules import the engine, Ray, Spark and the web stack
# inside the commands that use them, not at the top (tests/unit/test_cli.py checks it).
COMMAND_MODULES: list[str] = [
    "eventing.cli.buckets",
    "eventing.cli.collections",
    "eventing.cli.functions",
    "eventing.cli.run",
    "eventing.cli.ray_cmd",
    "eventing.cli.checkpoints",
    "eventing.cli.backup",
    "eventing.cli.demo",
    "eventing.cli.nodes",
    "eventing.cli.dlq",
    "eventing.cli.debug",
    "eventing.cli.applog",
    "eventing.cli.verify",
    "eventing.cli.windows",
    "eventing.cli.serve",
    "eventing.cli.users",
    "eventing.cli.store",
]


@functools.cache  # built once per process: tests and the console call main() many times
def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--store",
        default=argparse.SUPPRESS,
        metavar="LOCATION",
        help="where buckets and metadata live: a data directory, or a PostgreSQL URL "
        "(postgresql://user@host:5432/db; docs/postgresql.md); default $EVENTING_STORE, else "
        f"$EVENTING_DATA_DIR or ./{DEFAULT_DATA_DIR}",
    )
    common.add_argument(
        "--data-dir",
        default=argparse.SUPPRESS,
        metavar="DIR",
        help="a data directory as the store (the same as --store DIR)",
    )
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output"
    )

    parser = argparse.ArgumentParser(
        prog="eventing",
        description="Couchbase-Eventing-style mutation processing: deploy Python handlers on Ray workers "
        "that own vBuckets, keep per-document order and checkpoint their progress.",
        epilog="Quick start: eventing demo   |   Typical flow: eventing bucket create customers; "
        "eventing bucket load customers; eventing deploy functions/fn_email.json; eventing run "
        "--until-caught-up",
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"eventing {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, func, help_text: str, parent=sub) -> argparse.ArgumentParser:
        p = parent.add_parser(name, help=help_text, description=help_text, parents=[common])
        p.set_defaults(func=func)
        return p

    # Commands that live in their own modules register themselves here: register(sub, add).
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(sub, add)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    words = sys.argv[1:] if argv is None else argv
    if argv is None and any("://" in word for word in words):
        from eventing.cli.process_title import hide_passwords

        hide_passwords()  # a password in --store: out of what `ps` shows from now on
    if "--version" in words and "--json" in words:
        # argparse's version action prints text as soon as it meets --version, before --json is known.
        print(json.dumps({"version": __version__}))
        return 0
    parser = build_parser()
    args = parser.parse_args(argv)
    # --store, --data-dir and --json may come before or after the subcommand; absent means default.
    args.data_dir = getattr(args, "data_dir", None)
    args.store = getattr(args, "store", None)
    args.json = getattr(args, "json", False)
    if args.store and args.data_dir and args.store != args.data_dir:
        return _fail(args, "give --store or --data-dir, not both", EXIT_USAGE)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return _run(args)
    except (EventingError, InvalidKeyError) as exc:
        return _fail(args, str(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        return _fail(args, "interrupted", EXIT_INTERRUPTED)
    except BrokenPipeError:
        return 0


def _run(args: argparse.Namespace) -> int:
    """The command, and the state it opened closed after it."""
    try:
        return int(args.func(args))
    finally:
        state = getattr(args, "_state", None)
        if state is not None:
            args._state = None
            state.close()


def _fail(args: argparse.Namespace, message: str, status: int) -> int:
    """An error line on stderr: `error: ...`, or under --json one JSON object, {"error": "...", "exit": N}."""
    if args.json:
        print(json.dumps({"error": message, "exit": status}), file=sys.stderr)
    else:
        print(f"error: {message}" if status != EXIT_INTERRUPTED else message, file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
