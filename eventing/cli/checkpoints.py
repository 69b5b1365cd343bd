"""`eventing checkpoints FN` (the per-vBucket view of a function) and `eventing rewind FN` (move its
checkpoints back so a paused function handles a range of mutations again)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from eventing.cli.common import existing_data_dir, non_negative_int
from eventing.cli.output import emit_json, table
from eventing.ops.stats import checkpoint_view


def _when(epoch_s: float | None) -> str:
    if not epoch_s:
        return "-"
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cmd_checkpoints(args: argparse.Namespace) -> int:
    data = checkpoint_view(existing_data_dir(args), args.function, vb=args.vb, backlog_only=args.backlog_only)
    if args.json:
        emit_json(data)
        return 0
    owners = ", ".join(data["owners"]) or "none yet"
    print(
        f"{data['function']} ({data['state']}), source '{data['source_bucket']}': {data['vbuckets']} vBuckets, "
        f"backlog {data['backlog']:,} in {data['vbuckets_with_backlog']} vBuckets, {data['leased']} leased; "
        f"owners: {owners}"
    )
    if not data["source_identity_matches"]:
        print("  the source bucket was recreated or flushed since the deployment: these checkpoints will not "
              "resume on it; undeploy and deploy the function again")
    if not data["rows"]:
        print("  no vBucket matches" + (" (no backlog anywhere)" if args.backlog_only else ""))
        return 0
    print(table(
        ["vb", "checkpoint", "high seqno", "backlog", "owner", "epoch", "leased", "updated (UTC)"],
        [[r["vb"], r["checkpoint"], r["high_seqno"], r["backlog"], r["owner"], _epoch(r["epoch"]),
          "yes" if r["leased"] else "no", _when(r["updated_at"])] for r in data["rows"]],
    ))
    return 0


def _epoch(epoch: int) -> str:
    """Epochs start at generation << 32 (eventing.runtime.lifecycle.EPOCH_SHIFT): show both halves."""
    return f"{epoch >> 32}:{epoch & 0xFFFFFFFF}"


def register(sub: Any, add: Any) -> None:
    p = add("checkpoints", cmd_checkpoints,
            "per vBucket of a function: checkpoint, high seqno, backlog, owner and epoch "
            "(deployment:claim), lease, last update")
    p.add_argument("function")
    p.add_argument("--vb", type=non_negative_int, help="only this vBucket")
    p.add_argument("--backlog-only", action="store_true", help="only vBuckets with mutations not yet checkpointed")
