"""A timer workload with a ledger, shared by `scripts/bench_timers.py` and the Ray integration test.

N documents each make one timer, due spread evenly over `span_s` seconds starting `lead_s` after deploy;
the callback writes one ledger document per timer with its due and fire times. The ledger bucket's log
keeps every write, so a timer fired twice shows as two upserts of its key and a lost one as none.
Workers can be killed with SIGKILL during the firing span (the supervisor restarts them from their
checkpoints; their claimed-but-unrecorded timers fire again under the same fire_seq).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.core.mutation import OP_UPDATE, encode_document
from eventing.execution.timers import delay_percentile
from eventing.storage.state import StateLike, as_state
from eventing.storage.values import Write
from eventing.storage.writes import chunked
from eventing.workers.executor import Executor

FUNCTION = "fn_timers"

HANDLER = """
import time

def on_update(doc, meta):
    create_timer(fire, BASE + doc["offset"], meta.id, {"id": meta.id, "due": BASE + doc["offset"]})

def fire(context):
    ledger["f|" + context["id"]] = {"due": context["due"], "fired": time.time()}
"""


@dataclass
class TimerBenchResult:
    timers: int
    fired_keys: int = 0
    missing: int = 0
    fired_twice: int = 0
    kills: int = 0
    delay_p50_s: float = 0.0
    delay_p99_s: float = 0.0
    delay_max_s: float = 0.0
    seconds: float = 0.0
    counters: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.fired_twice == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "timers": self.timers,
            "fired": self.fired_keys,
            "missing": self.missing,
            "fired_twice": self.fired_twice,
            "kills": self.kills,
            "delay_p50_s": round(self.delay_p50_s, 3),
            "delay_p99_s": round(self.delay_p99_s, 3),
            "delay_max_s": round(self.delay_max_s, 3),
            "seconds": round(self.seconds, 1),
            **self.counters,
        }


def prepare(data_dir: StateLike) -> None:
    as_state(data_dir).create_bucket("timer_src", exist_ok=True)
    as_state(data_dir).create_bucket("timer_ledger", exist_ok=True)


def definition(workers: int, batch_size: int, base: float) -> FunctionDefinition:
    return FunctionDefinition.from_dict(
        {
            "name": FUNCTION,
            "source_bucket": "timer_src",
            "worker_count": workers,
            "batch_size": batch_size,
            "checkpoint_interval": "500ms",
            "bindings": [{"alias": "ledger", "bucket": "timer_ledger", "access": "rw"}],
            "constants": {"BASE": base},
        }
    )


def run(
    data_dir: StateLike,
    executor: Executor,
    timers: int,
    *,
    span_s: float,
    lead_s: float,
    workers: int = 4,
    kills: int = 0,
    timeout_s: float | None = None,
    progress: Any = None,
) -> TimerBenchResult:
    """Deploy, let every timer fire (or time out), stop; then count through the ledger."""
    source = as_state(data_dir).open_bucket("timer_src")
    base = time.time() + lead_s  # BASE, a constant binding: due times are BASE + offset
    lifecycle.save_function(data_dir, definition(workers, 1000, base), HANDLER)
    lifecycle.deploy(data_dir, FUNCTION)
    offsets = (span_s * i / max(1, timers - 1) for i in range(timers))
    for chunk in chunked(
        (Write(f"t{i}", OP_UPDATE, encode_document({"offset": off})) for i, off in enumerate(offsets)), 20_000
    ):
        source.write(chunk)
    service = EventingService(data_dir, executor, functions=[FUNCTION])
    thread = threading.Thread(target=service.run, name="timer-bench-service", daemon=True)
    started = time.monotonic()
    thread.start()
    result = TimerBenchResult(timers)
    ledger = as_state(data_dir).open_bucket("timer_ledger")
    deadline = started + (timeout_s if timeout_s is not None else lead_s + span_s + 120)
    kill_at = [base + span_s * (k + 1) / (kills + 1) for k in range(kills)]
    try:
        while time.monotonic() < deadline:
            count = ledger.stats()["documents"]
            if progress is not None:
                progress(count)
            if count >= timers:
                break
            if kill_at and time.time() >= kill_at[0]:
                kill_at.pop(0)
                result.kills += _kill_one_worker(service, result.kills)
            time.sleep(0.5)
        time.sleep(1.0)  # a duplicate firing (the failure we look for) would land within a step or two
    finally:
        service.stop()
        thread.join(timeout=120)
    result.seconds = time.monotonic() - started
    writes = ledger.logged_writes("f|")
    result.fired_keys = len(writes)
    result.missing = timers - len(writes)
    result.fired_twice = sum(1 for n in writes.values() if n > 1)
    delays = sorted(d["fired"] - d["due"] for k in writes if (d := ledger.get(k)) is not None)
    if delays:
        result.delay_p50_s = delays[len(delays) // 2]
        result.delay_p99_s = delays[min(len(delays) - 1, int(len(delays) * 0.99))]
        result.delay_max_s = delays[-1]
    store = as_state(data_dir).open_metadata()
    try:
        counters = store.counters(FUNCTION)
        result.counters = {
            "timers_created": int(counters.get("timers_created", 0)),
            "timers_fired": int(counters.get("timers_fired", 0)),
            "effects_duplicate": int(counters.get("effects_duplicate", 0)),
            "histogram_p99_ms": delay_percentile(counters, 0.99),
            "backlog": store.timer_backlog(FUNCTION, int(time.time() * 1000)),
        }
    finally:
        store.close()
    return result


def _kill_one_worker(service: EventingService, n: int) -> int:
    sup = service.supervisors.get(FUNCTION)
    if sup is None:
        return 0
    pids = [slot.pid for slot in sup.slots.values() if slot.ready and slot.pid]
    if not pids:
        return 0
    pid = pids[n % len(pids)]
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return 0
    return 1
