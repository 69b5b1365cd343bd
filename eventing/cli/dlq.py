"""`eventing dlq list|show|replay|purge FN`: the dead-letter queue from the command line (see
eventing.ops.dlq)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from eventing.cli.common import existing_state, store_int
from eventing.cli.output import emit_json, progress_enabled, table
from eventing.core.wording import counted

if TYPE_CHECKING:
    from eventing.ops import dlq

EXIT_INTERRUPTED = 130


def _selector(args: argparse.Namespace) -> dlq.DlqSelector:
    from eventing.ops import dlq

    return dlq.DlqSelector(
        vb=getattr(args, "vb", None),
        seqno=getattr(args, "seqno", None),
        key=getattr(args, "key", None),
        reason=getattr(args, "reason", None),
        everything=getattr(args, "all", False),
    )


def cmd_list(args: argparse.Namespace) -> int:
    from eventing.ops import dlq

    rows = dlq.list_rows(
        existing_state(args), args.function, reason=args.reason, limit=args.limit, include_replayed=args.all
    )
    if args.json:
        emit_json([dlq.row_view(r) for r in rows])
        return 0
    if not rows:
        which = f" with reason '{args.reason}'" if args.reason else ""
        hidden = "" if args.all else " (replayed rows are hidden; --all shows them)"
        print(f"function '{args.function}' has no dead letters{which}{hidden}")
        return 0
    print(
        table(
            ["vb", "seqno", "key", "reason", "attempts", "last failed", "replayed", "error"],
            [
                [
                    r.vb,
                    r.seqno,
                    r.key,
                    r.reason,
                    r.attempts,
                    dlq.row_view(r)["last_failed_at"],
                    "yes" if r.replayed_at else "",
                    _short(r.error),
                ]
                for r in rows
            ],
        )
    )
    more = f"; --limit {args.limit} reached" if args.limit and len(rows) == args.limit else ""
    hidden = "" if args.all else "; replayed rows are hidden (--all shows them)"
    print(
        f"{counted(len(rows), 'row')}{more}{hidden}. "
        f"`eventing dlq show {args.function} --vb N --seqno S` shows one"
    )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from eventing.ops import dlq

    rows = dlq.show_rows(existing_state(args), args.function, _selector(args))
    views = [dlq.row_view(r, full=True) for r in rows]
    if args.json:
        emit_json(views)
        return 0
    for i, view in enumerate(views):
        if i:
            print()
        print(
            f"dead letter of {args.function}: vBucket {view['vb']} seqno {view['seqno']} key '{view['key']}'"
        )
        for name in ("reason", "error", "attempts", "first_failed_at", "last_failed_at", "replayed_at"):
            print(f"  {name:>15}: {view[name] if view[name] is not None else '-'}")
        mutation = view["mutation"]
        print(f"  {'mutation':>15}: " + ", ".join(f"{k}={v}" for k, v in mutation.items() if k != "doc"))
        if "doc" in mutation:
            print(f"  {'doc':>15}: {mutation['doc']}")
        if view["traceback"]:
            print("  traceback:")
            print("    " + view["traceback"].rstrip().replace("\n", "\n    "))
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from eventing.ops import dlq

    done: list[dlq.RowResult] = []
    bar = tqdm(unit="row", desc=f"replay {args.function}", disable=args.json or not progress_enabled())

    def on_row(result: dlq.RowResult) -> None:
        done.append(result)
        bar.update(1)

    try:
        report = dlq.replay(existing_state(args), args.function, _selector(args), on_row=on_row)
    except KeyboardInterrupt:
        bar.close()
        replayed = sum(1 for r in done if r.outcome == "replayed")
        print(
            f"interrupted: {counted(replayed, 'row')} of '{args.function}' "
            f"{'was' if replayed == 1 else 'were'} "
            "replayed and marked; the row in progress "
            "was not marked. Run the same replay again to continue: rows already applied are not applied "
            "again",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    bar.close()
    if args.json:
        emit_json(report.to_dict())
    else:
        if not report.selected:
            print(f"no dead letters of '{args.function}' to replay (replayed rows are never replayed again)")
            return 0
        for r in report.rows:
            if r.outcome not in ("replayed", "not replayable"):
                print(
                    f"  still failing: vBucket {r.vb} seqno {r.seqno} '{r.key}': {r.outcome}: "
                    f"{_short(r.error, 100)}"
                )
        skipped = (
            f", {report.writes_skipped} already applied by an interrupted replay"
            if report.writes_skipped
            else ""
        )
        print(
            f"replayed {report.replayed} of {counted(report.selected, 'dead letter')} of '{args.function}' "
            f"({counted(report.writes_applied, 'write')} applied{skipped}); {report.failed} still failing"
            + (
                f", {report.not_replayable} not replayable (not handler work)"
                if report.not_replayable
                else ""
            )
        )
        if report.failed:
            print(
                f"rows still failing stay in the queue; see `eventing dlq show {args.function} --vb N "
                "--seqno S`"
            )
    return 1 if report.failed else 0


def cmd_purge(args: argparse.Namespace) -> int:
    from eventing.ops import dlq

    removed = dlq.purge(existing_state(args), args.function, _selector(args), replayed_only=args.replayed)
    if args.json:
        emit_json({"function": args.function, "purged": removed})
    else:
        print(f"purged {counted(removed, 'dead letter')} of '{args.function}'")
    return 0


def _short(text: str, width: int = 60) -> str:
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def _add_selectors(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vb", type=store_int, help="rows of this vBucket")
    p.add_argument("--seqno", type=store_int, help="with --vb: the row of this seqno")
    p.add_argument("--key", help="rows of this document key")


def register(sub, add) -> None:
    """Add `eventing dlq list|show|replay|purge` to the `eventing` parser."""
    group = sub.add_parser(
        "dlq",
        help="dead-letter queue: list, show, replay (with the current handler) and purge failed mutations",
        description="Mutations a function's handler could not process (error, timeout, undecodable, "
        "oversize). Replay re-runs the current stored handler on them and applies each row exactly once.",
    )
    dsub = group.add_subparsers(dest="dlq_command", metavar="ACTION", required=True)

    p = add(
        "list", cmd_list, "list dead letters in (vBucket, seqno) order; replayed ones only with --all", dsub
    )
    p.add_argument("function")
    p.add_argument("--reason", help="only rows with this reason: error, timeout, undecodable, oversize, ...")
    p.add_argument("--limit", type=store_int, help="at most this many rows")
    p.add_argument("--all", action="store_true", help="include rows already replayed")

    p = add(
        "show",
        cmd_show,
        "one dead letter in full: error, traceback and the mutation (--vb and --seqno, or --key)",
        dsub,
    )
    p.add_argument("function")
    _add_selectors(p)

    p = add(
        "replay",
        cmd_replay,
        "re-run the function's current stored handler on dead letters, in per-document "
        "order, applying each row exactly once (safe to interrupt and run again)",
        dsub,
    )
    p.add_argument("function")
    _add_selectors(p)
    p.add_argument("--reason", help="only rows with this reason")
    p.add_argument("--all", action="store_true", help="every row not yet replayed")

    p = add(
        "purge",
        cmd_purge,
        "delete dead letters without asking: --all, --replayed or a selector; prints how many were removed",
        dsub,
    )
    p.add_argument("function")
    _add_selectors(p)
    p.add_argument("--reason", help="only rows with this reason")
    p.add_argument("--replayed", action="store_true", help="only rows already replayed")
    p.add_argument("--all", action="store_true", help="every row, replayed or not")
