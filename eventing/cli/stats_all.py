"""`eventing stats` without a name: every function's counters, one table row each (`--json`: a list of
what `eventing stats FN --json` prints, `function` first)."""

from __future__ import annotations

import argparse
from typing import Any

from eventing.cli.common import existing_state
from eventing.cli.output import emit_json, table
from eventing.storage.state import State

HEADERS = [
    "function",
    "state",
    "seen",
    "success",
    "failure",
    "timeout",
    "dead letters",
    "backlog",
    "mutations/s",
]


def all_stats(state: State) -> list[dict[str, Any]]:
    from eventing.ops.stats import function_stats

    with state.metadata as store:
        names = [r.name for r in store.list_functions()]
    return [function_stats(state, name) for name in names]


def _row(s: dict[str, Any]) -> list[Any]:
    outcomes = [
        sum(s.get(f"{h}_{o}", 0) for h in ("on_update", "on_delete"))
        for o in ("success", "failure", "timeout")
    ]
    return [
        s["function"],
        s["state"],
        s["mutations_seen"],
        *outcomes,
        sum(s["dlq"].values()),
        s["checkpoint_lag"],
        float(s["throughput_mps"]),
    ]


def cmd_stats_all(args: argparse.Namespace) -> int:
    if args.watch:
        from eventing.errors import ConfigError

        raise ConfigError("stats --watch follows one function; name it (`eventing stats FN --watch`)")
    state = existing_state(args)
    stats = all_stats(state)
    if args.json:
        emit_json(stats)
        return 0
    if not stats:
        print("no functions; deploy one with `eventing deploy functions/fn_email.json`")
    else:
        print(table(HEADERS, [_row(s) for s in stats]))
        print(
            "success, failure and timeout count on_update and on_delete calls; `eventing stats FN` shows one "
            "function in full"
        )
    _print_mirrors(state)
    return 0


def _print_mirrors(state: object) -> None:
    """Each mirror's lag and the WAL its slot holds back (`eventing status --json` has them as data)."""
    from eventing.ops.mirrors import mirror_health

    rows = mirror_health(state)  # type: ignore[arg-type]
    if not rows:
        return
    print()
    print(
        table(
            ["mirror", "table", "state", "lag (bytes)", "lag (s)", "retained WAL (bytes)", "changes applied"],
            [
                [
                    r["keyspace"],
                    r["table"],
                    r["state"],
                    _or_dash(r["lag_bytes"]),
                    _or_dash(r["lag_s"]),
                    _or_dash(r["retained_bytes"]),
                    r["applied_changes"],
                ]
                for r in rows
            ],
        )
    )
    for r in rows:
        for warning in r["warnings"]:
            print(f"warning: mirror {r['keyspace']}: {warning}")


def _or_dash(value: object) -> object:
    return "-" if value is None else value
