"""`eventing stats` without a name: every function's counters, one table row each (`--json`: a list of
what `eventing stats FN --json` prints, `function` first)."""

from __future__ import annotations

import argparse
from typing import Any

from eventing.cli.common import existing_state
from eventing.cli.output import emit_json, table
from eventing.storage.state import State

HEADERS = ["function", "state", "seen", "success", "failure", "timeout", "dead letters", "backlog", "mutations/s"]


def all_stats(state: State) -> list[dict[str, Any]]:
    from eventing.ops.stats import function_stats

    with state.metadata as store:
        names = [r.name for r in store.list_functions()]
    return [function_stats(state, name) for name in names]


def _row(s: dict[str, Any]) -> list[Any]:
    outcomes = [sum(s.get(f"{h}_{o}", 0) for h in ("on_update", "on_delete")) for o in ("success", "failure", "timeout")]
    return [s["function"], s["state"], s["mutations_seen"], *outcomes, sum(s["dlq"].values()), s["checkpoint_lag"],
            float(s["throughput_mps"])]


def cmd_stats_all(args: argparse.Namespace) -> int:
    if args.watch:
        from eventing.errors import ConfigError

        raise ConfigError("stats --watch follows one function; name it (`eventing stats FN --watch`)")
    stats = all_stats(existing_state(args))
    if args.json:
        emit_json(stats)
    elif not stats:
        print("no functions; deploy one with `eventing deploy functions/fn_email.json`")
    else:
        print(table(HEADERS, [_row(s) for s in stats]))
        print("success, failure and timeout count on_update and on_delete calls; `eventing stats FN` shows one "
              "function in full")
    return 0
