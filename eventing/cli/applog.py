"""`eventing log FN`: a function's application log (what its handler's log() wrote), with rotation."""

from __future__ import annotations

import argparse
import json
from typing import Any

from eventing.cli.common import existing_state
from eventing.cli.output import emit_json
from eventing.core.definition import FunctionDefinition
from eventing.errors import ConfigError


def cmd_log(args: argparse.Namespace) -> int:
    state = existing_state(args)
    if args.lines < 0:
        raise ConfigError(f"--lines {args.lines} is negative; give a number of lines >= 0")
    with state.metadata as store:
        FunctionDefinition.from_dict(store.get_function(args.function).definition)  # unknown -> clear error
    logs = state.app_logs
    lines = logs.tail(args.function, args.lines)
    if args.json and not args.follow:
        emit_json({"function": args.function, "path": logs.where(args.function), "lines": lines})
        return 0
    for line in lines:
        _print(args, line)
    if args.follow:
        for line in logs.follow(args.function):
            _print(args, line)
    return 0


def _print(args: argparse.Namespace, line: str) -> None:
    print(json.dumps({"line": line}) if args.json else line, flush=True)


def register(sub: Any, add: Any) -> None:
    p = add("log", cmd_log, "show a function's application log (its handler's log() lines), newest last")
    p.add_argument("function")
    p.add_argument(
        "--lines", "-n", type=int, default=20, help="how many of the last lines to show (default 20)"
    )
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new lines as they are written")
