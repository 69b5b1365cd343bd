"""Windows closed by each substream's own clock (Azure ``TIMESTAMP BY ... OVER key``, docs/time-semantics.md,
seed 003): the pure semantics (``SubstreamWindowOperator``), the sink's per-substream window ids, and the
coordinator emitting each device's windows when that device's watermark passes them, with the pure-Python
aggregator. The Ray and Spark version is in tests/integration/test_window_arrival_policies.py."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from eventing.control import lifecycle
from eventing.core.definition import FunctionDefinition
from eventing.storage.bucket import LocalBucket
from eventing.testing.windows import ManualClock, python_aggregate, python_aggregator, results_sink
from eventing.windows.runtime.coordinator import WindowCoordinator
from eventing.windows.runtime.row_writer import RowLayout, WindowRowWriter
from eventing.windows.semantics import Window, WindowSpec
from eventing.windows.semantics.substreams import SubstreamWindow, SubstreamWindowOperator
from eventing.windows.spark.sink import ParquetWindowSink, SqliteWindowSink
from metadata.factory import open_store

T0 = 1_767_268_800_000  # 2026-01-01T12:00:00Z
S = 1_000
MIN = 60_000
SPEC = {
    "kind": "tumbling",
    "size": "1m",
    "time_field": "ts",
    "group_by": ["device"],
    "aggregates": ["count"],
    "out_of_order_tolerance": "0s",
    "late_arrival_tolerance": "5m",
    "substream_key": "device",
}


def operator(**changes) -> SubstreamWindowOperator:
    return SubstreamWindowOperator(WindowSpec.from_dict(dict(SPEC, **changes)))


def feed(op: SubstreamWindowOperator, rows: list[tuple[str, int, int]]) -> list:
    """Rows (device, event ms, arrival ms) as one batch, then an advance: the windows that closed."""
    fate = op.observe_batch(
        [0] * len(rows),
        [t for _, t, _ in rows],
        T0,
        arrival_ms=max(a for _, _, a in rows),
        substreams=[d for d, _, _ in rows],
    )
    assert fate.late_count == 0
    return op.advance(T0)


def w(device: str, minute: int) -> SubstreamWindow:
    return SubstreamWindow(Window(T0 + minute * MIN, T0 + (minute + 1) * MIN), device)


def test_each_device_closes_its_windows_by_its_own_watermark():
    """A fast device does not close a slow device's windows, and a slow one does not hold back a fast
    one's."""
    op = operator()
    assert op.per_substream
    # The slow device's clock runs 2 minutes behind (within the 5-minute late-arrival tolerance).
    assert feed(op, [("fast", T0 + 30 * S, T0 + 30 * S), ("slow", T0 - 90 * S, T0 + 30 * S)]) == []
    closed = feed(op, [("fast", T0 + 70 * S, T0 + 70 * S)])
    assert closed == [w("fast", 0)]  # fast passed 12:01; slow, at 11:58:30, keeps its 11:58 window open
    assert op.substream_watermark_ms("slow") == T0 - 90 * S
    assert [x for x in op.open_substream_windows if x.substream == "slow"] == [w("slow", -2)]
    closed = feed(op, [("slow", T0 - 50 * S, T0 + 80 * S)])
    assert closed == [w("slow", -2)]  # slow's own clock passed 11:59: its window closes, fast's 12:01 stays
    assert op.open_substream_windows == (w("slow", -1), w("fast", 1))
    # Function-wide closing would have waited for the slowest device: fast's 12:00 window closed at once.


def test_a_silent_device_closes_as_the_arrival_clock_moves_on():
    """Seed 003: "when there are no incoming events, the watermark is the current estimated arrival time
    minus the late arrival tolerance" (here 5 minutes); the arrival clock is the newest row's arrival time."""
    op = operator()
    feed(op, [("quiet", T0 + 10 * S, T0 + 10 * S), ("busy", T0 + 10 * S, T0 + 10 * S)])
    # The quiet device sends nothing more; the busy one goes on. Its [12:00, 12:01) closes once arrival
    # time - 5 minutes reaches 12:01, at an arrival time of 12:06.
    for second in range(20, 6 * 60, 20):
        closed = feed(op, [("busy", T0 + second * S, T0 + second * S)])
        assert w("quiet", 0) not in closed
    assert op.substream_watermark_ms("quiet") == T0 + 5 * MIN + 40 * S - 5 * MIN
    assert feed(op, [("busy", T0 + 6 * MIN, T0 + 6 * MIN)]) == [w("quiet", 0), w("busy", 5)]
    # The floor alone closes windows too (advance_arrival_clock: every earlier arrival has been judged).
    op.observe_batch([0], [T0 + 7 * MIN], T0, arrival_ms=T0 + 7 * MIN, substreams=["quiet"])
    assert op.advance_arrival_clock(T0 + 13 * MIN) == [w("busy", 6), w("quiet", 7)]


def test_rows_of_a_closed_substream_window_are_late_and_others_are_not():
    op = operator()
    feed(op, [("a", T0 + 10 * S, T0 + 10 * S), ("b", T0 + 10 * S, T0 + 10 * S)])
    feed(op, [("a", T0 + 2 * MIN, T0 + 2 * MIN)])  # closes a's 12:00 window, not b's
    fate = op.observe_batch(
        [0, 0], [T0 + 20 * S, T0 + 20 * S], T0, arrival_ms=T0 + 2 * MIN, substreams=["a", "b"]
    )
    assert fate.late == [True, False]
    assert op.late_rows == 1


def test_without_the_key_in_group_by_windows_close_on_the_arrival_clock_minus_the_tolerance():
    """group_by without the substream key: a result mixes devices, including ones not seen yet whose rows may
    lie up to the late-arrival tolerance before their arrival, so a window waits for arrival clock - 5 min."""
    op = operator(group_by=[])
    assert not op.per_substream
    assert feed(op, [("a", T0 + 10 * S, T0 + 10 * S), ("b", T0 - 3 * MIN, T0 + 10 * S)]) == []
    assert feed(op, [("b", T0 - 110 * S, T0 + 20 * S)]) == []  # both devices are past 11:58, yet c may come
    assert op.watermark_ms == T0 + 20 * S - 5 * MIN
    fate = op.observe_batch([0], [T0 - 4 * MIN - 30 * S], T0, arrival_ms=T0 + 30 * S, substreams=["c"])
    assert fate.late_count == 0  # a new device at 11:55:30, arriving 12:00:30: within the tolerance
    closed = feed(op, [("a", T0 + 7 * MIN, T0 + 7 * MIN)])  # arrival 12:07 - 5 min = 12:02
    assert closed == [Window(T0 + s * MIN, T0 + (s + 1) * MIN) for s in (-5, -3, -2, 0)]
    assert op.watermark_ms == T0 + 2 * MIN


def test_the_state_resumes_exactly_and_refuses_a_changed_grouping():
    op = operator()
    feed(op, [("fast", T0 + 30 * S, T0 + 30 * S), ("slow", T0 - 90 * S, T0 + 30 * S)])
    again = SubstreamWindowOperator.from_state(WindowSpec.from_dict(SPEC), op.to_state())
    assert again.to_state() == op.to_state()
    rows = [("fast", T0 + 3 * MIN, T0 + 3 * MIN)]
    assert feed(again, rows) == feed(op, rows) == [w("fast", 0)]  # slow (11:58:30) is above the floor, 11:58
    assert again.to_state() == op.to_state()
    from eventing.windows.semantics import WindowStateError

    with pytest.raises(WindowStateError, match="group_by"):
        SubstreamWindowOperator.from_state(WindowSpec.from_dict(dict(SPEC, group_by=[])), op.to_state())


@pytest.mark.parametrize("kind", ["parquet", "sqlite", "postgresql"])
def test_sinks_keep_the_first_write_per_window_and_substream(tmp_path, kind, request):
    if kind == "postgresql":
        from eventing.windows.spark.postgres_sink import PostgresWindowSink

        sink: Any = PostgresWindowSink.open(request.getfixturevalue("pg_url"))
    else:
        sink = ParquetWindowSink(tmp_path) if kind == "parquet" else SqliteWindowSink(tmp_path / "r.db")
    results = pa.table(
        {"window_start_ms": [0, 0], "window_end_ms": [60, 60], "device": ["d1", "d/2 é"], "count": [1, 2]}
    )
    only_first = results.slice(0, 1)
    assert sink.write("fn", only_first, windows=[(0, 60, "d1")], substream="device") == 1
    assert sink.written_windows("fn") == {(0, 60, "d1")}
    # The other device's window of the same bounds closes later: it is written then, d1's is not rewritten.
    assert (
        sink.write(
            "fn", results, windows=[(0, 60, "d1"), (0, 60, "d/2 é"), (0, 60, "d3")], substream="device"
        )
        == 2
    )
    assert sink.written_windows("fn") == {(0, 60, "d1"), (0, 60, "d/2 é"), (0, 60, "d3")}
    assert sink.read("fn").to_pylist() == sorted(results.to_pylist(), key=lambda r: r["device"])


# -- the coordinator -------------------------------------------------------------------------------------

FN = "fn_paces"


def test_the_coordinator_emits_each_devices_windows_when_its_own_watermark_passes_them(
    data_dir, window_files
):
    """Two devices at different paces and one that falls silent, delivered in two rounds with a restart
    between: each round emits exactly the windows a plain computation of each device's watermark closes."""
    from eventing.core.mutation import decode_document

    source = LocalBucket.create(data_dir, "src")
    window = dict(SPEC, aggregates=["count", {"op": "sum", "field": "v"}], out_of_order_tolerance="30s")
    lifecycle.save_function(
        data_dir,
        FunctionDefinition.from_dict({"name": FN, "source_bucket": "src", "window": window}),
        '"""Window-only."""\n',
    )
    lifecycle.deploy(data_dir, FN)
    layout = RowLayout.for_definition(FN, window)
    rows = []  # (device, event, arrival)
    for i in range(36):  # every 20 s of arrival, 12 minutes
        arrival = T0 + i * 20 * S
        rows.append(("fast", arrival, arrival))
        rows.append(("slow", arrival - 3 * MIN, arrival))  # its clock runs 3 minutes behind
        if i < 9:
            rows.append(("quiet", arrival, arrival))  # silent after 12:02:40
    for n, (device, event, arrival) in enumerate(rows):
        source.upsert(f"r{n}", {"ts": event, "v": 1.0, "device": device}, arrival_ms=arrival)
    store = open_store(data_dir)

    def coordinator() -> WindowCoordinator:
        return WindowCoordinator(
            data_dir,
            FN,
            1,
            window,
            store,
            aggregator=python_aggregator,
            clock=ManualClock(T0 + 20 * MIN),
            source_bucket="src",
        )

    def deliver(upto: int) -> None:
        writer = WindowRowWriter(data_dir, FN, 1, f"w{upto}", layout)
        for vb in range(1024):
            for m in source.read_vb(vb, 0, 10_000):
                doc = decode_document(m.doc)
                if upto - 8 * MIN <= doc["ts"] + (3 * MIN if doc["device"] == "slow" else 0) < upto:
                    writer.add(m, doc)
        writer.flush()

    def expected(upto: int) -> list[dict]:
        seen = [r for r in rows if r[2] < upto]
        clock = max(a for _, _, a in seen)
        out = []
        for device in ("fast", "quiet", "slow"):
            mine = [{"event_time_ms": t, "device": d, "v": 1.0} for d, t, _ in seen if d == device]
            mark = max(max(r["event_time_ms"] for r in mine) - 30 * S, clock - 5 * MIN)
            closed = {
                (s, s + MIN) for s in {r["event_time_ms"] // MIN * MIN for r in mine} if s + MIN <= mark
            }
            out += python_aggregate(
                mine,
                size_ms=MIN,
                slide_ms=MIN,
                group_by=["device"],
                aggregates=[("count", None, "count"), ("sum", "v", "sum_v")],
                windows=closed,
            ).to_pylist()
        return sorted(out, key=lambda r: (r["window_start_ms"], r["device"]))

    def emitted() -> list[dict]:
        got = results_sink(data_dir, FN, window).read(FN).to_pylist()
        return sorted(got, key=lambda r: (r["window_start_ms"], r["device"]))

    def last(device: str) -> int:
        return max(r["window_start_ms"] for r in emitted() if r["device"] == device)

    c = coordinator()
    deliver(T0 + 6 * MIN)
    c.finish()
    first = emitted()
    assert first == expected(T0 + 6 * MIN)
    # Arrival clock 12:05:40: fast is at 12:05:10, slow and quiet at 12:02:10 (their rows' watermarks).
    assert (last("fast"), last("slow"), last("quiet")) == (T0 + 4 * MIN, T0 + MIN, T0 + MIN)
    c.close()
    c = coordinator()  # a restart: the substreams' clocks come back from the window state
    deliver(T0 + 14 * MIN)
    c.finish()
    assert emitted() == expected(T0 + 14 * MIN)
    # Arrival clock 12:11:40: quiet sent nothing since 12:02:40, yet its 12:02 window closed by the arrival
    # clock (12:06:40); slow (12:08:10) still holds its last windows open, without holding back fast's.
    assert (last("fast"), last("slow"), last("quiet")) == (T0 + 10 * MIN, T0 + 7 * MIN, T0 + 2 * MIN)
    assert all(r in emitted() for r in first)
    c.close()
    store.close()
    from eventing.ops.windows import window_status

    status = window_status(data_dir, FN)  # the least substream watermark: quiet's, from the arrival clock
    assert status["watermark_ms"] == T0 + 6 * MIN + 40 * S
    assert status["open_windows"] == 2  # fast's 12:11 window and slow's 12:08 one


def test_a_session_window_with_a_substream_key_keeps_the_function_watermark(data_dir):
    window = {
        "kind": "session",
        "gap": "1m",
        "time_field": "ts",
        "group_by": ["device"],
        "aggregates": ["count"],
        "late_arrival_tolerance": "5m",
        "substream_key": "device",
    }
    LocalBucket.create(data_dir, "src")
    lifecycle.save_function(
        data_dir,
        FunctionDefinition.from_dict({"name": FN, "source_bucket": "src", "window": window}),
        '"""Window-only."""\n',
    )
    lifecycle.deploy(data_dir, FN)
    store = open_store(data_dir)
    c = WindowCoordinator(data_dir, FN, 1, window, store, aggregator=python_aggregator, source_bucket="src")
    assert not isinstance(c.operator, SubstreamWindowOperator)
    c.close()
    store.close()


# -- any batching gives the same windows ------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from eventing.windows.semantics.arrival import ArrivalPolicy  # noqa: E402


@st.composite
def device_rows(draw):
    n = draw(st.integers(1, 40))
    arrivals = sorted(draw(st.lists(st.integers(0, 20 * 60), min_size=n, max_size=n)))
    rows = [
        (
            draw(st.sampled_from(["a", "b", "c"])),
            T0 + (a + draw(st.integers(-9 * 60, 6 * 60))) * S,
            T0 + a * S,
        )
        for a in arrivals
    ]
    cuts = sorted(set(draw(st.lists(st.integers(1, n), max_size=5))))
    return rows, cuts, draw(st.sampled_from([["device"], []])), draw(st.sampled_from(["0s", "2m"]))


@settings(max_examples=150, deadline=None)
@given(case=device_rows())
def test_rows_judged_in_arrival_order_are_never_late_and_close_the_same_windows_however_batched(case):
    """The policies' windowed times, in any batches: no row is late, and the closed windows are those a
    plain computation of each substream's final watermark (its rows', or arrival clock - tolerance) gives."""
    rows, cuts, group_by, lateness = case
    spec = WindowSpec.from_dict(
        dict(
            SPEC,
            group_by=group_by,
            allowed_lateness=lateness,
            out_of_order_tolerance="1m",
            early_arrival_policy="adjust",
        )
    )
    policy = ArrivalPolicy.for_spec(spec)
    fates = policy.observe_batch(
        [t for _, t, _ in rows], [a for _, _, a in rows], keys=[d for d, _, _ in rows]
    )
    judged = [(d, int(fates.time_ms[i]), a, not fates.early[i]) for i, (d, _, a) in enumerate(rows)]
    op = SubstreamWindowOperator(spec)
    closed: list = []
    for lo, hi in zip([0, *cuts], [*cuts, len(rows)], strict=True):
        batch = judged[lo:hi]
        if not batch:
            continue
        fate = op.observe_batch(
            [0] * len(batch),
            [t for _, t, _, _ in batch],
            T0,
            arrival_ms=batch[-1][2],
            lifts=[lift for *_, lift in batch],
            substreams=[d for d, *_ in batch],
        )
        assert fate.late_count == 0
        closed += op.advance(T0)
    clock = judged[-1][2]
    late_ms = spec.allowed_lateness_ms
    marks = {}
    for d, t, _, lift in judged:
        marks.setdefault(d, clock - 5 * MIN)
        if lift:
            marks[d] = max(marks[d], t - MIN)
    if group_by:
        want = {
            SubstreamWindow(Window(t // MIN * MIN, t // MIN * MIN + MIN), d)
            for d, t, _, _ in judged
            if t // MIN * MIN + MIN <= marks[d] - late_ms
        }
    else:  # a window mixing devices waits for any device, even one not seen yet: the arrival clock's floor
        want = {
            Window(t // MIN * MIN, t // MIN * MIN + MIN)
            for _, t, _, _ in judged
            if t // MIN * MIN + MIN <= clock - 5 * MIN - late_ms
        }
    assert sorted(closed) == sorted(want)
    assert len(closed) == len(set(closed))  # each window closes once
