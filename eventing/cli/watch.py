"""`eventing stats FN --watch`: a live view that refreshes every --interval seconds.

On a terminal the view is redrawn in place; otherwise (a pipe, a file, CI logs) each refresh is one line,
so the output stays readable and greppable. With --json each refresh is one JSON object per line.
Ctrl-C ends the view with exit status 0, as it ends `eventing run` (a watch has no other way to stop
unless --count is given).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TextIO

from eventing.cli.common import EXIT_INTERRUPTED

CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen
MIN_INTERVAL_S = 0.1


def interval_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value >= MIN_INTERVAL_S:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds of at least {MIN_INTERVAL_S}, got {text!r}"
        )
    return value


def watch(
    sample: Callable[[], dict[str, Any]],
    render: Callable[[dict[str, Any]], None],
    one_line: Callable[[dict[str, Any]], str],
    *,
    interval_s: float,
    as_json: bool,
    count: int | None = None,
    out: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Sample, show, sleep, until `count` refreshes are shown or Ctrl-C."""
    stream = out or sys.stdout
    live = not as_json and stream.isatty()
    shown = 0
    try:
        while count is None or shown < count:
            data = sample()
            now = datetime.now(UTC).strftime("%H:%M:%S")
            if as_json:
                stream.write(json.dumps({"at": time.time(), **data}, default=str) + "\n")
            elif live:
                buffer = io.StringIO()
                with contextlib.redirect_stdout(buffer):
                    render(data)
                stream.write(f"{CLEAR}{now} UTC, every {interval_s:g}s (Ctrl-C to stop)\n{buffer.getvalue()}")
            else:
                stream.write(f"{now} {one_line(data)}\n")
            stream.flush()
            shown += 1
            if count is None or shown < count:
                sleep(interval_s)
    except KeyboardInterrupt:
        if live:
            stream.write("\n")
        return EXIT_INTERRUPTED  # Ctrl-C, as for every command
    return 0


def stats_line(data: dict[str, Any]) -> str:
    """One refresh of `eventing stats` on one line: every scalar as key=value, dicts flattened."""
    parts = [data.get("function", ""), f"state={data.get('state')}"]
    for key, value in data.items():
        if key in ("function", "state"):
            continue
        if isinstance(value, dict):
            parts.extend(f"{key}.{k}={v}" for k, v in value.items())
        else:
            parts.append(f"{key}={'-' if value is None else value}")
    return " ".join(str(p) for p in parts)
