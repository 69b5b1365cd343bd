"""Rewinding a paused function: its checkpoints move back to a seqno or to a point in time, so resuming
handles the mutations after them again (like Kafka's offset reset or a Flink savepoint restore).

Exactly-once and the effect marks. Every binding write carries its source (vBucket, seqno); a bucket keeps,
per (function, vBucket), the highest source seqno whose effects it applied (its effect mark) and skips
writes at or below it. So:
- by default the marks stay: the handlers run again on the rewound range, and the binding writes they
  already applied are skipped (each effect still applies exactly once; `eventing verify` still passes).
  What is outside bindings (prints, logs, calls to other systems) happens again;
- with reapply_effects the marks of the moved vBuckets are lowered to the new checkpoints first, so the
  rewound range's binding writes apply again: a second time for every effect already applied.
Without reapply_effects a rewind below the deployment's feed boundary is refused (metadata.model.plan_rewind).
Windowed functions are refused: their window state would count the rewound mutations twice.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from eventing.core.definition import FunctionDefinition
from eventing.errors import ConfigError, LifecycleError
from eventing.storage.protocol import Maintenance
from eventing.storage.state import StateLike, as_state
from metadata import FunctionState
from metadata.model import check_rewind_allowed, plan_rewind
from sharding import NUM_VBUCKETS

# Epoch numbers at or above this are milliseconds (13 digits), below it seconds (10 digits today).
MS_EPOCH_THRESHOLD = 100_000_000_000
LATEST_TIME_S = 253_402_300_799  # 9999-12-31T23:59:59Z


@dataclass
class RewindResult:
    function: str
    target: str  # what was asked: "seqno 0", "time 2026-...Z"
    reapply_effects: bool
    moves: dict[int, tuple[int, int]] = field(default_factory=dict)  # vb -> (from, to)
    effect_marks_lowered: dict[str, int] = field(default_factory=dict)  # binding bucket -> vBuckets lowered

    @property
    def mutations_again(self) -> int:
        """Mutations the resumed function handles again (log entries between each old and new checkpoint)."""
        return sum(f - t for f, t in self.moves.values())

    def to_dict(self) -> dict:
        out = asdict(self)
        out["moves"] = {str(vb): {"from": f, "to": t} for vb, (f, t) in sorted(self.moves.items())}
        out["vbuckets_moved"] = len(self.moves)
        out["mutations_again"] = self.mutations_again
        out["effects"] = "reapplied" if self.reapply_effects else "kept"
        return out


def parse_time_ns(text: str) -> int:
    """ISO 8601 (a time without zone is UTC) or epoch seconds (milliseconds when 13 digits) -> ns."""
    try:
        number = float(text)
    except ValueError:
        pass
    else:
        seconds = number / 1000 if abs(number) >= MS_EPOCH_THRESHOLD else number
        _check_time_range(text, seconds)  # NaN and infinity too
        return int(seconds * 1_000_000_000)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"--to-time {text!r} is neither ISO 8601 (2026-01-31T12:00:00Z) nor epoch seconds (1767182400)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    _check_time_range(text, moment.timestamp())
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


def _check_time_range(text: str, seconds: float) -> None:
    """Mutations are written after 1970 and datetimes end with year 9999 (a larger number would not fit the
    log's 64-bit integers either)."""
    if not 0 <= seconds < LATEST_TIME_S + 1:
        raise ConfigError(
            f"--to-time {text[:40]} is out of range; give a time from 1970-01-01T00:00:00Z to "
            f"9999-12-31T23:59:59Z: ISO 8601, or epoch seconds 0 to {MS_EPOCH_THRESHOLD - 1} (a larger "
            f"number is epoch milliseconds, up to {LATEST_TIME_S * 1000 + 999})"
        )


def rewind(
    state: StateLike,
    name: str,
    *,
    to_seqno: int | None = None,
    to_time: str | None = None,
    vb: int | None = None,
    reapply_effects: bool = False,
) -> RewindResult:
    """Rewind a paused function's checkpoints to `to_seqno`, or to the last seqno before `to_time` (the
    arrival time of a mutation is its write time in the source log), in every vBucket or in `vb` only."""
    state = as_state(state)
    if (to_seqno is None) == (to_time is None):
        raise ConfigError("give exactly one of --to-seqno N and --to-time TIME")
    if vb is not None and not 0 <= vb < NUM_VBUCKETS:
        raise ConfigError(f"vBucket {vb} does not exist; vBuckets are numbered 0..{NUM_VBUCKETS - 1}")
    with state.metadata as store:
        record = store.get_function(name)
        check_rewind_allowed(name, record.state)
        defn = FunctionDefinition.from_dict(record.definition)
        if defn.window is not None:
            raise LifecycleError(
                f"cannot rewind function '{name}': it aggregates windows, whose state would count the "
                "rewound mutations twice; undeploy and deploy it to compute its windows afresh"
            )
        cps = store.checkpoints(name)
        if not cps:
            raise LifecycleError(f"function '{name}' has no checkpoints to rewind; deploy it first")
        starts = store.checkpoint_starts(name)
        vbs = [vb] if vb is not None else sorted(cps)
        if to_seqno is not None:
            if to_seqno < 0:
                raise ConfigError(f"--to-seqno {to_seqno}: seqnos start at 0")
            targets = dict.fromkeys(vbs, to_seqno)
            described = f"seqno {to_seqno}"
        else:
            assert to_time is not None
            time_ns = parse_time_ns(to_time)
            source: Maintenance = state.open_bucket(defn.source_bucket)
            try:
                before = source.seqnos_before(time_ns)
            finally:
                source.close()
            targets = {v: before[v] for v in vbs if v in before}  # others: nothing arrived since then
            shown = (
                datetime.fromtimestamp(time_ns / 1e9, UTC)
                .isoformat(timespec="milliseconds")
                .replace("+00:00", "Z")
            )
            described = f"time {shown}"
        result = RewindResult(name, described, reapply_effects)
        current = {v: (cp.seqno, cp.epoch, starts.get(v)) for v, cp in cps.items()}
        planned = plan_rewind(name, current, targets, reapply_effects)  # refuses before anything is changed
        if reapply_effects:
            # Every vBucket in scope, moved or not: effects after min(target, checkpoint) apply again (a
            # function rewound earlier with its marks kept can have them lowered now). Marks first: if the
            # rewind below then fails, the marks only let effects apply that the user asked to apply again.
            lowered = {v: min(t, current[v][0]) for v, t in targets.items() if v in current}
            for bucket_name in sorted({b.bucket for b in defn.bindings if b.access == "rw"}):
                bucket: Maintenance = state.open_bucket(bucket_name)
                try:
                    result.effect_marks_lowered[bucket_name] = len(bucket.lower_effect_marks(name, lowered))
                finally:
                    bucket.close()
        if not planned:
            return result
        result.moves = store.rewind_checkpoints(name, targets, reapply_effects=reapply_effects)
        if store.get_function(name).state is not FunctionState.PAUSED:  # resumed by another process meanwhile
            raise LifecycleError(
                f"function '{name}' was resumed while being rewound; pause it and rewind again"
            )
        return result
