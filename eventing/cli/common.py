"""What every command module shares: the data directory, function views, progress on the terminal."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from eventing.cli.output import emit_json
from eventing.core.mutation import parse_json_document
from eventing.errors import EventingError, NotFoundError
from metadata import METADATA_URL_ENV
from metadata.factory import SQLITE_FILE
from metadata.sqlite_io import private_folder

DEFAULT_DATA_DIR = ".eventing"
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # Ctrl-C, for every command (128 + SIGINT, as shells report it)


def data_dir_of(args: argparse.Namespace) -> str:
    return args.data_dir or os.environ.get("EVENTING_DATA_DIR") or DEFAULT_DATA_DIR


def writable_data_dir(args: argparse.Namespace) -> str:
    """The data directory, created if needed; a clear error if it cannot be written."""
    path = Path(data_dir_of(args))
    try:
        private_folder(path)
        probe = path / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise EventingError(
            f"data directory {path} is not writable ({exc.strerror}); pass --data-dir DIR or set EVENTING_DATA_DIR "
            "to a writable directory"
        ) from None
    return str(path)


def existing_data_dir(args: argparse.Namespace) -> str:
    path = Path(data_dir_of(args))
    if not (path / SQLITE_FILE).exists() and not os.environ.get(METADATA_URL_ENV):
        raise NotFoundError(
            f"no eventing metadata in {path}; deploy a function first (`eventing deploy functions/fn_email.json`) "
            "or pass the right --data-dir"
        )
    return str(path)


def check_function_buckets(data_dir: str, functions: list[str] | None = None) -> None:
    """Before a run: the bucket files the deployed functions (or ``functions``) read and write pass
    SQLite's quick check, else one line names the damaged file and the way out (StoreCorruptError). A
    damaged page might otherwise surface only when a worker reaches it, or never (a lookup that misses
    it), while the rest of the run goes on."""
    from eventing.storage.factory import open_bucket
    from eventing.storage.files import bucket_path
    from metadata.factory import open_store

    with open_store(data_dir) as store:
        records = store.list_functions()
    names: set[str] = set()
    for record in records:
        if (functions and record.name not in functions) or record.state.value == "undeployed":
            continue
        names.add(record.definition.get("source_bucket", ""))
        names.update(b.get("bucket", "") for b in record.definition.get("bindings", []) if isinstance(b, dict))
    for name in sorted(n for n in names if n and bucket_path(data_dir, n).exists()):
        with open_bucket(data_dir, name) as bucket:
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
                bar = self.bars[name] = tqdm(desc=name, unit="mut", position=position, leave=True, dynamic_ncols=True)
            total = p.handled + p.backlog
            if total and bar.total != total:
                bar.total = total
            bar.n = p.handled
            bar.set_postfix_str(p.state, refresh=False)
            bar.refresh()

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (argparse prints the message on one line and exits 2)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 0, got {text!r}")
    return value


def process_started_at() -> float:
    """When this process started (epoch s), interpreter start and imports included; now where unknown."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rpartition(")")[2].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()
