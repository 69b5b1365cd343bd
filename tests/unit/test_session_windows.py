"""Session windows and window offsets: the pure semantics against a plain computation, and the window
coordinator (no Spark: the plain-Python aggregator) emitting every session exactly once."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest

from eventing.core.mutation import OP_UPDATE, Mutation
from eventing.testing.windows import (
    ManualClock,
    assert_same_results,
    python_aggregator,
    reference_results,
    reference_sessions,
    results_sink,
)
from eventing.windows.runtime.coordinator import WindowCoordinator
from eventing.windows.runtime.row_writer import RowLayout, WindowRowWriter
from eventing.windows.semantics import WindowConfigError, WindowOperator, WindowSpec, windows_for
from eventing.windows.semantics.sessions import Session, SessionOperator, plain_sessions
from eventing.windows.semantics.windows import late_cutoff_ms
from metadata.factory import open_store

S = 1000
MIN = 60 * S
HOUR = 60 * MIN
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
FN = "fn_s"


def session_spec(**extra: Any) -> WindowSpec:
    return WindowSpec.from_dict(
        {"kind": "session", "gap": "10s", "time_field": "ts", "group_by": ["user"], **extra}
    )


# -- declarations --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "field", "words"),
    [
        ({"kind": "session"}, "gap", "without a gap; set gap"),
        ({"kind": "session", "gap": "0s"}, "gap", "gap must be positive"),
        ({"kind": "session", "gap": "10s", "size": "1m"}, "size", "remove size and slide"),
        ({"kind": "session", "gap": "10s", "max_duration": "5s"}, "max_duration", "longer than gap"),
        ({"kind": "session", "gap": "10s", "offset": "1s"}, "offset", "set max_duration"),
        ({"kind": "tumbling", "size": "1m", "gap": "10s"}, "gap", "for session windows"),
        ({"kind": "tumbling", "size": "1h", "offset": "1h"}, "offset", "up to (not including)"),
        (
            {"kind": "hopping", "size": "1h", "slide": "10m", "offset": "15m"},
            "offset",
            "not shorter than the slide",
        ),
        ({"kind": "tumbling"}, "size", "has no size"),
        ({"kind": "sliding", "size": "1m"}, "kind", "'tumbling', 'hopping' or 'session'"),
    ],
)
def test_bad_window_declarations_name_the_field_and_the_fix(window, field, words):
    with pytest.raises(WindowConfigError) as info:
        WindowSpec.from_dict({"time_field": "ts", **window}, function="fn_s")
    assert info.value.field == field
    assert words in str(info.value)
    assert str(info.value).startswith("window of function 'fn_s' ")
    assert "\n" not in str(info.value)


def test_session_and_offset_declarations_round_trip():
    for raw in (
        {"kind": "session", "gap": "30s", "max_duration": "1h", "offset": "5m", "time_field": "ts"},
        {"kind": "tumbling", "size": "1d", "offset": "19h", "time_field": "ts"},
        {"kind": "hopping", "size": "1h", "slide": "15m", "offset": "5m", "time_field": "ts"},
        {"kind": "session", "gap": "5s", "boundary": "processing_time"},
    ):
        spec = WindowSpec.from_dict(raw)
        assert WindowSpec.from_dict(spec.to_dict()) == spec


# -- offsets -------------------------------------------------------------------------------------------


def test_a_day_window_with_an_offset_starts_at_that_hour():
    # Days in UTC-5 (New York winter) start at 05:00Z: offset 5h.
    spec = WindowSpec.from_dict({"kind": "tumbling", "size": "1d", "offset": "5h", "time_field": "ts"})
    (w,) = windows_for(T0 + 3 * HOUR, spec)  # 03:00Z on Jan 1 is still Dec 31 in New York
    assert (w.start_ms, w.end_ms) == (T0 - 19 * HOUR, T0 + 5 * HOUR)
    (w,) = windows_for(T0 + 5 * HOUR, spec)
    assert w.start_ms == T0 + 5 * HOUR


def test_hopping_windows_with_an_offset_hold_each_time_size_over_slide_times():
    spec = WindowSpec.from_dict(
        {"kind": "hopping", "size": "1h", "slide": "15m", "offset": "5m", "time_field": "ts"}
    )
    got = [(w.start_ms - T0) // MIN for w in windows_for(T0 + 50 * MIN, spec)]
    assert got == [5, 20, 35, 50]
    for t in range(-3 * HOUR, 3 * HOUR, 7 * MIN + 13):
        assert all(w.contains(T0 + t) for w in windows_for(T0 + t, spec))


@pytest.mark.parametrize("frontier", [T0 + k * 7 * MIN + 11 for k in range(-20, 20)])
def test_the_late_cutoff_with_an_offset_matches_window_by_window(frontier):
    spec = WindowSpec.from_dict(
        {"kind": "hopping", "size": "1h", "slide": "15m", "offset": "5m", "time_field": "ts"}
    )
    cutoff = late_cutoff_ms(spec, frontier)
    assert cutoff is not None
    for t in (cutoff - 1, cutoff, cutoff + 1):
        assert (t < cutoff) == all(w.end_ms <= frontier for w in windows_for(t, spec))


def test_the_operator_windows_rows_on_the_offset_grid():
    spec = WindowSpec.from_dict({"kind": "tumbling", "size": "1m", "offset": "30s", "time_field": "ts"})
    op = WindowOperator(spec)
    fate = op.observe_batch(0, [T0 + 40 * S, T0 + 95 * S], T0)
    assert [(w.start_ms - T0, w.end_ms - T0) for w in fate.windows] == [(30 * S, 90 * S), (90 * S, 150 * S)]
    assert [(w.start_ms - T0) for w in op.advance(T0)] == [30 * S]  # watermark 95 s >= 90 s
    assert op.observe(0, T0 + 89 * S, T0).late
    assert [w.start_ms - T0 for w in op.observe(0, T0 + 90 * S, T0).windows] == [90 * S]


# -- session semantics ---------------------------------------------------------------------------------


def test_rows_at_most_a_gap_apart_form_one_session_per_group():
    op = SessionOperator(session_spec())
    fate = op.observe_batch(
        0, [("a",), ("a",), ("b",), ("a",)], [T0, T0 + 9 * S, T0 + 5 * S, T0 + 30 * S], T0
    )
    assert fate.late_count == 0
    assert [(s.group, s.start_ms - T0, s.end_ms - T0) for s in op.open_sessions] == [
        (("b",), 5 * S, 15 * S),
        (("a",), 0, 19 * S),
        (("a",), 30 * S, 40 * S),
    ]  # by end
    # The watermark (30 s) closed a and b's first sessions (ends 19 s and 15 s).
    closed = op.advance(T0)
    assert [(s.group, s.start_ms - T0) for s in closed] == [(("b",), 5 * S), (("a",), 0)]


def test_a_row_that_bridges_two_sessions_merges_them():
    op = SessionOperator(session_spec(out_of_order_tolerance="1m"))
    op.observe_batch(0, [("a",), ("a",)], [T0, T0 + 18 * S], T0)
    assert len(op.open_sessions) == 2
    fate = op.observe_batch(1, [("a",)], [T0 + 9 * S], T0)  # 9 s from both: one session now
    assert fate.late == [False]
    assert [(s.start_ms - T0, s.last_ms - T0, s.end_ms - T0) for s in op.open_sessions] == [
        (0, 18 * S, 28 * S)
    ]
    assert [(s.start_ms, s.end_ms) for s in op.close_all()] == [(T0, T0 + 28 * S)]


def test_a_session_closes_when_the_watermark_reaches_last_row_plus_gap_plus_lateness():
    op = SessionOperator(session_spec(allowed_lateness="5s"))
    op.observe_batch(0, [("a",)], [T0], T0)
    op.observe_batch(0, [("b",)], [T0 + 14 * S], T0)
    assert op.advance(T0) == []  # watermark 14 s < 0 + 10 + 5
    op.observe_batch(0, [("b",)], [T0 + 15 * S], T0)
    assert [s.group for s in op.advance(T0)] == [("a",)]


def test_rows_of_a_closed_session_and_rows_bridging_to_it_are_late():
    op = SessionOperator(session_spec())
    op.observe_batch(0, [("a",), ("b",)], [T0, T0 + 60 * S], T0)
    assert [s.group for s in op.advance(T0)] == [("a",)]  # [0, 10 s) closed at watermark 60 s
    fate = op.observe_batch(0, [("a",), ("a",), ("a",)], [T0 + 5 * S, T0 + 55 * S, T0 + 200 * S], T0)
    # 5 s: inside the emitted session. 55 s: would end at 65 s > watermark but opens alone: accepted.
    assert fate.late == [True, False, False]
    # 12 s: its own session would end at 22 s, before the watermark (60 s): late.
    assert op.observe_batch(0, [("a",)], [T0 + 12 * S], T0).late == [True]


def test_a_chain_reaching_into_an_emitted_session_is_refused_whole():
    op = SessionOperator(session_spec(allowed_lateness="30s"))
    op.observe_batch(0, [("a",), ("z",)], [T0, T0 + 50 * S], T0)
    assert [s.group for s in op.advance(T0)] == [("a",)]  # frontier 20 s >= 10 s
    # 8 s and 16 s: one chain; 16 + 10 > frontier 20, but 8 is within gap of the emitted [0, 10 s).
    fate = op.observe_batch(0, [("a",), ("a",)], [T0 + 16 * S, T0 + 8 * S], T0)
    assert fate.late == [True, True]
    # 15 s alone is a gap away from the row at 0 s: a session of its own, accepted.
    assert op.observe_batch(0, [("a",)], [T0 + 15 * S], T0).late == [False]


def test_max_duration_cuts_sessions_on_its_grid():
    op = SessionOperator(session_spec(max_duration="30s", out_of_order_tolerance="1h"))
    times = [T0 + k * 5 * S for k in range(14)]  # 0..65 s, every 5 s: one session without the cap
    op.observe_batch(0, [("a",)] * len(times), times, T0)
    got = [(s.start_ms - T0, s.last_ms - T0) for s in op.close_all()]
    assert got == [(0, 25 * S), (30 * S, 55 * S), (60 * S, 65 * S)]


def test_processing_time_sessions_use_the_arrival_time():
    op = SessionOperator(
        WindowSpec.from_dict({"kind": "session", "gap": "10s", "boundary": "processing_time"})
    )
    op.observe_batch(0, [()], None, T0)
    op.observe_batch(0, [()], None, T0 + 8 * S)
    assert op.advance(T0 + 17 * S) == []
    closed = op.advance(T0 + 18 * S)
    assert [(s.start_ms, s.end_ms) for s in closed] == [(T0, T0 + 18 * S)]


@pytest.mark.parametrize("seed", range(40))
def test_sessions_equal_a_plain_computation_over_the_accepted_rows(seed):
    rnd = random.Random(seed)
    extra: dict[str, Any] = {
        "out_of_order_tolerance": f"{rnd.choice([0, 5, 20])}s",
        "allowed_lateness": f"{rnd.choice([0, 10])}s",
    }
    if rnd.random() < 0.4:
        extra["max_duration"] = "45s"
    spec = session_spec(**extra)
    op = SessionOperator(spec)
    rows, t = [], T0
    for _ in range(400):
        t += rnd.randint(0, 6 * S)
        rows.append(((rnd.choice("abc"),), t - rnd.randint(0, 30 * S), rnd.randrange(4)))
    accepted: list[tuple[tuple, int]] = []
    emitted: list[Session] = []
    i = 0
    while i < len(rows):
        batch = rows[i : i + rnd.randint(1, 12)]
        i += len(batch)
        fate = op.observe_batch(
            [p for _, _, p in batch], [g for g, _, _ in batch], [t for _, t, _ in batch], T0
        )
        accepted += [(g, t) for (g, t, _), late in zip(batch, fate.late, strict=True) if not late]
        emitted += op.advance(T0)
    emitted += op.close_all()
    assert op.late_rows == len(rows) - len(accepted)
    want = plain_sessions(accepted, spec.gap_ms, spec.max_duration_ms)
    assert sorted(emitted, key=repr) == sorted(want, key=repr)


def test_session_state_resumes_exactly():
    spec = session_spec(out_of_order_tolerance="5s")
    a, b = SessionOperator(spec), None
    a.observe_batch([0, 1], [("a",), ("b",)], [T0, T0 + 30 * S], T0)
    a.advance(T0)
    b = SessionOperator.from_state(spec, a.to_state())
    for op in (a, b):
        op.observe_batch(0, [("a",)], [T0 + 3 * S], T0)
    assert a.to_state() == b.to_state()
    assert a.close_all() == b.close_all()


# -- the coordinator -----------------------------------------------------------------------------------


class SessionHarness:
    def __init__(self, data_dir: str, window: dict[str, Any]):
        self.data_dir = data_dir
        self.window = window
        self.layout = RowLayout.for_definition(FN, window)
        self.store = open_store(data_dir)
        self.clock = ManualClock(T0)
        self.docs: list[tuple[int, int, dict]] = []
        self.arrivals: dict[tuple[int, int], int] = {}
        self.restart()

    def restart(self) -> WindowCoordinator:
        self.coordinator = WindowCoordinator(
            self.data_dir,
            FN,
            1,
            self.window,
            self.store,
            aggregator=python_aggregator,
            clock=self.clock,
            close_windows=True,
        )
        return self.coordinator

    def write(self, worker: str, rows: list[tuple[int, int, int, str, float]]) -> None:
        """rows: (vb, seqno, event time from T0 in ms, user, amount), one batch of one worker."""
        writer = WindowRowWriter(self.data_dir, FN, 1, worker, self.layout)
        for vb, seqno, offset, user, amount in rows:
            doc = {"ts": T0 + offset, "user": user, "amount": amount}
            assert writer.add(Mutation(vb, seqno, f"k{vb}-{seqno}", OP_UPDATE, 0, b"", None, 0, 0), doc)
            self.docs.append((vb, seqno, doc))
        writer.flush()

    def results(self) -> Any:
        return results_sink(self.data_dir, FN, self.window).read(FN)

    def late(self) -> set[tuple[int, int]]:
        return {(r.vb, r.seqno) for r in self.store.dlq_rows(FN) if r.reason == "late"}


SESSION_WINDOW = {
    "kind": "session",
    "gap": "10s",
    "time_field": "ts",
    "group_by": ["user"],
    "aggregates": [
        "count",
        {"op": "sum", "field": "amount"},
        {"op": "max", "field": "amount"},
        {"op": "avg", "field": "amount"},
    ],
    "out_of_order_tolerance": "20s",
}


def test_the_coordinator_emits_merged_sessions_once_from_rows_out_of_order_across_vbuckets(
    data_dir, window_files
):
    h = SessionHarness(data_dir, SESSION_WINDOW)
    # Two workers, two vBuckets each; user u's rows arrive out of order: 0 s and 18 s first, then the 9 s
    # row that bridges them from another vBucket, then a late one after the watermark passed.
    h.write("local/w0", [(0, 1, 0, "u", 1.0), (0, 2, 18 * S, "u", 2.0), (1, 1, 5 * S, "v", 10.0)])
    h.write("local/w1", [(2, 1, 9 * S, "u", 4.0), (3, 1, 40 * S, "v", 1.0)])
    h.coordinator.poll()
    h.write("local/w0", [(0, 3, 80 * S, "u", 1.0), (1, 2, 90 * S, "v", 1.0)])
    h.write("local/w1", [(2, 2, 85 * S, "u", 1.0), (3, 2, 95 * S, "v", 3.0)])
    h.coordinator.poll()
    # The watermark is now 60 s (85 - 20 at vb 2, the slowest... vb 2's max 85 s, vb 0's 80 s): u's
    # [0, 28 s) session closed; a row at 12 s for u falls inside it and is late.
    h.write("local/w1", [(2, 3, 12 * S, "u", 100.0)])
    h.coordinator.poll()
    assert h.late() == {(2, 3)}
    h.coordinator.finish(end_of_input=True)
    got = h.results()
    want = reference_sessions(h.docs, WindowSpec.from_dict(h.window), exclude=h.late())
    assert_same_results(got, want)
    rows = got.to_pylist()
    first = next(r for r in rows if r["user"] == "u" and r["window_start_ms"] == T0)
    assert (first["window_end_ms"], first["count"], first["sum_amount"]) == (T0 + 28 * S, 3, 7.0)


@pytest.mark.parametrize("seed", range(6))
def test_random_sessions_over_many_polls_and_a_restart_equal_the_plain_computation(
    data_dir, seed, window_files
):
    rnd = random.Random(seed)
    window = dict(SESSION_WINDOW, out_of_order_tolerance=f"{rnd.choice([0, 5, 15])}s")
    if seed % 2:
        window["max_duration"] = "40s"
    h = SessionHarness(data_dir, window)
    seqnos = [0] * 8
    t = 0
    for round_ in range(12):
        for worker in ("local/w0", "local/w1"):
            rows = []
            for _ in range(rnd.randint(1, 25)):
                vb = rnd.randrange(8)
                seqnos[vb] += 1
                t += rnd.randint(0, 3 * S)
                rows.append(
                    (vb, seqnos[vb], t - rnd.randint(0, 25 * S), rnd.choice("xyz"), float(rnd.randint(1, 9)))
                )
            h.write(worker, rows)
        h.coordinator.poll()
        if round_ == 6:
            h.coordinator.drain()
            h.restart()  # resumes from the committed state; nothing lost, nothing twice
    h.coordinator.finish(end_of_input=True)
    got = h.results()
    want = reference_sessions(h.docs, WindowSpec.from_dict(window), exclude=h.late())
    assert_same_results(got, want)
    assert len(h.late()) + sum(r["count"] for r in got.to_pylist()) == len(h.docs)


def test_processing_time_sessions_through_the_coordinator(data_dir):
    window = {"kind": "session", "gap": "10s", "boundary": "processing_time", "group_by": ["user"]}
    h = SessionHarness(data_dir, window)
    h.write("local/w0", [(0, 1, 0, "u", 1.0), (1, 1, 0, "v", 1.0)])
    h.coordinator.poll()  # arrival T0
    h.clock.advance(6 * S)
    h.write("local/w0", [(0, 2, 0, "u", 1.0)])
    h.coordinator.poll()  # arrival T0 + 6 s: same session for u
    h.clock.advance(30 * S)
    h.coordinator.poll()
    h.coordinator.drain()
    got = [
        (r["user"], r["window_start_ms"] - T0, r["window_end_ms"] - T0, r["count"])
        for r in h.results().to_pylist()
    ]
    assert sorted(got) == [("u", 0, 16 * S, 2), ("v", 0, 10 * S, 1)]


def test_offset_windows_through_the_coordinator(data_dir):
    window = {
        "kind": "tumbling",
        "size": "1m",
        "offset": "20s",
        "time_field": "ts",
        "group_by": ["user"],
        "aggregates": ["count"],
    }
    h = SessionHarness(data_dir, window)
    h.write("local/w0", [(0, 1, 10 * S, "u", 1.0), (0, 2, 30 * S, "u", 1.0), (0, 3, 85 * S, "u", 1.0)])
    h.coordinator.finish(end_of_input=True)
    got = h.results()
    assert [(r["window_start_ms"] - T0) // S for r in got.to_pylist()] == [-40, 20, 80]
    spec = WindowSpec.from_dict(window)
    windows = sorted({(r["window_start_ms"], r["window_end_ms"]) for r in got.to_pylist()})
    assert_same_results(got, reference_results(h.docs, spec, windows))


def test_session_spec_keeps_timedelta_values():
    assert session_spec(max_duration="1m").max_duration == timedelta(minutes=1)


def test_rows_exactly_a_gap_apart_share_a_session_as_in_flink_and_spark():
    op = SessionOperator(session_spec(out_of_order_tolerance="1h"))
    op.observe_batch(0, [("a",), ("a",), ("a",)], [T0, T0 + 10 * S, T0 + 20 * S + 1], T0)
    assert [(s.start_ms - T0, s.end_ms - T0) for s in op.close_all()] == [
        (0, 20 * S),
        (20 * S + 1, 30 * S + 1),
    ]


def test_a_row_at_the_end_of_an_emitted_session_is_late():
    op = SessionOperator(session_spec())
    op.observe_batch(0, [("a",), ("b",)], [T0, T0 + 60 * S], T0)
    op.advance(T0)
    assert op.observe_batch(0, [("a",)], [T0 + 10 * S], T0).late == [True]  # would touch [0, 10 s)


def test_an_idle_source_closes_sessions_after_the_idle_timeout():
    op = SessionOperator(session_spec(idle_timeout="1m"))
    op.observe_batch(0, [("a",)], [T0], T0)
    assert op.advance(T0 + 69 * S) == []  # due at end (10 s) + 1 min of silence
    assert [s.group for s in op.advance(T0 + 70 * S)] == [("a",)]
    assert op.observe_batch(0, [("a",)], [T0 + 5 * S], T0 + 70 * S).late == [True]
