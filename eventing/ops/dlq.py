"""The dead-letter queue of a function: list, show, replay and purge the mutations its handler could not
process.

What lands here: a worker writes one row per (function, vBucket, seqno), in the same metadata transaction
as the checkpoint that moves past it, with reason `error` (the handler raised on every attempt: 1 +
`retries`, with backoff), `timeout` (it ran past `execution_timeout`; not retried), `undecodable` (the
document is not valid msgpack) or `oversize` (larger than `max_document_bytes`), the error, the
traceback, the attempts, the first and last failure times, and the packed mutation itself.

Partial effects: a handler's binding writes are held until it returns. If it raises or times out they
are discarded, so a dead-lettered mutation leaves no partial effects behind; the vBucket moves on.

Replay guarantee: `replay` re-runs the function's **current** stored handler (fix the file, then deploy it
again or update it while paused) on the selected rows, in per-document order ((vBucket, seqno) order),
through the real bindings, and applies each row exactly once, even when a replay is interrupted and run
again, or two replays run at once:

1. the row's writes go through `LocalBucket.apply_effects` under the row's own effect-mark namespace
   `<function>#replay:<vb>:<seqno>:<first_failed_ms>`, keyed by the row's source vBucket with the row's
   seqno, in the same bucket transaction as the writes;
2. then the row is marked replayed (`replayed_at`) in the metadata store.

A rerun after a stop between 1 and 2 finds the mark and skips the writes, then marks the row. The mark is
per row rather than a per-vBucket high-water mark because rows of one vBucket are not replayed in seqno
order across runs: a row that fails again is replayed later, after later rows succeeded. A row whose
handler still fails stays in the queue with attempts + 1 and the newest reason, error and traceback.
Replayed rows are hidden from `list` unless asked for, and kept until purged; replay marks stay in the
destination buckets' effect-mark tables (one small row per replayed row and bucket written).

Replayed writes carry the current deployment's origin (eventing.storage.origins), like its live writes, so
the recursion guard holds: a replayed write to the function's own source bucket does not trigger the
deployment again (a later deployment handles it, as any write of an earlier one).

Replay runs beside the stream, not in it: a replayed mutation's effects land after those of any later
mutation of the same document that the stream already handled. Each row gets one attempt per replay,
bounded by `execution_timeout`. Rows with other reasons (such as `late` rows of window aggregation) are
not handler work and are never replayed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import msgpack

from eventing.core.mutation import OP_NAMES, Mutation, unpack_mutation
from eventing.core.retry import parse_attempts
from eventing.errors import ConfigError, NotFoundError, fix
from eventing.execution.runner import HandlerRunner, writes_by_bucket
from eventing.execution.single_call import run_once
from eventing.storage.origins import deployment_origin
from eventing.storage.protocol import Maintenance
from eventing.storage.state import StateLike, as_state
from eventing.storage.values import EffectGroup
from eventing.workers.sandbox.host import SandboxedRunner, open_runner
from metadata import DlqRow, MetadataStore
from sharding import NUM_VBUCKETS, validate_key

REPLAYABLE_REASONS = frozenset(
    {
        "error",
        "timeout",
        "crashed",
        "undecodable",
        "oversize",
        "timer_error",
        "cas_mismatch",
        "expired",
    }
)
# Every reason a row can have: handler work (above), window rows (`late`, `bad_event_time`) and the rows the
# arrival-time policies drop (eventing.windows.semantics.arrival.DROP_REASONS).
DLQ_REASONS = REPLAYABLE_REASONS | {
    "late",
    "bad_event_time",
    "early",
    "late_arrival",
    "out_of_order",
    "no_substream_key",
}


def check_reason(reason: str | None) -> None:
    """An unknown reason is a mistake (a typo would otherwise list, replay or purge nothing, silently)."""
    if reason is not None and reason not in DLQ_REASONS:
        raise ConfigError(
            f"reason {reason!r} is not a dead-letter reason; use one of {', '.join(sorted(DLQ_REASONS))}"
        )


@dataclass(frozen=True)
class DlqSelector:
    """Which rows a command acts on: every given filter must match; `everything` selects all rows."""

    vb: int | None = None
    seqno: int | None = None
    key: str | None = None
    reason: str | None = None
    everything: bool = False

    @property
    def narrows(self) -> bool:
        return self.vb is not None or self.key is not None or self.reason is not None

    def check(self, command: str) -> None:
        if self.seqno is not None and self.vb is None:
            raise ConfigError(
                f"`dlq {command}` --seqno needs --vb: a seqno is only unique within its vBucket"
            )
        if self.vb is not None and not 0 <= self.vb < 2 * NUM_VBUCKETS:
            raise ConfigError(
                f"vBucket {self.vb} does not exist; use 0..{NUM_VBUCKETS - 1} "
                f"({NUM_VBUCKETS}..{2 * NUM_VBUCKETS - 1} for timer dead letters)"
            )
        if self.key is not None:
            validate_key(self.key)
        check_reason(self.reason)
        if self.everything and (self.vb is not None or self.key is not None):
            raise ConfigError(f"`dlq {command}` takes --all or a selector (--vb/--seqno, --key), not both")


def replay_namespace(row: DlqRow) -> str:
    """The effect-mark namespace of one failure of a dead letter: stable across replays of that failure (a
    replay that applied its writes and crashed before marking the row replayed applies nothing twice), new
    once the mutation fails again (after a replay, a rewind or under a later deployment: each failure and
    replay moves last_failed_at), so a later replay is never taken for a duplicate of an earlier one."""
    return f"{row.function}#replay:{row.vb}:{row.seqno}:{int(row.last_failed_at * 1000)}"


# -- inspection ------------------------------------------------------------------------------------------


def list_rows(
    state: StateLike,
    function: str,
    *,
    reason: str | None = None,
    limit: int | None = None,
    include_replayed: bool = False,
) -> list[DlqRow]:
    state = as_state(state)
    if limit is not None and limit < 1:
        raise ConfigError(
            "{fix} is not positive; give a number of rows >= 1",
            fix=fix("option", flag="--limit", value=limit),
        )
    check_reason(reason)
    with _store(state) as store:
        store.get_function(function)  # an unknown function is an error, not an empty queue
        return store.find_dlq_rows(function, reason=reason, limit=limit, include_replayed=include_replayed)


def show_rows(state: StateLike, function: str, selector: DlqSelector) -> list[DlqRow]:
    """Rows of one (vBucket, seqno), of one key, or of one vBucket, replayed or not; NotFoundError if none."""
    state = as_state(state)
    selector.check("show")
    if selector.vb is None and selector.key is None:
        raise ConfigError("`dlq show` needs --vb N --seqno S or --key KEY; `dlq list` shows every row")
    with _store(state) as store:
        store.get_function(function)
        rows = store.find_dlq_rows(
            function, vb=selector.vb, seqno=selector.seqno, key=selector.key, include_replayed=True
        )
    if not rows:
        raise NotFoundError(
            f"function '{function}' has no dead letter {_describe(selector)}; see {{fix}}",
            fix=fix("dlq_list", function=function),
        )
    return rows


def row_view(row: DlqRow, *, full: bool = False) -> dict[str, Any]:
    """A JSON-able view of a row; `full` adds the traceback and the decoded mutation."""
    view: dict[str, Any] = {
        "vb": row.vb,
        "seqno": row.seqno,
        "key": row.key,
        "reason": row.reason,
        "error": row.error,
        "attempts": row.attempts,
        "first_failed_at": _iso(row.first_failed_at),
        "last_failed_at": _iso(row.last_failed_at),
        "replayed_at": _iso(row.replayed_at) if row.replayed_at else None,
    }
    if full:
        view["traceback"] = row.traceback
        view["attempt_errors"] = parse_attempts(
            row.traceback
        )  # every attempt's, when there was more than one
        view["mutation"] = _mutation_view(row.mutation)
    return view


def _mutation_view(packed: bytes) -> dict[str, Any]:
    try:
        m = unpack_mutation(packed)
    except Exception as exc:  # noqa: BLE001 - a damaged row is shown, not fatal
        return {"error": f"the stored mutation cannot be unpacked ({type(exc).__name__}: {exc})"}
    out: dict[str, Any] = {
        "op": OP_NAMES.get(m.op, str(m.op)),
        "cas": m.cas,
        "origin": m.origin,
        "expiry": m.expiry,
        "flags": m.flags,
        "bytes": len(m.doc) if m.doc else 0,
    }
    if m.doc is not None:
        try:
            out["doc"] = msgpack.unpackb(m.doc, raw=False)
        except Exception:  # noqa: BLE001 - an undecodable document is why some rows exist
            out["doc_hex"] = m.doc[:64].hex() + ("..." if len(m.doc) > 64 else "")
    return out


# -- replay ----------------------------------------------------------------------------------------------


@dataclass
class RowResult:
    vb: int
    seqno: int
    key: str
    outcome: str  # replayed | error | timeout | undecodable | oversize | not replayable
    error: str = ""
    writes_applied: int = 0
    writes_skipped: int = 0  # applied by an earlier, interrupted replay of this row


@dataclass
class ReplayReport:
    function: str
    selected: int = 0
    replayed: int = 0
    failed: int = 0
    not_replayable: int = 0
    writes_applied: int = 0
    writes_skipped: int = 0
    rows: list[RowResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "function": self.function,
            "selected": self.selected,
            "replayed": self.replayed,
            "failed": self.failed,
            "not_replayable": self.not_replayable,
            "writes_applied": self.writes_applied,
            "writes_skipped": self.writes_skipped,
            "rows": [vars(r) for r in self.rows],
        }


def replay(
    state: StateLike,
    function: str,
    selector: DlqSelector,
    *,
    on_row: Callable[[RowResult], None] | None = None,
    after_effects: Callable[[DlqRow], None] | None = None,
) -> ReplayReport:
    """Replay the selected rows not yet replayed with the current stored handler (see the module docstring).

    `on_row` receives each row's result (progress). `after_effects` runs after a row's effects are durable
    and before the row is marked replayed, the window an interruption can hit; tests stop a replay there.
    A KeyboardInterrupt stops the replay after discarding the current row's held writes.
    """
    state = as_state(state)
    selector.check("replay")
    if not selector.everything and not selector.narrows:
        raise ConfigError(
            "`dlq replay` needs --all or a selector: --vb N [--seqno S], --key KEY or --reason R"
        )
    report = ReplayReport(function)
    # A sandboxed function's handler replays in a sandboxed child; its writes come back and apply here.
    runtime = open_runner(state, function)
    try:
        with _store(state) as store:
            runtime.timers.lookup = lambda callback, reference: store.get_timer(function, callback, reference)
            rows = store.find_dlq_rows(
                function, vb=selector.vb, seqno=selector.seqno, key=selector.key, reason=selector.reason
            )
            if selector.seqno is not None and not rows:
                _explain_missing(store, function, selector)
            report.selected = len(rows)
            origin = deployment_origin(function, store.get_function(function).generation)
            for row in rows:  # (vBucket, seqno) order: each document's rows in its order
                result = _replay_row(
                    store, runtime, row, after_effects, explicit=selector.seqno is not None, origin=origin
                )
                report.rows.append(result)
                report.writes_applied += result.writes_applied
                report.writes_skipped += result.writes_skipped
                if result.outcome == "replayed":
                    report.replayed += 1
                elif result.outcome == "not replayable":
                    report.not_replayable += 1
                else:
                    report.failed += 1
                if on_row is not None:
                    on_row(result)
    finally:
        runtime.close()
    return report


def _replay_row(
    store: MetadataStore,
    runtime: HandlerRunner | SandboxedRunner,
    row: DlqRow,
    after_effects: Callable[[DlqRow], None] | None,
    *,
    explicit: bool,
    origin: str | None = None,
) -> RowResult:
    result = RowResult(row.vb, row.seqno, row.key, "replayed")
    if row.reason not in REPLAYABLE_REASONS:
        if explicit:
            raise ConfigError(
                f"dead letter vBucket {row.vb} seqno {row.seqno} of function '{row.function}' has reason "
                f"'{row.reason}', which is not handler work and cannot be replayed; purge it instead"
            )
        result.outcome = "not replayable"
        return result
    try:
        m: Mutation = unpack_mutation(row.mutation)
    except Exception as exc:  # noqa: BLE001 - a damaged row fails again, it does not stop the replay
        outcome_status, error, tb = (
            "undecodable",
            f"stored mutation cannot be unpacked ({type(exc).__name__}: {exc})",
            "",
        )
    else:
        outcome = runtime.run_once(m)[0] if isinstance(runtime, SandboxedRunner) else run_once(runtime, m)
        outcome_status, error, tb = outcome.status, outcome.error, outcome.traceback
        if outcome.ok:
            namespace = replay_namespace(row)
            conflict = ""
            for bucket, writes in writes_by_bucket(runtime.take_writes()):
                group = EffectGroup(row.vb, 0, writes, conditional=True)  # cas conditions checked here too
                applied = bucket.apply_effects(namespace, [group], origin=origin or row.function)
                result.writes_applied += applied.applied
                result.writes_skipped += applied.duplicates
                if applied.conflicts:
                    # replay runs where the files are (HandlerRunner.open; a SandboxedRunner's writes are
                    # here)
                    cast(Maintenance, bucket).drop_effect_marks(
                        namespace
                    )  # nothing of it applied: a later replay must run
                    conflict = f"a cas condition failed on bucket '{bucket.name}' again; replay it again"
            if conflict:
                runtime.timers.discard()
                runtime.timers.committed(len(runtime.timers.kept))
                store.record_replay_failure(row.function, row.vb, row.seqno, "cas_mismatch", conflict, "")
                result.outcome, result.error = "cas_mismatch", conflict
                return result
            _commit_timers(store, runtime, row.function)
            if after_effects is not None:
                after_effects(row)
            store.mark_replayed(row.function, [(row.vb, row.seqno)])
            return result
    store.record_replay_failure(row.function, row.vb, row.seqno, outcome_status, error, tb)
    result.outcome, result.error = outcome_status, error
    return result


def _commit_timers(store: MetadataStore, runtime: HandlerRunner | SandboxedRunner, function: str) -> None:
    """Timers the replayed call created or cancelled, written under the vBuckets' current epochs (a replay
    runs beside the stream, like its binding writes). A deployed timer row replays its callback the same
    way."""
    changes = list(runtime.timers.kept)
    if changes:
        epochs = {vb: cp.epoch for vb, cp in store.checkpoints(function).items()}
        store.commit(function, epochs, {}, timer_changes=changes)
        runtime.timers.committed(len(changes))


def _explain_missing(store: MetadataStore, function: str, selector: DlqSelector) -> None:
    assert selector.vb is not None and selector.seqno is not None
    row = store.dlq_row(function, selector.vb, selector.seqno)
    if row is not None and row.replayed_at is not None:
        raise NotFoundError(
            f"dead letter vBucket {row.vb} seqno {row.seqno} of function '{function}' was already replayed "
            f"at {_iso(row.replayed_at)}; {{fix}} removes replayed rows",
            fix=fix("dlq_purge_replayed", function=function),
        )
    raise NotFoundError(
        f"function '{function}' has no dead letter {_describe(selector)}; see {{fix}}",
        fix=fix("dlq_list", function=function),
    )


# -- purge -----------------------------------------------------------------------------------------------


def purge(state: StateLike, function: str, selector: DlqSelector, *, replayed_only: bool = False) -> int:
    """Delete the selected rows (replayed or not; `replayed_only` keeps pending ones); returns how many.

    Requires `everything`, `replayed_only` or a selector, so a bare purge never empties a queue by accident.
    """
    state = as_state(state)
    selector.check("purge")
    if not (selector.everything or selector.narrows or replayed_only):
        raise ConfigError(
            "`dlq purge` needs --all, --replayed or a selector (--vb N [--seqno S], --key KEY, --reason R)"
        )
    with _store(state) as store:
        store.get_function(function)
        if selector.vb is None and selector.key is None:
            return store.purge_dlq(function, selector.reason, replayed_only)
        rows = store.find_dlq_rows(
            function,
            vb=selector.vb,
            seqno=selector.seqno,
            key=selector.key,
            reason=selector.reason,
            include_replayed=True,
            replayed_only=replayed_only,
        )
        return store.purge_dlq(function, selector.reason, replayed_only, keys=[(r.vb, r.seqno) for r in rows])


# -- helpers ---------------------------------------------------------------------------------------------


def _describe(selector: DlqSelector) -> str:
    parts = []
    if selector.vb is not None:
        parts.append(f"in vBucket {selector.vb}")
    if selector.seqno is not None:
        parts.append(f"at seqno {selector.seqno}")
    if selector.key is not None:
        parts.append(f"for key '{selector.key}'")
    if selector.reason is not None:
        parts.append(f"with reason '{selector.reason}'")
    return " ".join(parts) or "pending"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _store:
    """`with _store(dir) as store:` opens the metadata store for one command and closes it."""

    def __init__(self, state: StateLike):
        state = as_state(state)
        self.store = state.metadata

    def __enter__(self) -> MetadataStore:
        return self.store

    def __exit__(self, *exc: object) -> None:
        self.store.close()
