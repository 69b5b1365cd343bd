"""What a window coordinator commits to the metadata store, and how it is read back: the operator's state,
the rows classified per vBucket, the consumed-file marks, the accepted partial files, the windows closed but
not yet emitted, the vBuckets holding the watermark for their backlog, and the arrival-time policies' state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eventing.errors import ConfigError
from eventing.windows.runtime.arrivals import ArrivalGate
from eventing.windows.runtime.row_writer import RowLayout
from eventing.windows.semantics import Window, WindowOperator, WindowStateError
from eventing.windows.semantics.arrival import ArrivalPolicy
from eventing.windows.semantics.sessions import Session, SessionOperator
from eventing.windows.semantics.substreams import SubstreamWindow, SubstreamWindowOperator
from sharding import NUM_VBUCKETS

STATE_VERSION = 2  # 2: accepted files hold partial aggregates instead of rows


@dataclass(frozen=True)
class AcceptedBatch:
    """One file of accepted rows: ``seq`` orders them; event times span [min_ms, max_ms]."""

    name: str
    seq: int
    min_ms: int
    max_ms: int
    rows: int


@dataclass(frozen=True)
class PendingWindow:
    """A closed window not yet recorded as emitted; its rows are those of accepted batches up to
    ``closed_at``. A session (``group`` set) is [first row, last row + gap) of that group."""

    window: Window
    closed_at: int
    group: tuple | None = None
    substream: str | None = None  # windows closed per substream: the key value whose rows it holds

    def to_state(self) -> list[Any]:
        out: list[Any] = [self.window.start_ms, self.window.end_ms, self.closed_at]
        if self.substream is not None:
            return [*out, None, self.substream]
        return out if self.group is None else [*out, list(self.group)]

    @classmethod
    def from_state(cls, raw: list[Any]) -> PendingWindow:
        group = tuple(raw[3]) if len(raw) > 3 and raw[3] is not None else None
        substream = str(raw[4]) if len(raw) > 4 else None
        return cls(Window(int(raw[0]), int(raw[1])), int(raw[2]), group, substream)

    @classmethod
    def of(cls, closed: Window | Session | SubstreamWindow, closed_at: int) -> PendingWindow:
        """The pending window of what an operator closed, holding the batches accepted up to ``closed_at``."""
        if isinstance(closed, Session):
            return cls(Window(closed.start_ms, closed.end_ms), closed_at, closed.group)
        if isinstance(closed, SubstreamWindow):
            return cls(closed.window, closed_at, substream=closed.substream)
        return cls(closed, closed_at)

    @property
    def sink_id(self) -> tuple:
        """The window's id in the sink: ``(start, end)``, plus the substream when closed per substream."""
        w = self.window
        return (w.start_ms, w.end_ms) if self.substream is None else (w.start_ms, w.end_ms, self.substream)

    @property
    def job_key(self) -> tuple:
        """What the aggregator is asked for: ``(start, end)``, or ``(start, end, group)`` for a session."""
        w = self.window
        return (w.start_ms, w.end_ms) if self.group is None else (w.start_ms, w.end_ms, self.group)


@dataclass
class CoordinatorState:
    """The committed state of one function's coordinator (``fresh``: none was saved for this deployment)."""

    operator: WindowOperator | SessionOperator
    classified_upto: list[int]
    marks: dict[str, int]
    accepted: list[AcceptedBatch]
    next_seq: int
    pending: list[PendingWindow]
    waiting: dict[int, int]
    gate: ArrivalGate | None  # arrival-time policies: None leaves the rows as they are
    held: list[list[Any]]  # [file name, rows] of rows the policies have yet to judge
    held_next: int
    adjusted_next: int
    fresh: bool

    def encode(self, generation: int) -> dict[str, Any]:
        """The state as committed to the metadata store (``WindowStateStore.commit``)."""
        state = {
            "version": STATE_VERSION,
            "generation": generation,
            "operator": self.operator.to_state(),
            "classified_upto": {str(vb): s for vb, s in enumerate(self.classified_upto) if s},
            "marks": self.marks,
            "accepted": [[a.name, a.seq, a.min_ms, a.max_ms, a.rows] for a in self.accepted],
            "next_seq": self.next_seq,
            "pending": [p.to_state() for p in self.pending],
            "waiting": {str(vb): t for vb, t in self.waiting.items()},
        }
        if self.gate is not None:
            state.update(
                arrival=self.gate.policy.to_state(),
                held=self.held,
                held_next=self.held_next,
                adjusted_next=self.adjusted_next,
            )
        return state

    @classmethod
    def decode(
        cls,
        saved: dict[str, Any] | None,
        *,
        function: str,
        generation: int,
        layout: RowLayout,
        policies: bool,
        substream_windows: bool,
    ) -> CoordinatorState:
        """The state ``saved`` by a coordinator of this deployment, or a fresh one (none saved, or another
        generation's). ``policies``: the function judges rows with arrival-time policies;
        ``substream_windows``: windows close per substream."""
        spec = layout.spec
        if saved is not None and saved.get("generation") != generation:
            saved = None  # another deployment's windows: this one starts afresh
        if saved is not None and saved.get("version") != STATE_VERSION:
            raise ConfigError(
                f"window state of function '{function}' has version {saved.get('version')}; this build "
                f"reads version {STATE_VERSION}: undeploy and deploy the function again to reset it"
            )
        operator: WindowOperator | SessionOperator
        # Substreams close windows by each substream's clock (docs/time-semantics.md); sessions keep the
        # function's.
        windows_cls = SubstreamWindowOperator if substream_windows else WindowOperator
        if saved is None:
            operator = SessionOperator(spec) if spec.is_session else windows_cls(spec)
            return cls(
                operator,
                [0] * NUM_VBUCKETS,
                {},
                [],
                1,
                [],
                {},
                ArrivalGate(layout) if policies else None,
                [],
                1,
                1,
                fresh=True,
            )
        try:
            if spec.is_session:
                operator = SessionOperator.from_state(spec, saved["operator"])
            else:
                operator = windows_cls.from_state(spec, saved["operator"])
        except WindowStateError as exc:
            raise ConfigError(f"function '{function}': {exc}") from None
        classified_upto = [0] * NUM_VBUCKETS
        for vb, seqno in saved["classified_upto"].items():
            classified_upto[int(vb)] = int(seqno)
        gate = None
        if policies:
            policy = ArrivalPolicy.for_spec(spec)
            if saved.get("arrival") is not None:
                policy.restore(saved["arrival"])
            gate = ArrivalGate(layout, policy)
        return cls(
            operator,
            classified_upto,
            {k: int(v) for k, v in saved["marks"].items()},
            [AcceptedBatch(*a) for a in saved["accepted"]],
            int(saved["next_seq"]),
            [PendingWindow.from_state(raw) for raw in saved["pending"]],
            {int(vb): int(t) for vb, t in saved["waiting"].items()},
            gate,
            [list(h) for h in saved.get("held", [])],
            int(saved.get("held_next", 1)),
            int(saved.get("adjusted_next", 1)),
            fresh=False,
        )
