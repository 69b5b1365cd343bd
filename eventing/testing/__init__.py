"""A test harness shipped with the product: a ledger handler, and the ledger check that counts, per
mutation, whether it was handled exactly once and in per-document order (see eventing.ops.verify).

The ledger handler writes, through a read-write binding `ledger`:
  - `e|<function>|<key>|<seqno>`: one effect per handled mutation (so an effect applied twice shows up as
    two mutations of the same key in the ledger bucket's log);
  - `h|<function>|<key>`: the document's history, the list of source seqnos in the order their effects
    applied (it reads its own previous write, so a reordering or a lost effect is visible in the list).
The function's name (the constant `FUNCTION`) is in both, so one ledger bucket can serve several functions.
Set the constant `CALL_LOG` to a file path to also record every handler call (at-least-once): a sandboxed
handler appends to it too, since `ledger_definition` grants it that one file (`sandbox_writable`).
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Not `lifecycle`: importing the submodule eventing.testing.lifecycle_model rebinds that name in this package.
from eventing.control import lifecycle as control_lifecycle
from eventing.core.definition import Boundary, FunctionDefinition
from eventing.ops.verify import VerifyReport, check_ledger
from eventing.storage import loadgen
from eventing.storage.protocol import FileBucket
from eventing.storage.state import StateLike, as_state
from eventing.storage.writes import chunked
from functions import FUNCTIONS_DIR

# The ledger handler is the example function fn_ledger (functions/fn_ledger.py, fn_ledger.json), one copy.
LEDGER_HANDLER = (FUNCTIONS_DIR / "fn_ledger.py").read_text()

# The ledger handler as on_batch(batch): the same effects per mutation, SLEEP_MS once a batch. Items whose
# document's rev is a multiple of the constant FAIL_EVERY (0: none) are reported failed at their first
# FAIL_ATTEMPTS attempts in this process.
BATCH_LEDGER_HANDLER = (
    (FUNCTIONS_DIR / "fn_ledger.py").read_text().split("def on_update")[0]
    + """
tries = {}


def on_batch(batch):
    if SLEEP_MS:
        import time
        time.sleep(SLEEP_MS / 1000)  # a batch's bulk request
    failed = []
    for item in batch:
        meta, doc = item.meta, item.doc
        if FAIL_EVERY and doc is not None and doc.get("rev", 0) % FAIL_EVERY == 0:
            tries[(meta.id, meta.seq)] = tries.get((meta.id, meta.seq), 0) + 1
            if tries[(meta.id, meta.seq)] <= FAIL_ATTEMPTS:
                failed.append((item, f"rev {doc['rev']} declined"))
                continue
        if item.deleted:
            _record(meta, "expire" if item.expired else "delete", None)
        else:
            _record(meta, "update", doc.get("rev"))
    return failed
"""
)

# The ledger check and its report live in eventing.ops.verify (`eventing verify` uses them too).
LedgerReport = VerifyReport
__all__ = [
    "BATCH_LEDGER_HANDLER",
    "LEDGER_HANDLER",
    "CallLogFigures",
    "LedgerReport",
    "call_log_figures",
    "check_ledger",
    "ledger_definition",
    "read_call_log",
]


def ledger_definition(
    name: str,
    source: str,
    ledger: str,
    *,
    workers: int = 2,
    call_log: str | None = None,
    sleep_ms: float = 0,
    **extra,
) -> FunctionDefinition:
    if call_log:
        # The one file outside its sandbox the handler writes: it must exist to be granted.
        call_log = os.path.abspath(call_log)
        Path(call_log).touch()
        extra = {"sandbox_writable": [call_log], **extra}
    return FunctionDefinition.from_dict(
        {
            "name": name,
            "source_bucket": source,
            "bindings": [{"alias": "ledger", "bucket": ledger, "access": "rw"}],
            "constants": {"FUNCTION": name, "CALL_LOG": call_log or "", "SLEEP_MS": sleep_ms},
            "worker_count": workers,
            "checkpoint_interval": "100ms",
            **extra,
        }
    )


def read_call_log(path: str | Path) -> dict[str, list[int]]:
    """Handler calls per document key, in the order they were made (per process)."""
    calls: dict[str, list[int]] = defaultdict(list)
    if not os.path.exists(path):
        return calls
    with open(path) as f:
        for line in f:
            key, seq, _pid = line.split()
            calls[key].append(int(seq))
    return calls


@dataclass(frozen=True)
class CallLogFigures:
    calls: int  # handler calls made (at least once: replays after a fault call again)
    distinct: int  # distinct (key, seqno) handled
    duplicate_calls: int  # calls - distinct


def call_log_figures(path: str | Path) -> CallLogFigures:
    calls = read_call_log(path)
    total = sum(len(v) for v in calls.values())
    distinct = sum(len(set(v)) for v in calls.values())
    return CallLogFigures(total, distinct, total - distinct)


def load_source(
    data_dir: StateLike,
    documents: int,
    mutations: int,
    *,
    bucket: str = "src",
    chunk: int = 10_000,
    **generate: Any,
) -> FileBucket:
    """The bucket (created if missing) with ``loadgen.generate(documents, mutations, **generate)`` written
    into it in chunks."""
    source = as_state(data_dir).create_bucket(bucket, exist_ok=True)
    for writes in chunked(loadgen.generate(documents, mutations, **generate), chunk):
        source.write(writes)
    return source


def deploy_function(
    data_dir: StateLike,
    defn: FunctionDefinition,
    handler: str = LEDGER_HANDLER,
    boundary: Boundary | None = None,
) -> None:
    """Create the function's binding buckets, save it with ``handler`` and deploy it."""
    for b in defn.bindings:
        as_state(data_dir).create_bucket(b.bucket, exist_ok=True)
    control_lifecycle.save_function(data_dir, defn, handler)
    control_lifecycle.deploy(data_dir, defn.name, boundary)


def wait_for(
    predicate: Callable[[], Any],
    what: str = "the condition holds",
    timeout: float = 90.0,
    every: float = 0.05,
    *,
    retry_on: tuple[type[BaseException], ...] = (),
) -> Any:
    """Wait until predicate() returns a true value, and return that value; fail the test after `timeout`
    seconds naming `what`. An exception of `retry_on` (a page or server still starting) counts as not yet.
    A caller that measures how long something took reads the clock around the call."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            value = predicate()
        except retry_on as exc:
            value, last = None, exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting until {what} (last: {last!r})")
        time.sleep(every)


class BackgroundLoop:
    """Runs `tick()` on a daemon thread inside a `with` block (test load generators and samplers)."""

    interval_s = 0.0

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.tick()
            if self.interval_s:
                time.sleep(self.interval_s)
        self.finish()

    def tick(self) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        pass
