"""Window time semantics: the seed tables (Atlas 000, Azure 003) as test vectors, then properties."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventing.windows.semantics import (
    Aggregate,
    WatermarkTracker,
    Window,
    WindowConfigError,
    WindowOperator,
    WindowSpec,
    WindowStateError,
    classify_late,
    format_duration,
    late_cutoff_ms,
    parse_duration,
    windows_for,
)

DAY_MS = int(datetime(2024, 5, 1, tzinfo=UTC).timestamp()) * 1000
MINUTE = 60_000


def at(hhmm: str) -> int:
    """Epoch ms of a wall-clock time on 2024-05-01 UTC, written like the seed tables ("12:05", "12:04:30")."""
    parts = [int(p) for p in hhmm.split(":")]
    hours, minutes, seconds = (parts + [0])[:3]
    return DAY_MS + ((hours * 60 + minutes) * 60 + seconds) * 1000


def win(start: str, end: str) -> Window:
    return Window(at(start), at(end))


def spec(kind: str = "tumbling", size: str = "5m", **fields: object) -> WindowSpec:
    data: dict[str, object] = {"kind": kind, "size": size, **fields}
    if data.get("boundary", "event_time") == "event_time":
        data.setdefault("time_field", "ts")
    return WindowSpec.from_dict(data)


# --- seed 000 (Atlas): watermark table ----------------------------------------------------------------
# 5-minute windows. Columns: event time, processing time, window without a watermark (processing-time
# windows), window with a watermark (event-time windows).
ATLAS_WATERMARK_TABLE = [
    ("12:00", "12:00", ("12:00", "12:05"), ("12:00", "12:05")),
    ("12:01", "12:03", ("12:00", "12:05"), ("12:00", "12:05")),
    ("12:02", "12:05", ("12:05", "12:10"), ("12:00", "12:05")),
    ("12:01", "12:06", ("12:05", "12:10"), ("12:00", "12:05")),
    ("12:06", "12:07", ("12:05", "12:10"), ("12:05", "12:10")),
]
ATLAS_WATERMARK_IDS = [f"event {e} at {p}" for e, p, _, _ in ATLAS_WATERMARK_TABLE]


def replay_watermark_table(boundary: str, rows: int) -> tuple[WindowOperator, list, dict[Window, int], dict]:
    op = WindowOperator(spec(size="5m", boundary=boundary))
    fates, rows_per_window, closed_at = [], {}, {}
    for event, processing, _, _ in ATLAS_WATERMARK_TABLE[:rows]:
        fate = op.observe(0, at(event), at(processing))
        fates.append(fate)
        for window in fate.windows:
            rows_per_window[window] = rows_per_window.get(window, 0) + 1
        for window in op.advance(at(processing)):
            closed_at[window] = processing
    return op, fates, rows_per_window, closed_at


@pytest.mark.parametrize("row", range(len(ATLAS_WATERMARK_TABLE)), ids=ATLAS_WATERMARK_IDS)
def test_processing_time_window_of_each_row_matches_the_atlas_table_without_watermark(row: int) -> None:
    _, fates, _, _ = replay_watermark_table("processing_time", row + 1)
    expected = ATLAS_WATERMARK_TABLE[row][2]
    assert fates[-1].windows == (win(*expected),)
    assert fates[-1].time_ms == at(ATLAS_WATERMARK_TABLE[row][1])
    assert not fates[-1].late


@pytest.mark.parametrize("row", range(len(ATLAS_WATERMARK_TABLE)), ids=ATLAS_WATERMARK_IDS)
def test_event_time_window_of_each_row_matches_the_atlas_table_with_watermark(row: int) -> None:
    _, fates, _, _ = replay_watermark_table("event_time", row + 1)
    expected = ATLAS_WATERMARK_TABLE[row][3]
    assert fates[-1].windows == (win(*expected),)
    assert not fates[-1].late


def test_processing_time_window_closes_on_the_clock_with_two_of_the_four_documents() -> None:
    _, _, rows_per_window, closed_at = replay_watermark_table("processing_time", len(ATLAS_WATERMARK_TABLE))
    assert closed_at == {win("12:00", "12:05"): "12:05"}
    assert rows_per_window[win("12:00", "12:05")] == 2


def test_event_time_window_waits_for_the_watermark_and_keeps_all_four_documents() -> None:
    # The seed's prose says the watermark is 12:03 at processing time 12:05 and that a 12:05 event closes
    # the window at 12:07; no row of its table has those times. The rows are the vectors: the watermark is
    # 12:02 at 12:05, and the 12:06 event arriving at 12:07 closes 12:00-12:05, which is the prose's point.
    op, _, rows_per_window, closed_at = replay_watermark_table("event_time", len(ATLAS_WATERMARK_TABLE))
    assert closed_at == {win("12:00", "12:05"): "12:07"}
    assert rows_per_window[win("12:00", "12:05")] == 4
    assert op.watermark_ms == at("12:06")
    assert op.open_windows == (win("12:05", "12:10"),)


# --- seed 000 (Atlas): allowed lateness of 2 minutes ---------------------------------------------------
# Columns: event time, watermark, watermark minus the allowed lateness, open windows after the row, windows
# closed by the row.
#
# The printed watermark column reads 12:03, 12:04 and 12:06 on rows 2, 3 and 5, but the seed's text says
# the watermark moves only when a document with a later event time than all before it arrives, so here it
# is the greatest event time so far (12:02, 12:02, 12:05), and the lateness column follows. The open
# windows come out the same either way. Row 4 prints "12:00-12:15, 12:05-12:10"; the text and the 5-minute
# windows make that 12:00-12:05.
ALLOWED_LATENESS_TABLE = [
    ("12:00", "12:00", "11:58", [("12:00", "12:05")], []),
    ("12:02", "12:02", "12:00", [("12:00", "12:05")], []),
    ("12:01", "12:02", "12:00", [("12:00", "12:05")], []),
    ("12:05", "12:05", "12:03", [("12:00", "12:05"), ("12:05", "12:10")], []),
    ("12:04", "12:05", "12:03", [("12:00", "12:05"), ("12:05", "12:10")], []),
    ("12:07", "12:07", "12:05", [("12:05", "12:10")], [("12:00", "12:05")]),
]
# The same rows with the watermark and lateness columns exactly as printed.
ALLOWED_LATENESS_AS_PRINTED = [
    ("12:00", "12:00", "11:58"),
    ("12:02", "12:03", "12:01"),
    ("12:01", "12:04", "12:02"),
    ("12:05", "12:05", "12:03"),
    ("12:04", "12:06", "12:04"),
    ("12:07", "12:07", "12:05"),
]


@pytest.mark.parametrize(
    "row", range(len(ALLOWED_LATENESS_TABLE)), ids=[f"event {r[0]}" for r in ALLOWED_LATENESS_TABLE]
)
def test_allowed_lateness_keeps_each_window_open_as_in_the_atlas_table(row: int) -> None:
    op = WindowOperator(spec(size="5m", allowed_lateness="2m"))
    closed: list[Window] = []
    for i, (event, _, _, _, _) in enumerate(ALLOWED_LATENESS_TABLE[: row + 1]):
        now = at("12:00") + i * MINUTE
        fate = op.observe(0, at(event), now)
        closed = op.advance(now)
    event, watermark, lateness, open_windows, closed_now = ALLOWED_LATENESS_TABLE[row]
    assert not fate.late
    assert fate.windows == (windows_for(at(event), op.spec)[0],)
    assert op.watermark_ms == at(watermark)
    assert op.close_frontier_ms == at(lateness)
    assert op.open_windows == tuple(win(*w) for w in open_windows)
    assert closed == [win(*w) for w in closed_now]


@pytest.mark.parametrize("event, watermark, lateness", ALLOWED_LATENESS_AS_PRINTED)
def test_close_rule_applied_to_the_printed_watermarks_gives_the_same_windows(
    event: str, watermark: str, lateness: str
) -> None:
    lateness_spec = spec(size="5m", allowed_lateness="2m")
    frontier = at(watermark) - 2 * MINUTE
    assert frontier == at(lateness)
    assert at(event) >= late_cutoff_ms(lateness_spec, frontier)  # no row of the table is late
    first_closed = win("12:00", "12:05").end_ms <= frontier  # closes when watermark >= end + lateness
    assert first_closed == (watermark == "12:07")
    assert win("12:05", "12:10").end_ms > frontier


# --- seed 000 (Atlas): 3-minute windows with a 1-minute idle timeout ----------------------------------
# Columns: processing time, event time (None while the source is idle), watermark, the window the watermark
# is in, windows closed so far.
#
# The printed watermark for 12:07 and 12:08 is 12:00, which would move it backwards and contradicts both the
# window column (12:06-12:09) and the text ("the idle timeout fires and the watermark advances to 12:06");
# these rows follow the text.
IDLE_TIMEOUT_TABLE = [
    ("12:00", "12:00", "12:00", ("12:00", "12:03"), []),
    ("12:01", None, "12:00", ("12:00", "12:03"), []),
    ("12:02", None, "12:00", ("12:00", "12:03"), []),
    # Processing time reaches the window end: the idle interval starts, and would fire at 12:04.
    ("12:03", None, "12:00", ("12:00", "12:03"), []),
    # A row at 12:04 is seen before the timer of the same instant, so the source was not idle for a minute.
    ("12:04", "12:02", "12:02", ("12:00", "12:03"), []),
    ("12:05", "12:05", "12:05", ("12:03", "12:06"), [("12:00", "12:03")]),
    ("12:06", None, "12:05", ("12:03", "12:06"), [("12:00", "12:03")]),
    ("12:07", None, "12:06", ("12:06", "12:09"), [("12:00", "12:03"), ("12:03", "12:06")]),
    ("12:08", None, "12:06", ("12:06", "12:09"), [("12:00", "12:03"), ("12:03", "12:06")]),
    ("12:09", "12:09", "12:09", ("12:09", "12:12"), [("12:00", "12:03"), ("12:03", "12:06")]),
]


@pytest.mark.parametrize(
    "row", range(len(IDLE_TIMEOUT_TABLE)), ids=[f"{r[0]} {r[1] or 'idle'}" for r in IDLE_TIMEOUT_TABLE]
)
def test_idle_timeout_moves_the_watermark_as_in_the_atlas_table(row: int) -> None:
    op = WindowOperator(spec(size="3m", idle_timeout="1m"))
    closed: list[Window] = []
    fate = None
    for processing, event, _, _, _ in IDLE_TIMEOUT_TABLE[: row + 1]:
        if event is not None:
            fate = op.observe(0, at(event), at(processing))
            assert not fate.late
        closed += op.advance(at(processing))
    processing, event, watermark, window, closed_so_far = IDLE_TIMEOUT_TABLE[row]
    assert op.watermark_ms == at(watermark)
    assert windows_for(op.watermark_ms, op.spec) == [win(*window)]
    assert closed == [win(*w) for w in closed_so_far]
    if event is not None:
        assert fate is not None and fate.windows == tuple(windows_for(at(event), op.spec))


# --- seed 003 (Azure Stream Analytics): watermark with a 2-minute out-of-order tolerance ----------------
# Columns: event time, arrival time, device, watermark after the row, behind the watermark on arrival, late
# in 5-minute tumbling windows. One input partition, as in the seed.
#
# The seed's first figure also applies a 5-minute early-arrival policy that drops row 3 (12:17 arriving at
# 12:11); this project has no early-arrival policy, so this follows the seed's second figure ("without the
# early-arrival policy"), where row 3 lifts the watermark to 12:15, as the text says. Where Azure rewrites
# the time of a row behind the watermark (row 4 to 12:15, row 6 to 12:17) or past the 5-minute late-arrival
# tolerance (row 12 to 12:22), this project keeps the event time, and a row is late only if all its
# windows have closed; late rows go to the dead-letter store instead of being moved.
AZURE_TABLE = [
    ("12:07", "12:07", "device1", "12:05", False, False),
    ("12:08", "12:08", "device2", "12:06", False, False),
    ("12:17", "12:11", "device1", "12:15", False, False),
    ("12:08", "12:13", "device3", "12:15", True, True),  # 12:05-12:10 closed when the watermark hit 12:15
    ("12:19", "12:16", "device1", "12:17", False, False),
    ("12:12", "12:17", "device3", "12:17", True, True),  # 12:10-12:15 closed at 12:15 too
    ("12:17", "12:18", "device2", "12:17", False, False),  # equal to the watermark is not behind it
    ("12:20", "12:19", "device2", "12:18", False, False),
    ("12:16", "12:21", "device3", "12:18", True, False),  # behind the watermark, but 12:15-12:20 is open
    ("12:23", "12:22", "device2", "12:21", False, False),
    ("12:22", "12:24", "device2", "12:21", False, False),
    ("12:21", "12:27", "device3", "12:21", False, False),
]


@pytest.mark.parametrize("row", range(len(AZURE_TABLE)), ids=[f"{r[2]} {r[0]}@{r[1]}" for r in AZURE_TABLE])
def test_out_of_order_tolerance_watermark_matches_the_azure_example(row: int) -> None:
    op = WindowOperator(spec(size="5m", out_of_order_tolerance="2m"))
    for event, arrival, _, _, _, _ in AZURE_TABLE[: row + 1]:
        fate = op.observe(0, at(event), at(arrival))
        op.advance(at(arrival))
    _, _, _, watermark, behind, late = AZURE_TABLE[row]
    assert op.watermark_ms == at(watermark)
    assert fate.behind_watermark is behind
    assert fate.late is late
    assert op.late_rows == sum(r[5] for r in AZURE_TABLE[: row + 1])


# --- window assignment ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, size, slide, time, expected",
    [
        ("tumbling", "5m", None, "12:07", [("12:05", "12:10")]),
        ("tumbling", "5m", None, "12:05", [("12:05", "12:10")]),
        ("tumbling", "3m", None, "12:02:59", [("12:00", "12:03")]),
        ("hopping", "10m", "5m", "12:07", [("12:00", "12:10"), ("12:05", "12:15")]),
        ("hopping", "10m", "5m", "12:05", [("12:00", "12:10"), ("12:05", "12:15")]),
        ("hopping", "10m", "5m", "12:04:59", [("11:55", "12:05"), ("12:00", "12:10")]),
        ("hopping", "15m", "5m", "12:07", [("11:55", "12:10"), ("12:00", "12:15"), ("12:05", "12:20")]),
        ("hopping", "5m", "5m", "12:07", [("12:05", "12:10")]),
    ],
)
def test_a_row_falls_in_size_over_slide_epoch_aligned_windows(
    kind: str, size: str, slide: str | None, time: str, expected: list[tuple[str, str]]
) -> None:
    window_spec = spec(kind, size, **({"slide": slide} if slide else {}))
    assert windows_for(at(time), window_spec) == [win(*w) for w in expected]


def test_windows_are_aligned_to_the_unix_epoch_including_before_it() -> None:
    five = spec(size="5m")
    assert windows_for(0, five) == [Window(0, 5 * MINUTE)]
    assert windows_for(-1, five) == [Window(-5 * MINUTE, 0)]
    hop = spec("hopping", "2s", slide="1s")
    assert windows_for(-1, hop) == [Window(-2000, 0), Window(-1000, 1000)]


def test_window_id_is_stable_and_reads_back() -> None:
    window = win("12:00", "12:05")
    assert window.id == f"{at('12:00')}_{at('12:05')}"
    assert Window.from_id(window.id) == window
    assert window.label == "2024-05-01T12:00:00Z/2024-05-01T12:05:00Z"
    with pytest.raises(ValueError, match="start < end"):
        Window(5, 5)


def test_hopping_row_joins_only_its_windows_that_are_still_open() -> None:
    op = WindowOperator(spec("hopping", "10m", slide="5m"))
    op.observe(0, at("12:10"), at("12:10"))
    assert op.advance(at("12:10")) == []  # no row is in 12:00-12:10 yet
    fate = op.observe(0, at("12:07"), at("12:11"))
    assert not fate.late
    assert fate.windows == (win("12:05", "12:15"),)
    assert fate.closed_windows == (win("12:00", "12:10"),)
    assert op.advance(at("12:11")) == []  # 12:00-12:10 never received a row, so there is nothing to emit


@settings(max_examples=300, deadline=None)
@given(
    time=st.integers(-(10**13), 10**13),
    frontier=st.integers(-(10**13), 10**13),
    slide=st.integers(1, 10**6),
    multiple=st.integers(1, 6),
)
def test_late_cutoff_agrees_with_checking_every_window(
    time: int, frontier: int, slide: int, multiple: int
) -> None:
    window_spec = WindowSpec(
        "hopping", timedelta(milliseconds=slide * multiple), timedelta(milliseconds=slide), time_field="ts"
    )
    windows = windows_for(time, window_spec)
    assert len(windows) == multiple and all(w.contains(time) for w in windows)
    all_closed = all(w.end_ms <= frontier for w in windows)
    assert (time < late_cutoff_ms(window_spec, frontier)) is all_closed


def test_classify_late_handles_lists_and_arrow_arrays_alike() -> None:
    times = [at("12:04"), at("12:05"), at("12:09")]
    assert classify_late(times, at("12:05")) == [True, False, False]
    assert classify_late(times, None) == [False, False, False]
    arrow = pa.array(times + [None], pa.int64())
    assert classify_late(arrow, at("12:05")).to_pylist() == [True, False, False, None]
    assert classify_late(arrow, None).to_pylist() == [False, False, False, None]
    stamps = pa.array([t * 1000 for t in times], pa.timestamp("us", tz="UTC"))
    assert classify_late(stamps, at("12:05")).to_pylist() == [True, False, False]


# --- watermark over partitions -------------------------------------------------------------------------


def test_function_watermark_is_the_minimum_over_partitions_minus_the_tolerance() -> None:
    tracker = WatermarkTracker(out_of_order_tolerance=timedelta(seconds=10))
    tracker.observe(0, 100_000, now_ms=0)
    assert tracker.watermark_ms == 90_000
    tracker.observe(1, 50_000, now_ms=1)
    assert tracker.watermark_ms == 90_000  # a partition that joins behind does not pull it back
    tracker.observe(0, 200_000, now_ms=2)
    assert tracker.watermark_ms == 90_000  # partition 1 (at 40s) holds it
    tracker.observe(1, 150_000, now_ms=3)
    assert tracker.watermark_ms == 140_000
    assert tracker.partition_watermark_ms(0) == 190_000


def test_silent_assigned_partition_holds_the_watermark_until_it_goes_idle() -> None:
    tracker = WatermarkTracker(partition_idle_timeout=timedelta(seconds=30))
    tracker.assign_partitions([0, 1], now_ms=0)
    tracker.observe(0, 10_000, now_ms=0)
    tracker.observe(0, 12_000, now_ms=20_000)
    assert tracker.advance(29_999) is None
    assert tracker.idle_partitions == frozenset()
    assert tracker.advance(30_000) == 12_000
    assert tracker.idle_partitions == frozenset({1})


def test_idle_partition_stops_holding_the_watermark_and_counts_again_once_it_has_data() -> None:
    tracker = WatermarkTracker(partition_idle_timeout=timedelta(seconds=30))
    tracker.assign_partitions([0, 1], now_ms=0)
    tracker.observe(0, 100_000, now_ms=0)
    assert tracker.watermark_ms is None  # partition 1 has delivered nothing yet
    tracker.observe(1, 50_000, now_ms=0)
    assert tracker.watermark_ms == 50_000
    tracker.observe(0, 200_000, now_ms=20_000)
    assert tracker.advance(29_999) == 50_000
    assert tracker.advance(30_000) == 200_000  # partition 1 silent for 30 s: idle
    tracker.observe(0, 300_000, now_ms=35_000)
    assert tracker.watermark_ms == 300_000
    tracker.observe(1, 120_000, now_ms=40_000)  # rejoins behind: holds, without moving back
    assert tracker.active_partitions == frozenset({0, 1})
    assert tracker.watermark_ms == 300_000
    tracker.observe(0, 400_000, now_ms=41_000)
    assert tracker.watermark_ms == 300_000
    tracker.observe(1, 350_000, now_ms=42_000)
    assert tracker.watermark_ms == 350_000


def test_watermark_stays_put_while_every_partition_is_idle() -> None:
    tracker = WatermarkTracker(partition_idle_timeout=timedelta(seconds=1))
    tracker.observe(0, 5_000, now_ms=0)
    tracker.observe(1, 7_000, now_ms=0)
    assert tracker.advance(10_000) == 5_000
    assert tracker.active_partitions == frozenset()
    tracker.observe(1, 9_000, now_ms=11_000)
    assert tracker.watermark_ms == 9_000


def test_idle_partition_lets_the_operator_close_windows_the_silent_one_held_open() -> None:
    op = WindowOperator(spec(size="1m", partition_idle_timeout="30s"))
    op.observe(0, at("12:00"), at("12:00"))
    op.observe(1, at("12:00"), at("12:00"))
    op.observe(0, at("12:02"), at("12:00:20"))
    assert op.advance(at("12:00:29")) == []  # partition 1 still holds the watermark at 12:00
    assert op.advance(at("12:00:30")) == [win("12:00", "12:01")]
    assert op.watermark_ms == at("12:02")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tolerance_s=st.integers(0, 120),
    idle_s=st.one_of(st.none(), st.integers(1, 120)),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["observe", "advance", "advance_to", "revoke"]),
            st.integers(0, 3),
            st.integers(0, 3_600_000),
            st.integers(0, 60_000),
        ),
        max_size=60,
    ),
)
def test_watermark_never_moves_backwards(
    tolerance_s: int, idle_s: int | None, steps: list[tuple[str, int, int, int]]
) -> None:
    tracker = WatermarkTracker(
        timedelta(seconds=tolerance_s), None if idle_s is None else timedelta(seconds=idle_s)
    )
    now, previous = 0, None
    for action, partition, time, delay in steps:
        now += delay
        if action == "observe":
            tracker.observe(partition, time, now)
        elif action == "advance":
            tracker.advance(now)
        elif action == "advance_to":
            tracker.advance_to(time)
        else:
            tracker.revoke_partitions([partition])
        current = tracker.watermark_ms
        assert previous is None or (current is not None and current >= previous)
        previous = current


# --- closing, lateness, exactly once ---------------------------------------------------------------------


def test_row_for_a_closed_window_is_late_counted_and_does_not_reopen_it() -> None:
    op = WindowOperator(spec(size="5m"))
    op.observe(0, at("12:01"), at("12:01"))
    op.observe(0, at("12:06"), at("12:06"))
    assert op.advance(at("12:06")) == [win("12:00", "12:05")]
    fate = op.observe(0, at("12:04"), at("12:07"))
    assert fate.late and fate.windows == () and fate.closed_windows == (win("12:00", "12:05"),)
    assert fate.behind_watermark
    assert op.late_rows == 1
    assert op.open_windows == (win("12:05", "12:10"),)
    assert op.advance(at("12:08")) == []


def test_each_closed_window_is_returned_exactly_once_in_order() -> None:
    op = WindowOperator(spec("hopping", "2m", slide="1m"))
    for minute in ("12:00", "12:01", "12:02", "12:03"):
        op.observe(0, at(minute), at(minute))
    op.observe(0, at("12:10"), at("12:10"))
    first = op.advance(at("12:10"))
    assert first == [
        win(a, b)
        for a, b in [
            ("11:59", "12:01"),
            ("12:00", "12:02"),
            ("12:01", "12:03"),
            ("12:02", "12:04"),
            ("12:03", "12:05"),
        ]
    ]
    assert op.advance(at("12:10")) == []
    assert op.advance(at("12:20")) == []
    assert op.close_all() == [win("12:09", "12:11"), win("12:10", "12:12")]
    assert op.close_all() == []


def test_idle_timeout_fires_one_timeout_after_the_window_end_on_a_silent_source() -> None:
    op = WindowOperator(spec(size="3m", idle_timeout="1m"))
    op.observe(0, at("12:00"), at("12:00"))
    assert op.advance(at("12:03:59")) == []
    assert op.advance(at("12:04")) == [win("12:00", "12:03")]
    assert op.watermark_ms == at("12:03")


def test_idle_timeout_counts_from_the_last_row_when_rows_came_after_the_window_end() -> None:
    op = WindowOperator(spec(size="3m", idle_timeout="1m"))
    op.observe(0, at("12:00"), at("12:00"))
    op.observe(0, at("12:01"), at("12:03:30"))  # not late: the watermark is still 12:00
    assert op.advance(at("12:04:29")) == []
    assert op.advance(at("12:04:30")) == [win("12:00", "12:03")]


def test_idle_timeout_waits_for_the_allowed_lateness_too() -> None:
    op = WindowOperator(spec(size="3m", idle_timeout="1m", allowed_lateness="2m"))
    op.observe(0, at("12:00"), at("12:00"))
    assert op.advance(at("12:05:59")) == []
    assert op.advance(at("12:06")) == [win("12:00", "12:03")]
    assert op.watermark_ms == at("12:05")
    assert op.close_frontier_ms == at("12:03")


def test_idle_timeout_closes_every_overdue_window_in_one_advance() -> None:
    op = WindowOperator(spec("hopping", "2m", slide="1m", idle_timeout="1m"))
    op.observe(0, at("12:00"), at("12:00"))
    op.observe(0, at("12:01"), at("12:01"))
    assert op.advance(at("12:30")) == [win("11:59", "12:01"), win("12:00", "12:02"), win("12:01", "12:03")]
    assert op.watermark_ms == at("12:03")


def test_processing_time_rows_are_never_late_and_windows_close_on_the_clock() -> None:
    op = WindowOperator(spec(size="1m", boundary="processing_time"))
    fate = op.observe(3, None, at("12:00:30"))
    assert fate.windows == (win("12:00", "12:01"),) and not fate.late
    assert op.advance(at("12:00:59")) == []
    fate = op.observe(3, at("09:00"), at("12:01"))  # a document's own time is ignored
    assert fate.windows == (win("12:01", "12:02"),) and not fate.late
    assert op.advance(at("12:01")) == [win("12:00", "12:01")]
    assert op.watermark_ms is None


def test_processing_time_that_steps_back_neither_reopens_nor_re_emits_windows() -> None:
    op = WindowOperator(spec(size="1m", boundary="processing_time"))
    op.observe(0, None, at("12:00:10"))
    assert op.advance(at("12:01")) == [win("12:00", "12:01")]
    fate = op.observe(0, None, at("12:00:50"))  # the wall clock stepped back 10 s
    assert fate.windows == (win("12:01", "12:02"),) and not fate.late
    assert op.advance(at("12:00:55")) == []


def test_event_time_row_without_an_event_time_is_refused() -> None:
    op = WindowOperator(spec(size="1m"))
    with pytest.raises(ValueError, match="dead-letter"):
        op.observe(0, None, 0)
    with pytest.raises(TypeError, match="epoch milliseconds"):
        op.observe(0, 1.5, 0)  # type: ignore[arg-type]


# --- batches -----------------------------------------------------------------------------------------------


def test_batch_is_judged_against_the_cut_off_before_it() -> None:
    op = WindowOperator(spec(size="5m"))
    op.observe(0, at("12:06"), at("12:06"))  # watermark 12:06: 12:00-12:05 is closed
    fate = op.observe_batch([0, 1, 0, 0], [at("12:04"), at("12:16"), at("12:21"), at("12:09")], at("12:07"))
    assert fate.cutoff_ms == at("12:05")
    assert fate.late == [True, False, False, False]
    assert fate.late_count == 1 and op.late_rows == 1
    assert fate.behind_watermark_count == 1
    # Row by row, 12:09 would arrive after the watermark reached 12:16 and be late; a batch is judged
    # whole against the watermark before it, so 12:09 still joins 12:05-12:10.
    assert fate.windows == (win("12:05", "12:10"), win("12:15", "12:20"), win("12:20", "12:25"))
    assert op.watermark_ms == at("12:16")
    assert op.advance(at("12:07")) == [win("12:05", "12:10")]


def test_batch_of_arrow_timestamps_gives_the_same_fate_as_plain_ints() -> None:
    times = [at("12:04"), at("12:07"), at("12:16"), at("12:11"), at("12:12")]
    partitions = [0, 1, 1, 0, 2]
    plain, arrow = WindowOperator(spec(size="5m")), WindowOperator(spec(size="5m"))
    for op in (plain, arrow):
        op.observe(0, at("12:06"), at("12:06"))
    by_list = plain.observe_batch(partitions, times, at("12:07"))
    stamps = pa.chunked_array([pa.array([t * 1000 for t in times], pa.timestamp("us", tz="UTC"))])
    by_arrow = arrow.observe_batch(pa.array(partitions, pa.int32()), stamps, at("12:07"))
    assert by_arrow.late.to_pylist() == by_list.late
    assert (by_arrow.late_count, by_arrow.windows, by_arrow.behind_watermark_count) == (
        by_list.late_count,
        by_list.windows,
        by_list.behind_watermark_count,
    )
    assert arrow.to_state() == plain.to_state()


def test_arrow_batch_without_event_times_is_refused() -> None:
    op = WindowOperator(spec(size="5m"))
    with pytest.raises(ValueError, match="no event time"):
        op.observe_batch(0, pa.array([1, None], pa.int64()), 0)


def test_processing_time_batch_joins_the_current_window() -> None:
    op = WindowOperator(spec(size="1m", boundary="processing_time"))
    fate = op.observe_batch([4, 5, 4], None, at("12:00:30"))
    assert fate.late == [False, False, False] and fate.windows == (win("12:00", "12:01"),)
    assert op.advance(at("12:01")) == [win("12:00", "12:01")]


# --- checkpoints ---------------------------------------------------------------------------------------


def test_state_round_trip_resumes_without_emitting_a_window_twice() -> None:
    window_spec = spec(size="5m", allowed_lateness="1m", partition_idle_timeout="30s", idle_timeout="2m")
    op = WindowOperator(window_spec)
    op.assign_partitions([0, 1, 2], at("12:00"))
    op.observe(0, at("12:01"), at("12:00:01"))
    op.observe(1, at("12:03"), at("12:00:02"))
    op.observe(0, at("12:08"), at("12:00:03"))
    op.observe(1, at("12:09"), at("12:00:04"))
    assert op.advance(at("12:00:29")) == []  # partition 2 has delivered nothing and holds the watermark
    assert op.advance(at("12:00:30")) == [win("12:00", "12:05")]  # partition 2 idle: watermark 12:08
    assert op.observe(0, at("12:02"), at("12:00:31")).late
    restored = WindowOperator.from_state(window_spec, json.loads(json.dumps(op.to_state())))
    assert restored.to_state() == op.to_state()
    assert restored.late_rows == 1 and restored.open_windows == (win("12:05", "12:10"),)
    for resumed in (op, restored):
        assert resumed.advance(at("12:00:31")) == []
        assert resumed.observe(2, at("12:04"), at("12:00:32")).late  # closed before the checkpoint
        assert resumed.observe(1, at("12:17"), at("12:00:33")).windows == (win("12:15", "12:20"),)
        assert resumed.observe(0, at("12:16"), at("12:00:33")).windows == (win("12:15", "12:20"),)
        assert resumed.advance(at("12:00:34")) == []  # partition 2 rejoined at 12:04 and holds 12:08
        assert resumed.advance(at("12:01:02")) == [win("12:05", "12:10")]  # partition 2 idle again
        assert resumed.watermark_ms == at("12:16") and resumed.late_rows == 2


def test_resuming_with_a_longer_allowed_lateness_does_not_reopen_emitted_windows() -> None:
    op = WindowOperator(spec(size="5m"))
    op.observe(0, at("12:01"), at("12:01"))
    op.observe(0, at("12:07"), at("12:07"))
    assert op.advance(at("12:07")) == [win("12:00", "12:05")]
    patient = spec(size="5m", allowed_lateness="10m")
    restored = WindowOperator.from_state(patient, json.loads(json.dumps(op.to_state())))
    assert restored.close_frontier_ms == at("12:07")  # not 12:07 - 10m: 12:00-12:05 stays emitted
    assert restored.observe(0, at("12:02"), at("12:08")).late
    assert restored.advance(at("12:08")) == []
    assert restored.observe(0, at("12:06"), at("12:08")).windows == (win("12:05", "12:10"),)
    restored.observe(0, at("12:20"), at("12:20"))
    assert restored.advance(at("12:20")) == [win("12:05", "12:10")]  # 12:20 >= 12:10 + 10m


def test_state_of_other_window_shape_is_refused() -> None:
    state = WindowOperator(spec(size="5m")).to_state()
    with pytest.raises(
        WindowStateError, match="tumbling 5m event_time windows but .* tumbling 1m event_time"
    ):
        WindowOperator.from_state(spec(size="1m"), state)
    with pytest.raises(WindowStateError, match="version"):
        WindowOperator.from_state(spec(size="5m"), {**state, "version": 99})


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("row"), st.integers(0, 2), st.integers(-600, 60), st.integers(0, 40)),
        st.tuples(st.just("batch"), st.integers(0, 2), st.integers(-600, 60), st.integers(0, 40)),
        st.tuples(st.just("tick"), st.just(0), st.just(0), st.integers(0, 120)),
        st.tuples(st.just("checkpoint"), st.just(0), st.just(0), st.just(0)),
    ),
    max_size=50,
)
SPECS = st.builds(
    lambda kind, size, windows, tolerance, lateness, part_idle, idle: WindowSpec(
        kind,
        timedelta(seconds=size * windows),
        timedelta(seconds=size) if kind == "hopping" else None,
        time_field="ts",
        out_of_order_tolerance=timedelta(seconds=tolerance),
        allowed_lateness=timedelta(seconds=lateness),
        partition_idle_timeout=None if part_idle is None else timedelta(seconds=part_idle),
        idle_timeout=None if idle is None else timedelta(seconds=idle),
    ),
    kind=st.sampled_from(["tumbling", "hopping"]),
    size=st.sampled_from([30, 60, 120]),
    windows=st.integers(1, 3),
    tolerance=st.sampled_from([0, 10, 60]),
    lateness=st.sampled_from([0, 30, 120]),
    part_idle=st.sampled_from([None, 20, 90]),
    idle=st.sampled_from([None, 30, 120]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(window_spec=SPECS, ops=OPS)
def test_every_window_closes_once_in_order_late_rows_are_exactly_those_of_closed_windows_and_checkpoints_change_nothing(  # noqa: E501
    window_spec: WindowSpec, ops: list[tuple[str, int, int, int]]
) -> None:
    op = WindowOperator(window_spec)
    twin = WindowOperator(window_spec)  # checkpointed and restored at every "checkpoint" step
    now = DAY_MS
    joined: set[Window] = set()
    emitted: list[Window] = []
    frontier_before = None
    late_seen = 0
    for action, partition, offset_s, delay_s in ops:
        now += delay_s * 1000
        event = now + offset_s * 1000
        frontier = op.close_frontier_ms
        if frontier_before is not None:
            assert frontier is not None and frontier >= frontier_before
        frontier_before = frontier
        if action == "row":
            fate = op.observe(partition, event, now)
            assert twin.observe(partition, event, now) == fate
            candidates = windows_for(event, window_spec)
            assert fate.windows == tuple(w for w in candidates if frontier is None or w.end_ms > frontier)
            assert fate.late is (frontier is not None and all(w.end_ms <= frontier for w in candidates))
            assert not set(fate.windows) & set(emitted)
            joined.update(fate.windows)
            late_seen += fate.late
        elif action == "batch":
            events = [event, event - 45_000, event + 5_000]
            batch = op.observe_batch([partition, (partition + 1) % 3, partition], events, now)
            assert twin.observe_batch([partition, (partition + 1) % 3, partition], events, now) == batch
            assert batch.late == classify_late(events, late_cutoff_ms(window_spec, frontier))
            assert not set(batch.windows) & set(emitted)
            joined.update(batch.windows)
            late_seen += batch.late_count
        elif action == "tick":
            closed = op.advance(now)
            assert twin.advance(now) == closed
            assert closed == sorted(closed)
            assert not emitted or not closed or closed[0].end_ms >= emitted[-1].end_ms
            emitted += closed
        else:
            twin = WindowOperator.from_state(window_spec, json.loads(json.dumps(twin.to_state())))
        assert op.late_rows == late_seen
    emitted += op.close_all()
    assert len(emitted) == len(set(emitted))
    assert set(emitted) == joined
    assert emitted == sorted(emitted, key=lambda w: (w.end_ms, w.start_ms))


@settings(max_examples=150, deadline=None)
@given(
    window_spec=SPECS,
    rows=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1_800)), min_size=1, max_size=30),
    warmup=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1_800)), max_size=10),
)
def test_a_batch_flags_no_row_that_row_by_row_observation_would_not(
    window_spec: WindowSpec, rows: list[tuple[int, int]], warmup: list[tuple[int, int]]
) -> None:
    by_batch, by_row = WindowOperator(window_spec), WindowOperator(window_spec)
    for op in (by_batch, by_row):
        for partition, second in warmup:
            op.observe(partition, DAY_MS + second * 1000, DAY_MS)
    times = [DAY_MS + second * 1000 for _, second in rows]
    batch = by_batch.observe_batch([p for p, _ in rows], times, DAY_MS)
    one_by_one = [by_row.observe(p, t, DAY_MS).late for (p, _), t in zip(rows, times, strict=True)]
    assert all(row_late for batch_late, row_late in zip(batch.late, one_by_one, strict=True) if batch_late)
    # A partition first heard of mid-batch holds the batch's watermark back, while row by row it joins
    # after earlier rows have moved the watermark; with every partition known beforehand they agree.
    batch_watermark, row_watermark = by_batch.watermark_ms, by_row.watermark_ms
    assert batch_watermark is None or (row_watermark is not None and batch_watermark <= row_watermark)
    if {p for p, _ in rows} <= {p for p, _ in warmup}:
        assert batch_watermark == row_watermark


# --- configuration -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("allowed_lateness", "2m"),
        ("idle_timeout", "1m"),
        ("out_of_order_tolerance", "10s"),
        ("partition_idle_timeout", "30s"),
        ("time_field", "ts"),
    ],
)
def test_processing_time_window_refuses_event_time_settings(field: str, value: str) -> None:
    with pytest.raises(WindowConfigError) as caught:
        WindowSpec.from_dict(
            {"kind": "tumbling", "size": "5m", "boundary": "processing_time", field: value},
            function="fn_score",
        )
    assert caught.value.field == field
    assert str(caught.value) == (
        f"window of function 'fn_score' uses processing time; {field} only applies to event-time windows: "
        "remove it or set boundary to event_time"
    )


def test_processing_time_window_accepts_zero_lateness_and_null_timeouts() -> None:
    window_spec = WindowSpec.from_dict(
        {
            "kind": "tumbling",
            "size": "5m",
            "boundary": "processing_time",
            "allowed_lateness": "0s",
            "idle_timeout": None,
        }
    )
    assert window_spec.allowed_lateness == timedelta(0) and window_spec.idle_timeout is None


@pytest.mark.parametrize(
    "data, field, fix",
    [
        ({"kind": "tumbling", "size": "0s"}, "size", "positive"),
        ({"kind": "sliding", "size": "5m"}, "kind", "use 'tumbling', 'hopping' or 'session'"),
        ({"kind": "hopping", "size": "5m"}, "slide", "set slide"),
        ({"kind": "hopping", "size": "5m", "slide": "10m"}, "slide", "make slide at most size"),
        ({"kind": "hopping", "size": "5m", "slide": "2m"}, "slide", "choose a slide that divides size"),
        ({"kind": "tumbling", "size": "5m", "slide": "1m"}, "slide", "remove slide, or set kind to hopping"),
        ({"kind": "tumbling", "size": "5m", "allowed_latenes": "1m"}, "allowed_latenes", "fix the spelling"),
        ({"kind": "tumbling", "size": "5 minutes"}, "size", "write it like '500ms'"),
        ({"kind": "tumbling", "size": "5m", "allowed_lateness": "-1s"}, "allowed_lateness", "zero or more"),
        (
            {"kind": "tumbling", "size": "5m", "idle_timeout": "0s"},
            "idle_timeout",
            "remove it to turn it off",
        ),
        ({"kind": "tumbling", "size": "0.5ms"}, "size", "whole number of milliseconds"),
        (
            {"kind": "tumbling", "size": "5m", "aggregates": [{"op": "sum"}]},
            "aggregates[0]",
            "needs the document field",
        ),
        (
            {"kind": "tumbling", "size": "5m", "aggregates": [{"op": "median", "field": "x"}]},
            "aggregates[0]",
            "use one of count",
        ),
        (
            {"kind": "tumbling", "size": "5m", "aggregates": ["count", "count"]},
            "aggregates[1].name",
            "its own name",
        ),
        (
            {
                "kind": "tumbling",
                "size": "5m",
                "group_by": ["country"],
                "aggregates": [{"op": "max", "field": "x", "name": "country"}],
            },
            "aggregates[0].name",
            "another name",
        ),
        ({"kind": "tumbling", "size": "5m", "group_by": ["window_start_ms"]}, "group_by", "rename the field"),
        ({"kind": "tumbling", "size": "5m", "aggregates": []}, "aggregates", "add one"),
        (
            {"kind": "tumbling", "size": "5m", "sink": {"kind": "csv"}},
            "sink.kind",
            "use one of parquet, sqlite",
        ),
        ({"size": "5m"}, "kind", "set it"),
    ],
)
def test_invalid_window_declaration_names_the_field_and_the_fix(data: dict, field: str, fix: str) -> None:
    data = {"time_field": "ts", **data}
    with pytest.raises(WindowConfigError) as caught:
        WindowSpec.from_dict(data, function="fn_score")
    assert caught.value.field == field
    assert str(caught.value).startswith("window of function 'fn_score' ")
    assert fix in str(caught.value)


def test_event_time_window_without_a_time_field_is_refused() -> None:
    with pytest.raises(WindowConfigError, match="no time_field; name the document field") as caught:
        WindowSpec.from_dict({"kind": "tumbling", "size": "5m"})
    assert caught.value.field == "time_field"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1m", timedelta(minutes=1)),
        ("30s", timedelta(seconds=30)),
        ("500ms", timedelta(milliseconds=500)),
        ("2h", timedelta(hours=2)),
        ("1d", timedelta(days=1)),
        ("1m30s", timedelta(seconds=90)),
        ("0.5s", timedelta(milliseconds=500)),
        ("45", timedelta(seconds=45)),
        (90, timedelta(seconds=90)),
        (1.5, timedelta(milliseconds=1500)),
        (timedelta(seconds=3), timedelta(seconds=3)),
    ],
)
def test_durations_read_as_strings_with_units_or_numbers_of_seconds(
    text: object, expected: timedelta
) -> None:
    assert parse_duration(text) == expected
    assert parse_duration(format_duration(expected)) == expected


def test_window_declaration_round_trips_through_json() -> None:
    window_spec = WindowSpec(
        "hopping",
        timedelta(minutes=10),
        timedelta(minutes=5),
        time_field="created_ms",
        group_by=("country", "plan"),
        aggregates=(Aggregate("count"), Aggregate("sum", "amount", "revenue"), Aggregate("avg", "amount")),
        out_of_order_tolerance=timedelta(seconds=10),
        allowed_lateness=timedelta(minutes=1, seconds=30),
        partition_idle_timeout=timedelta(seconds=30),
        idle_timeout=timedelta(minutes=2),
    )
    data = json.loads(json.dumps(window_spec.to_dict()))
    assert data["allowed_lateness"] == "90s" and data["slide"] == "5m"
    assert WindowSpec.from_dict(data) == window_spec
    assert window_spec.aggregates[2].name == "avg_amount"
    tumbling = spec(size="5m")
    assert tumbling.slide == timedelta(minutes=5) and "slide" not in tumbling.to_dict()
    assert WindowSpec.from_dict(tumbling.to_dict()) == tumbling
