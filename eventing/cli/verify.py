"""`eventing verify FN [--ledger BUCKET|KEYSPACE] [--json]`: the ledger check of eventing.ops.verify as a
command."""

from __future__ import annotations

import argparse

from eventing.cli.output import emit_json

EXIT_OK = 0
EXIT_NOT_ACCOUNTED = 1


def cmd_verify(args: argparse.Namespace) -> int:
    from eventing.cli.common import existing_state
    from eventing.ops.verify import verify_function

    report = verify_function(existing_state(args), args.function, ledger=args.ledger)
    if args.json:
        emit_json(report.to_dict())
    else:
        print(report.summary())
    return EXIT_OK if report.ok else EXIT_NOT_ACCOUNTED


def register(sub, add) -> None:
    p = add(
        "verify",
        cmd_verify,
        "check a function against its ledger bucket: every mutation up to its checkpoints handled, "
        "dead-lettered or filtered; no effect twice; each document in seqno order; no checkpoint moved "
        "backwards (exit 0: all accounted for, 1: not)",
    )
    p.add_argument("function")
    p.add_argument(
        "--ledger",
        metavar="BUCKET",
        help="the ledger bucket, or a keyspace BUCKET.SCOPE.COLLECTION (default: the keyspace of the "
        "function's 'ledger' binding)",
    )
