"""What every command module shares: the state (--store / --data-dir), function views, progress on the
terminal."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from eventing.cli.output import emit_json
from eventing.core.mutation import parse_json_document
from eventing.errors import EventingError
from eventing.storage.state import (  # DEFAULT_DATA_DIR: for the parser's help
    DEFAULT_DATA_DIR,  # noqa: F401
    State,
    default_location,
    open_state,
    require_existing,
)
from metadata.sqlite_io import private_folder

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # Ctrl-C, for every command (128 + SIGINT, as shells report it)


def location_of(args: argparse.Namespace) -> str:
    """--store, else --data-dir, else $EVENTING_STORE, $EVENTING_DATA_DIR or ./.eventing."""
    return getattr(args, "store", None) or getattr(args, "data_dir", None) or default_location()


def state_of(args: argparse.Namespace) -> State:
    """The command's state, opened once (main closes it when the command ends)."""
    state = getattr(args, "_state", None)
    if state is None:
        state = args._state = open_state(location_of(args))
    return state


def writable_state(args: argparse.Namespace) -> State:
    """The state, its data directory created if needed; a clear error if it cannot be written."""
    state = state_of(args)
    path = state.directory
    if path is None:
        return state
    try:
        private_folder(path)
        probe = path / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise EventingError(
            f"data directory {path} is not writable ({exc.strerror}); pass --data-dir DIR (or --store) or "
            "set EVENTING_DATA_DIR to a writable directory"
        ) from None
    return state


def existing_state(args: argparse.Namespace) -> State:
    """The state of a command that reads: NotFoundError naming the fix when nothing was stored there yet."""
    return require_existing(state_of(args))


def check_function_buckets(state: State, functions: list[str] | None = None) -> None:
    """Before a run: the buckets the deployed functions (or ``functions``) read and write pass their
    integrity check (SQLite's quick check for a file), else one line names the damaged bucket and the way
    out (StoreCorruptError). A damaged page might otherwise surface only when a worker reaches it, or never
    (a lookup that misses it), while the rest of the run goes on."""
    records = state.metadata.list_functions()
    names: set[str] = set()
    for record in records:
        if (functions and record.name not in functions) or record.state.value == "undeployed":
            continue
        names.add(record.definition.get("source_bucket", ""))
        names.update(
            b.get("bucket", "") for b in record.definition.get("bindings", []) if isinstance(b, dict)
        )
    for name in sorted(n for n in names if n and state.has_bucket(n)):
        with state.open_bucket(name) as bucket:
            bucket.verify_integrity()


def parse_doc_arg(text: str) -> dict:
    return parse_json_document(text)


def announce(args: argparse.Namespace, record, verb: str) -> int:
    if args.json:
        from eventing.ops.stats import function_view

        emit_json(function_view(record))
    else:
        print(f"function '{record.name}' {verb} (state: {record.state.value})")
    return 0


class ProgressRenderer:
    """Live counters on stderr: one tqdm bar per function (total known in --until-caught-up)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bars: dict[str, Any] = {}
        self.last = 0.0

    def __call__(self, summary) -> None:
        if not self.enabled or time.monotonic() - self.last < 0.2:
            return
        from tqdm import tqdm

        self.last = time.monotonic()
        for position, (name, p) in enumerate(sorted(summary.functions.items())):
            bar = self.bars.get(name)
            if bar is None:
                bar = self.bars[name] = tqdm(
                    desc=name, unit="mut", position=position, leave=True, dynamic_ncols=True
                )
            total = p.handled + p.backlog
            if total and bar.total != total:
                bar.total = total
            bar.n = p.handled
            bar.set_postfix_str(p.state, refresh=False)
            bar.refresh()

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()


# The largest integer SQLite (and PostgreSQL's bigint) holds: a larger number given to a command that reaches
# the store would fail there with a traceback (OverflowError), not as the user's mistake.
STORE_INT_MAX = 2**63 - 1


def positive_int(text: str) -> int:
    """An argparse type: a whole number from 1 to STORE_INT_MAX (argparse prints the message on one line
    and exits 2)."""
    return _whole_number(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number from 0 to STORE_INT_MAX."""
    return _whole_number(text, 0)


def store_int(text: str) -> int:
    """An argparse type: a whole number a store can hold, -STORE_INT_MAX to STORE_INT_MAX (the command
    checks its own range)."""
    return _whole_number(text, -STORE_INT_MAX)


def _whole_number(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not least <= value <= STORE_INT_MAX:
        raise argparse.ArgumentTypeError(
            f"must be a whole number from {least} to {STORE_INT_MAX}, got {text!r}"
        )
    return value


def process_started_at() -> float:
    """When this process started (epoch s), interpreter start and imports included; now where unknown."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rpartition(")")[2].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()
