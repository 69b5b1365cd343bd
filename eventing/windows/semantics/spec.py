"""The window declaration of a function: window shape, time boundary, grouping, aggregates, time tolerances,
sink."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, cast, get_args

from eventing.core import durations

WindowKind = Literal["tumbling", "hopping", "session"]
TimeBoundary = Literal["event_time", "processing_time"]
AggregateOp = Literal["count", "sum", "avg", "min", "max"]
SinkKind = Literal["parquet", "sqlite"]
PolicyAction = Literal["adjust", "drop"]
POLICY_ACTIONS: tuple[str, ...] = get_args(PolicyAction)

WINDOW_KINDS: tuple[str, ...] = get_args(WindowKind)
TIME_BOUNDARIES: tuple[str, ...] = get_args(TimeBoundary)
AGGREGATE_OPS: tuple[str, ...] = get_args(AggregateOp)
SINK_KINDS: tuple[str, ...] = get_args(SinkKind)

# Result tables carry the window as these two columns (the same names as eventing.windows.batches), so a
# group-by field or an aggregate may not take them.
RESERVED_COLUMNS: tuple[str, ...] = ("window_start_ms", "window_end_ms")

_MS = timedelta(milliseconds=1)


class WindowConfigError(ValueError):
    """A window declaration that cannot run. The message names the field and the fix.

    ``field`` is the offending key (``aggregates[1].field`` for nested ones); ``owner`` is what the message
    speaks of, ``window`` or ``window of function 'fn_score'``.
    """

    def __init__(self, field: str, detail: str, *, owner: str = "window") -> None:
        self.field = field
        self.detail = detail
        self.owner = owner
        super().__init__(f"{owner} {detail}")

    def for_owner(self, owner: str) -> WindowConfigError:
        """The same error, speaking of another owner (a named function)."""
        return WindowConfigError(self.field, self.detail, owner=owner)


def parse_duration(value: Any, *, field: str = "duration") -> timedelta:
    """eventing.core.durations.parse_duration, failing with a WindowConfigError that names the field."""
    try:
        return durations.parse_duration(value, field=field)
    except durations.DurationError as exc:
        raise WindowConfigError(field, str(exc)) from None


format_duration = durations.format_duration
duration_ms = durations.duration_ms


@dataclass(frozen=True)
class Aggregate:
    """One aggregate column of a window result: ``op`` over document ``field`` stored as column ``name``.

    ``count`` with ``field=None`` counts rows; with a field it counts rows whose field is present and not
    null. The other ops need a field. ``name`` defaults to ``count`` or ``<op>_<field>``.
    """

    op: AggregateOp
    field: str | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if self.op not in AGGREGATE_OPS:
            raise WindowConfigError(
                "aggregates", f"has aggregate op {self.op!r}; use one of {', '.join(AGGREGATE_OPS)}"
            )
        if self.field is not None and (not isinstance(self.field, str) or not self.field):
            raise WindowConfigError(
                "aggregates", f"has aggregate {self.op} over field {self.field!r}; name a document field"
            )
        if self.field is None and self.op != "count":
            raise WindowConfigError(
                "aggregates",
                f"has aggregate {self.op} without a field; {self.op} needs the document field it reads, "
                "e.g. {'op': '" + self.op + "', 'field': 'amount'}",
            )
        if not isinstance(self.name, str):
            raise WindowConfigError("aggregates", f"has aggregate name {self.name!r}; names are strings")
        if not self.name:
            object.__setattr__(self, "name", "count" if self.field is None else f"{self.op}_{self.field}")

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "field": self.field, "name": self.name}


@dataclass(frozen=True)
class WindowSink:
    """Where closed-window results are written; ``path=None`` lets the runtime pick one under its data dir."""

    kind: SinkKind = "parquet"
    path: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in SINK_KINDS:
            raise WindowConfigError(
                "sink.kind", f"has sink kind {self.kind!r}; use one of {', '.join(SINK_KINDS)}"
            )
        if self.path is not None and (not isinstance(self.path, str) or not self.path):
            raise WindowConfigError(
                "sink.path", f"has sink path {self.path!r}; give a non-empty path or omit it"
            )

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path}


_EVENT_TIME_ONLY = (
    "time_field",
    "out_of_order_tolerance",
    "allowed_lateness",
    "partition_idle_timeout",
    "idle_timeout",
    "early_arrival_policy",
    "out_of_order_policy",
    "late_arrival_tolerance",
    "late_arrival_policy",
    "substream_key",
)


@dataclass(frozen=True)
class WindowSpec:
    """A validated window declaration. Construction raises WindowConfigError for anything that cannot run.

    Windows are [start, end) in epoch milliseconds, aligned to the Unix epoch (UTC) plus ``offset`` (less
    than the slide; ``offset='-5h'`` is not allowed, give ``19h`` for days in UTC-5). A tumbling window has
    ``slide == size`` (filled in when ``slide`` is omitted); a hopping window needs ``0 < slide <= size``
    with ``size`` a whole multiple of ``slide``, so every time falls in exactly ``size / slide`` windows.

    Event time (``boundary="event_time"``) reads ``time_field`` (epoch ms, UTC) from each document. The
    watermark of a partition is its greatest event time minus ``out_of_order_tolerance``; a window closes
    when the function's watermark reaches ``end + allowed_lateness``. A partition silent for
    ``partition_idle_timeout`` stops holding the watermark back; once processing time passes an open
    window's end and the whole source has been silent for ``idle_timeout``, that window closes anyway.
    Zero tolerance/lateness and ``None`` timeouts mean off.

    A session window (``kind="session"``) has no size: per group, rows at most ``gap`` apart in time form one
    session [first row, last row + gap), sessions merge when a row bridges them, and a session closes when
    the watermark reaches its end + ``allowed_lateness``. ``max_duration`` cuts sessions at multiples of it
    (from the epoch plus ``offset``; Azure checks its maximum duration on the same grid), so no session spans
    more than ``max_duration``. Processing-time windows use the arrival time
    and close on the clock, so they refuse the event-time settings.
    """

    kind: WindowKind
    size: timedelta = timedelta(0)
    slide: timedelta | None = None
    boundary: TimeBoundary = "event_time"
    time_field: str | None = None
    group_by: tuple[str, ...] = ()
    aggregates: tuple[Aggregate, ...] = (Aggregate("count"),)
    out_of_order_tolerance: timedelta = timedelta(0)
    allowed_lateness: timedelta = timedelta(0)
    partition_idle_timeout: timedelta | None = None
    idle_timeout: timedelta | None = None
    sink: WindowSink = WindowSink()
    offset: timedelta = timedelta(0)
    gap: timedelta | None = None
    max_duration: timedelta | None = None
    # Azure's arrival-time policies (eventing.windows.semantics.arrival); None leaves each off.
    early_arrival_policy: PolicyAction | None = None
    out_of_order_policy: PolicyAction | None = None
    late_arrival_tolerance: timedelta | None = None
    late_arrival_policy: PolicyAction | None = None  # None: adjust, once a late_arrival_tolerance is set
    substream_key: str | None = None

    def __post_init__(self) -> None:
        # Lists from Python callers become tuples so the spec stays hashable and immutable.
        object.__setattr__(self, "group_by", tuple(self.group_by))
        object.__setattr__(self, "aggregates", tuple(self.aggregates))
        self._check_shape()
        self._check_time()
        self._check_columns()
        if not isinstance(self.sink, WindowSink):
            raise WindowConfigError("sink", f"has sink {self.sink!r}; use WindowSink(kind, path)")

    def _check_shape(self) -> None:
        if self.kind not in WINDOW_KINDS:
            raise WindowConfigError("kind", f"has kind {self.kind!r}; use 'tumbling', 'hopping' or 'session'")
        _check_duration("offset", self.offset)
        if self.kind == "session":
            self._check_session()
            return
        for name in ("gap", "max_duration"):
            if getattr(self, name) is not None:
                raise WindowConfigError(
                    name,
                    f"is {self.kind} but has {name}; {name} is for session windows: remove it or set kind "
                    "to session",
                )
        _check_duration("size", self.size)
        if self.size <= timedelta(0):
            raise WindowConfigError(
                "size", f"has size {_show(self.size)}; size must be positive, such as '5m'"
            )
        if self.kind == "tumbling":
            if self.slide is not None and self.slide != self.size:
                raise WindowConfigError(
                    "slide",
                    f"is tumbling with size {_show(self.size)} but slide {_show(self.slide)}; "
                    "remove slide, or set kind to hopping",
                )
            object.__setattr__(self, "slide", self.size)
            self._check_offset(self.size)
            return
        if self.slide is None:
            raise WindowConfigError(
                "slide", "is hopping but has no slide; set slide, such as '1m', to at most size"
            )
        _check_duration("slide", self.slide)
        if self.slide <= timedelta(0):
            raise WindowConfigError(
                "slide", f"has slide {_show(self.slide)}; slide must be positive, such as '1m'"
            )
        if self.slide > self.size:
            raise WindowConfigError(
                "slide",
                f"has slide {_show(self.slide)} longer than size {_show(self.size)}, which would skip "
                "events; make slide at most size",
            )
        if self.size % self.slide:
            raise WindowConfigError(
                "slide",
                f"has size {_show(self.size)} that is not a whole multiple of slide {_show(self.slide)}; "
                "choose a slide that divides size, so every event falls in size/slide windows",
            )
        self._check_offset(self.slide)

    def _check_offset(self, period: timedelta) -> None:
        if self.offset >= period:
            raise WindowConfigError(
                "offset",
                f"has offset {_show(self.offset)}, not shorter than the "
                f"{'slide' if self.kind == 'hopping' else 'size'} {_show(period)}; use an offset from 0 up "
                f"to (not including) {_show(period)}",
            )

    def _check_session(self) -> None:
        if self.gap is None:
            raise WindowConfigError(
                "gap",
                "is a session window without a gap; set gap, such as '30s' (rows at most that far apart form "
                "one session)",
            )
        _check_duration("gap", self.gap)
        if self.gap <= timedelta(0):
            raise WindowConfigError(
                "gap", f"has gap {_show(self.gap)}; a session gap must be positive, such as '30s'"
            )
        if self.size != timedelta(0) or self.slide is not None:
            raise WindowConfigError(
                "size",
                "is a session window with a size or slide; sessions are as long as their rows: "
                "remove size and slide (gap sets when a session ends, max_duration caps it)",
            )
        if self.max_duration is not None:
            _check_duration("max_duration", self.max_duration)
            if self.max_duration <= self.gap:
                raise WindowConfigError(
                    "max_duration",
                    f"has max_duration {_show(self.max_duration)}, not longer than the gap "
                    f"{_show(self.gap)}; make it longer than gap, or remove it",
                )
            if self.offset >= self.max_duration:
                raise WindowConfigError(
                    "offset",
                    f"has offset {_show(self.offset)}, not shorter than max_duration; make it shorter",
                )
        elif self.offset != timedelta(0):
            raise WindowConfigError(
                "offset",
                "is a session window with an offset but no max_duration; the offset only aligns "
                "max_duration: remove it or set max_duration",
            )

    def _check_time(self) -> None:
        if self.boundary not in TIME_BOUNDARIES:
            raise WindowConfigError(
                "boundary", f"has boundary {self.boundary!r}; use 'event_time' or 'processing_time'"
            )
        for name in ("out_of_order_tolerance", "allowed_lateness"):
            _check_duration(name, getattr(self, name))
        for name in ("partition_idle_timeout", "idle_timeout"):
            value = getattr(self, name)
            if value is not None:
                _check_duration(name, value)
                if value <= timedelta(0):
                    raise WindowConfigError(
                        name, f"has {name} {_show(value)}; make it positive, or remove it to turn it off"
                    )
        self._check_policies()
        if self.boundary == "processing_time":
            for name in _EVENT_TIME_ONLY:
                value = getattr(self, name)
                if value is not None and value != timedelta(0):
                    raise WindowConfigError(
                        name,
                        f"uses processing time; {name} only applies to event-time windows: "
                        "remove it or set boundary to event_time",
                    )
            return
        if not isinstance(self.time_field, str) or not self.time_field:
            raise WindowConfigError(
                "time_field",
                "uses event time but has no time_field; name the document field holding the event time "
                "(epoch ms, UTC), or set boundary to processing_time",
            )

    def _check_policies(self) -> None:
        for name in ("early_arrival_policy", "out_of_order_policy", "late_arrival_policy"):
            value = getattr(self, name)
            if value is not None and value not in POLICY_ACTIONS:
                raise WindowConfigError(
                    name,
                    f"has {name} {value!r}; use 'adjust' or 'drop' (or remove it to leave the policy off)",
                )
        if self.late_arrival_tolerance is not None:
            _check_duration("late_arrival_tolerance", self.late_arrival_tolerance)
        elif self.late_arrival_policy is not None:
            raise WindowConfigError(
                "late_arrival_policy",
                "has a late_arrival_policy but no late_arrival_tolerance; set late_arrival_tolerance, such "
                "as '5m'",
            )
        if self.substream_key is not None:
            if not isinstance(self.substream_key, str) or not self.substream_key:
                raise WindowConfigError(
                    "substream_key",
                    f"has substream_key {self.substream_key!r}; name a document field, such as 'device_id'",
                )
            if self.late_arrival_tolerance is None:
                raise WindowConfigError(
                    "substream_key",
                    "has substreams but no late_arrival_tolerance, which bounds how far substreams drift "
                    "apart; set late_arrival_tolerance, such as '5m'",
                )

    @property
    def uses_arrival_policies(self) -> bool:
        """Whether rows are judged against their arrival time (needs each mutation's arrival time)."""
        return any(
            getattr(self, name) is not None
            for name in (
                "early_arrival_policy",
                "out_of_order_policy",
                "late_arrival_tolerance",
                "substream_key",
            )
        )

    @property
    def late_arrival_tolerance_ms(self) -> int | None:
        return None if self.late_arrival_tolerance is None else duration_ms(self.late_arrival_tolerance)

    def _check_columns(self) -> None:
        seen: set[str] = set()
        for name in self.group_by:
            if not isinstance(name, str) or not name:
                raise WindowConfigError("group_by", f"groups by {name!r}; name document fields as strings")
            if name in RESERVED_COLUMNS:
                raise WindowConfigError(
                    "group_by", f"groups by {name!r}, a column the window result reserves; rename the field"
                )
            if name in seen:
                raise WindowConfigError("group_by", f"groups by {name!r} twice; list each field once")
            seen.add(name)
        if not self.aggregates:
            raise WindowConfigError("aggregates", "has no aggregates; add one, such as {'op': 'count'}")
        for i, agg in enumerate(self.aggregates):
            where = f"aggregates[{i}]"
            if not isinstance(agg, Aggregate):
                raise WindowConfigError(where, f"has aggregate {agg!r}; use Aggregate(op, field, name)")
            if agg.name in RESERVED_COLUMNS or agg.name in self.group_by:
                raise WindowConfigError(
                    f"{where}.name",
                    f"names aggregate {agg.op} {agg.name!r}, which is already a column of the result; "
                    "give it another name",
                )
            if agg.name in seen:
                raise WindowConfigError(
                    f"{where}.name", f"has two columns named {agg.name!r}; give each aggregate its own name"
                )
            seen.add(agg.name)

    # Milliseconds, for the window maths and the runtime.
    @property
    def size_ms(self) -> int:
        return duration_ms(self.size)

    @property
    def slide_ms(self) -> int:
        return duration_ms(self.slide if self.slide is not None else self.size)

    @property
    def windows_per_event(self) -> int:
        return self.size_ms // self.slide_ms

    @property
    def offset_ms(self) -> int:
        return duration_ms(self.offset)

    @property
    def is_session(self) -> bool:
        return self.kind == "session"

    @property
    def gap_ms(self) -> int:
        """The session gap (0 for tumbling and hopping windows)."""
        return 0 if self.gap is None else duration_ms(self.gap)

    @property
    def max_duration_ms(self) -> int | None:
        return None if self.max_duration is None else duration_ms(self.max_duration)

    @property
    def out_of_order_tolerance_ms(self) -> int:
        return duration_ms(self.out_of_order_tolerance)

    @property
    def allowed_lateness_ms(self) -> int:
        return duration_ms(self.allowed_lateness)

    @property
    def partition_idle_timeout_ms(self) -> int | None:
        return None if self.partition_idle_timeout is None else duration_ms(self.partition_idle_timeout)

    @property
    def idle_timeout_ms(self) -> int | None:
        return None if self.idle_timeout is None else duration_ms(self.idle_timeout)

    @property
    def arrival_gap_ms(self) -> int | None:
        """The shortest silence of the source (between two arrival times) after which a timeout can fire:
        the lesser of the two idle timeouts, None when neither is set (arrival times then only mark
        activity). Event-time windows only."""
        timeouts = [t for t in (self.idle_timeout_ms, self.partition_idle_timeout_ms) if t is not None]
        return min(timeouts) if timeouts and self.boundary == "event_time" else None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, function: str | None = None) -> WindowSpec:
        """Read the ``window`` object of a JSON function definition; errors name ``function`` when given.

        Keys: kind, size, slide (hopping), gap and max_duration (session), offset, boundary, time_field,
        group_by (list, or one field as a string), aggregates (list of {op, field, name}),
        out_of_order_tolerance, allowed_lateness, partition_idle_timeout, idle_timeout (durations; null for
        off), sink ({kind, path}).
        """
        owner = "window" if function is None else f"window of function '{function}'"
        try:
            return cls._from_dict(data)
        except WindowConfigError as exc:
            raise exc.for_owner(owner) from None

    @classmethod
    def _from_dict(cls, data: Mapping[str, Any]) -> WindowSpec:
        if not isinstance(data, Mapping):
            raise WindowConfigError("window", f"is {data!r}; declare it as a JSON object with kind and size")
        known = cls.__dataclass_fields__
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise WindowConfigError(
                unknown[0],
                f"has unknown key(s) {', '.join(map(repr, unknown))}; fix the spelling or remove them "
                f"(known keys: {', '.join(known)})",
            )
        if data.get("kind") is None:
            raise WindowConfigError("kind", "has no kind; set it (for example kind 'tumbling', size '5m')")
        kwargs: dict[str, Any] = {"kind": data["kind"]}
        if data["kind"] == "session":
            if data.get("gap") is None:
                raise WindowConfigError(
                    "gap",
                    "is a session window without a gap; set gap, such as '30s' (rows at most that far apart "
                    "form one session)",
                )
        elif data.get("size") is None:
            raise WindowConfigError("size", "has no size; set it (for example kind 'tumbling', size '5m')")
        for name in ("size", "slide", "offset", "gap", "max_duration"):
            if data.get(name) is not None:
                kwargs[name] = parse_duration(data[name], field=name)
        for name in (
            "boundary",
            "time_field",
            "early_arrival_policy",
            "out_of_order_policy",
            "late_arrival_policy",
            "substream_key",
        ):
            if data.get(name) is not None:
                kwargs[name] = data[name]
        if data.get("late_arrival_tolerance") is not None:
            kwargs["late_arrival_tolerance"] = parse_duration(
                data["late_arrival_tolerance"], field="late_arrival_tolerance"
            )
        for name in ("out_of_order_tolerance", "allowed_lateness", "partition_idle_timeout", "idle_timeout"):
            if data.get(name) is not None:
                kwargs[name] = parse_duration(data[name], field=name)
        if data.get("group_by") is not None:
            group_by = data["group_by"]
            if isinstance(group_by, str):
                group_by = [group_by]
            if not isinstance(group_by, list | tuple):
                raise WindowConfigError("group_by", f"has group_by {group_by!r}; give a list of field names")
            kwargs["group_by"] = tuple(group_by)
        if data.get("aggregates") is not None:
            kwargs["aggregates"] = tuple(
                _aggregate_from(i, raw) for i, raw in enumerate(_as_list(data["aggregates"]))
            )
        if data.get("sink") is not None:
            kwargs["sink"] = _sink_from(data["sink"])
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form ``from_dict`` reads back to an equal spec."""
        out: dict[str, Any] = {"kind": self.kind}
        if self.kind == "session":
            out["gap"] = format_duration(self.gap_ms * _MS)
            if self.max_duration is not None:
                out["max_duration"] = format_duration(self.max_duration)
        else:
            out["size"] = format_duration(self.size)
        if self.kind == "hopping":
            out["slide"] = format_duration(self.slide_ms * _MS)
        if self.offset:
            out["offset"] = format_duration(self.offset)
        out["boundary"] = self.boundary
        out["time_field"] = self.time_field
        out["group_by"] = list(self.group_by)
        out["aggregates"] = [agg.to_dict() for agg in self.aggregates]
        out["out_of_order_tolerance"] = format_duration(self.out_of_order_tolerance)
        out["allowed_lateness"] = format_duration(self.allowed_lateness)
        for name in ("partition_idle_timeout", "idle_timeout"):
            value = getattr(self, name)
            out[name] = None if value is None else format_duration(value)
        out["sink"] = self.sink.to_dict()
        for name in ("early_arrival_policy", "out_of_order_policy", "late_arrival_policy", "substream_key"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.late_arrival_tolerance is not None:
            out["late_arrival_tolerance"] = format_duration(self.late_arrival_tolerance)
        return out


def _check_duration(name: str, value: Any) -> None:
    if not isinstance(value, timedelta):
        raise WindowConfigError(
            name, f"has {name} {value!r}; give a timedelta (or a string like '30s' in JSON)"
        )
    if value < timedelta(0):
        raise WindowConfigError(name, f"has negative {name} {_show(value)}; durations are zero or more")
    if value % _MS:
        raise WindowConfigError(name, f"has {name} {value!r}, finer than a millisecond; round it to 1ms")


def _show(value: timedelta) -> str:
    if value >= timedelta(0) and not value % _MS:
        return repr(format_duration(value))
    return repr(value)


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, list | tuple):
        return list(value)
    raise WindowConfigError(
        "aggregates", f"has aggregates {value!r}; give a list such as [{{'op': 'count'}}]"
    )


def _aggregate_from(index: int, raw: Any) -> Aggregate:
    where = f"aggregates[{index}]"
    if isinstance(raw, str):  # "count" is shorthand for {"op": "count"}
        raw = {"op": raw}
    if not isinstance(raw, Mapping):
        raise WindowConfigError(
            where, f"has {where} {raw!r}; give an object such as {{'op': 'sum', 'field': 'amount'}}"
        )
    unknown = sorted(set(raw) - {"op", "field", "name"})
    if unknown:
        raise WindowConfigError(
            where, f"has unknown key(s) {', '.join(map(repr, unknown))} in {where}; use op, field and name"
        )
    if raw.get("op") is None:
        raise WindowConfigError(f"{where}.op", f"has no op in {where}; use one of {', '.join(AGGREGATE_OPS)}")
    try:
        return Aggregate(cast(AggregateOp, raw["op"]), raw.get("field"), raw.get("name") or "")
    except WindowConfigError as exc:
        raise WindowConfigError(where, exc.detail) from None


def _sink_from(raw: Any) -> WindowSink:
    if isinstance(raw, str):  # "sqlite" is shorthand for {"kind": "sqlite"}
        raw = {"kind": raw}
    if not isinstance(raw, Mapping):
        raise WindowConfigError("sink", f"has sink {raw!r}; give an object such as {{'kind': 'parquet'}}")
    unknown = sorted(set(raw) - {"kind", "path"})
    if unknown:
        raise WindowConfigError(
            "sink", f"has unknown key(s) {', '.join(map(repr, unknown))} in sink; use kind and path"
        )
    return WindowSink(raw.get("kind", "parquet"), raw.get("path"))
