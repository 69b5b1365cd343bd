"""`eventing checkpoints FN` (the per-vBucket view of a function) and `eventing rewind FN` (move its
checkpoints back so a paused function handles a range of mutations again; see eventing.ops.rewind)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from eventing.cli.common import existing_state, non_negative_int
from eventing.cli.output import emit_json, table
from eventing.core.wording import counted


def _when(epoch_s: float | None) -> str:
    if not epoch_s:
        return "-"
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cmd_checkpoints(args: argparse.Namespace) -> int:
    from eventing.ops.stats import checkpoint_view

    data = checkpoint_view(existing_state(args), args.function, vb=args.vb, backlog_only=args.backlog_only)
    if args.json:
        emit_json(data)
        return 0
    owners = ", ".join(data["owners"]) or "none yet"
    print(
        f"{data['function']} ({data['state']}), source '{data['source_bucket']}': {data['vbuckets']} "
        f"vBuckets, backlog {data['backlog']:,} in {data['vbuckets_with_backlog']} vBuckets, "
        f"{data['leased']} leased; owners: {owners}"
    )
    if not data["source_identity_matches"]:
        print(
            "  the source bucket was recreated or flushed since the deployment: these checkpoints will not "
            "resume on it; undeploy and deploy the function again"
        )
    if not data["rows"]:
        print("  no vBucket matches" + (" (no backlog anywhere)" if args.backlog_only else ""))
        return 0
    print(
        table(
            ["vb", "checkpoint", "high seqno", "backlog", "owner", "epoch", "leased", "updated (UTC)"],
            [
                [
                    r["vb"],
                    r["checkpoint"],
                    r["high_seqno"],
                    r["backlog"],
                    r["owner"],
                    _epoch(r["epoch"]),
                    "yes" if r["leased"] else "no",
                    _when(r["updated_at"]),
                ]
                for r in data["rows"]
            ],
        )
    )
    return 0


def _epoch(epoch: int) -> str:
    """Epochs start at generation << 32 (eventing.control.lifecycle.EPOCH_SHIFT): show both halves."""
    return f"{epoch >> 32}:{epoch & 0xFFFFFFFF}"


def cmd_rewind(args: argparse.Namespace) -> int:
    from eventing.ops.rewind import rewind

    result = rewind(
        existing_state(args),
        args.function,
        to_seqno=args.to_seqno,
        to_time=args.to_time,
        vb=args.vb,
        reapply_effects=args.reapply_effects,
    )
    if args.json:
        emit_json(result.to_dict())
        return 0
    name = result.function
    lowered = {b: n for b, n in result.effect_marks_lowered.items() if n}
    if not result.moves and not lowered:
        print(
            f"nothing to rewind: every checkpoint of '{name}' in scope is already at or before "
            f"{result.target}"
        )
        return 0
    if result.moves:
        print(
            f"rewound '{name}' to {result.target}: {counted(len(result.moves), 'vBucket')} moved back; "
            f"{counted(result.mutations_again, 'mutation')} will be handled again after "
            f"`eventing resume {name}`"
        )
    else:
        print(f"the checkpoints of '{name}' in scope are already at or before {result.target}; none moved")
    if result.reapply_effects:
        shown = (
            ", ".join(f"{b} ({counted(n, 'vBucket')})" for b, n in lowered.items())
            or "none was above the checkpoints"
        )
        print(
            f"effects: REAPPLIED. The effect marks were lowered ({shown}), so every binding write of the "
            "rewound range applies again, a second time where it had applied; `eventing verify` will report "
            "those as duplicates"
        )
    else:
        print(
            "effects: kept. The handlers run again on the rewound range, but binding writes they already "
            "applied are skipped by the effect marks (exactly once still holds; `eventing verify` still "
            "passes); output outside bindings (print, log, calls to other systems) happens again. Pass "
            "--reapply-effects to apply the binding writes again"
        )
    return 0


def register(sub: Any, add: Any) -> None:
    p = add(
        "checkpoints",
        cmd_checkpoints,
        "per vBucket of a function: checkpoint, high seqno, backlog, owner and epoch "
        "(deployment:claim), lease, last update",
    )
    p.add_argument("function")
    p.add_argument("--vb", type=non_negative_int, help="only this vBucket")
    p.add_argument(
        "--backlog-only", action="store_true", help="only vBuckets with mutations not yet checkpointed"
    )
    p = add(
        "rewind",
        cmd_rewind,
        "move a paused function's checkpoints back to a seqno or a point in time, so resuming handles those "
        "mutations again; binding writes already applied are skipped unless --reapply-effects",
    )
    p.add_argument("function")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--to-seqno",
        type=non_negative_int,
        metavar="N",
        help="rewind every vBucket (or --vb) to seqno N; 0 handles everything again",
    )
    target.add_argument(
        "--to-time",
        metavar="TIME",
        help="rewind to the last seqno written before TIME: ISO 8601 (UTC without a zone) or "
        "epoch seconds (milliseconds when 13 digits)",
    )
    p.add_argument("--vb", type=non_negative_int, help="only this vBucket")
    p.add_argument(
        "--reapply-effects",
        action="store_true",
        help="lower the effect marks too, so binding writes of the rewound range apply again",
    )
