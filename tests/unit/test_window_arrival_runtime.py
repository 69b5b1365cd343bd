"""The arrival-time policies in the window runtime (docs/time-semantics.md, seed 003), with in-process workers
and the pure-Python aggregator: the coordinator judges rows by their journalled arrival times before windowing
them, dead-letters what the policies drop, records what they adjust, persists the policies' watermarks with
the window state and counts Azure's metrics. The Ray and Spark version is
tests/integration/test_window_arrival_policies.py."""

from __future__ import annotations

import functools
import json

import pyarrow as pa
import pytest

from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.storage.bucket import LocalBucket
from eventing.testing.windows import (
    SEED_TABLE,
    ManualClock,
    area_files,
    clock_ms,
    python_aggregate,
    python_aggregator,
    reference_arrival_fates,
    results_sink,
)
from eventing.windows.batches import build_row_batch
from eventing.windows.runtime import coordinator as coordinator_module
from eventing.windows.runtime import host
from eventing.windows.runtime.arrivals import LIFTS, ArrivalGate
from eventing.windows.runtime.coordinator import WindowCoordinator
from eventing.windows.runtime.host import WindowOptions
from eventing.windows.runtime.row_writer import RowLayout
from eventing.windows.semantics import WindowSpec
from eventing.workers.executor import InProcessExecutor
from metadata.factory import open_store
from sharding import vbucket_of

DAY = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MIN = 60_000
FN = "fn_arrivals"
BASE = {
    "kind": "tumbling",
    "size": "5m",
    "time_field": "ts",
    "aggregates": ["count", {"op": "sum", "field": "v"}],
    "out_of_order_tolerance": "2m",
    "late_arrival_tolerance": "5m",
    # Windows close only at the end of the input, so which rows a window holds depends on the policies
    # alone, not on how the rows were batched between polls.
    "allowed_lateness": "1h",
}


def keys_in_one_vbucket(n: int) -> list[str]:
    """Keys that all hash to one vBucket: the seed's figures 1 and 2 judge one input partition."""
    target = vbucket_of("seed-0")
    out, i = [], 0
    while len(out) < n:
        key = f"seed-{i}"
        if vbucket_of(key) == target:
            out.append(key)
        i += 1
    return out


class Harness:
    def __init__(self, data_dir: str, monkeypatch: pytest.MonkeyPatch, window: dict):
        self.data_dir = data_dir
        self.window = window
        self.clock = ManualClock(clock_ms(DAY, "12:30"))
        monkeypatch.setattr(host, "make_aggregator", lambda master=None: python_aggregator)
        monkeypatch.setattr(
            coordinator_module, "WindowCoordinator", functools.partial(WindowCoordinator, clock=self.clock)
        )
        self.source = LocalBucket.create(data_dir, "src")
        defn = FunctionDefinition.from_dict(
            {
                "name": FN,
                "source_bucket": "src",
                "worker_count": 2,
                "checkpoint_interval": "10ms",
                "window": window,
            }
        )
        lifecycle.save_function(data_dir, defn, '"""Window-only."""\n')
        lifecycle.deploy(data_dir, FN)
        self.loaded: list[tuple[str, int, int, str | None]] = []

    def load(self, rows: list[tuple[str, str, str]], keys: list[str]) -> None:
        for (event, arrival, device), key in zip(rows, keys, strict=True):
            doc = {"ts": clock_ms(DAY, event), "v": 1.0}
            if device:
                doc["device"] = device
            self.source.upsert(key, doc, arrival_ms=clock_ms(DAY, arrival))
            self.loaded.append((key, clock_ms(DAY, event), clock_ms(DAY, arrival), device or None))

    def run(self, *, close: bool) -> None:
        windows = WindowOptions(close_windows=True) if close else None
        summary = EventingService(
            self.data_dir, InProcessExecutor(), until_caught_up=True, windows=windows
        ).run()
        assert not summary.errors, summary.errors

    def fates(self) -> dict[str, tuple[int | None, str | None]]:
        """Per key: the time the runtime windowed it at (None when dead-lettered) and its DLQ reason."""
        from eventing.ops.windows import adjusted_rows

        with open_store(self.data_dir) as store:
            dlq = {r.key: r.reason for r in store.dlq_rows(FN)}
        moved = {r["key"]: r["windowed_ms"] for r in adjusted_rows(self.data_dir, FN)}
        return {
            key: (None, dlq[key]) if key in dlq else (moved.get(key, event), None)
            for key, event, _, _ in self.loaded
        }

    def expected(self, **policies) -> dict[str, tuple[int | None, str | None]]:
        rows = sorted(((vbucket_of(k), e, a, d, k) for k, e, a, d in self.loaded), key=lambda r: (r[2], r[0]))
        fates = reference_arrival_fates(
            [(vb, e, a, d) for vb, e, a, d, _ in rows],
            out_of_order_tolerance_ms=2 * MIN,
            late_arrival_tolerance_ms=5 * MIN,
            **policies,
        )
        return {r[4]: f for r, f in zip(rows, fates, strict=True)}

    def results(self) -> list[dict]:
        return results_sink(self.data_dir, FN, self.window).read(FN).to_pylist()

    def counters(self) -> dict:
        with open_store(self.data_dir) as store:
            return store.counters(FN)


def expected_results(fates: dict[str, tuple[int | None, str | None]]) -> list[dict]:
    """Window results of the kept rows at their windowed times, computed with plain loops."""
    rows = [{"event_time_ms": t, "v": 1.0} for t, _ in fates.values() if t is not None]
    windows = {(t - t % (5 * MIN), t - t % (5 * MIN) + 5 * MIN) for t in (r["event_time_ms"] for r in rows)}
    return python_aggregate(
        rows,
        size_ms=5 * MIN,
        slide_ms=5 * MIN,
        group_by=[],
        aggregates=[("count", None, "count"), ("sum", "v", "sum_v")],
        windows=windows,
    ).to_pylist()


def test_figure_one_the_early_row_is_dead_lettered_and_late_or_out_of_order_rows_are_windowed_at_the_watermark(  # noqa: E501
    data_dir, monkeypatch, window_files
):
    h = Harness(data_dir, monkeypatch, dict(BASE, early_arrival_policy="drop"))
    keys = keys_in_one_vbucket(len(SEED_TABLE))
    h.load(list(SEED_TABLE), keys)
    h.run(close=True)
    fates = h.fates()
    # The seed's first figure, as it states it: row 3 dropped as early, row 6 windowed at 12:17 (the
    # watermark), row 12 at 12:22 (arrival 12:27 - 5 minutes); row 9 follows from its rules (12:18).
    at = {i + 1: fates[k] for i, k in enumerate(keys)}
    assert at[3] == (None, "early")
    assert at[6] == (clock_ms(DAY, "12:17"), None)
    assert at[9] == (clock_ms(DAY, "12:18"), None)
    assert at[12] == (clock_ms(DAY, "12:22"), None)
    assert fates == h.expected(early_arrival="drop")
    assert h.results() == expected_results(fates)
    c = h.counters()
    assert (
        c["window_early_input_events"],
        c["window_late_input_events"],
        c["window_out_of_order_events"],
    ) == (1, 1, 2)
    assert c["dlq_early"] == 1 and c["window_rows_adjusted"] == 3 and c["window_rows_accepted"] == 11


def test_drop_policies_dead_letter_late_and_out_of_order_rows_with_their_reason(
    data_dir, monkeypatch, window_files
):
    window = dict(BASE, early_arrival_policy="adjust", out_of_order_policy="drop", late_arrival_policy="drop")
    h = Harness(data_dir, monkeypatch, window)
    keys = keys_in_one_vbucket(len(SEED_TABLE))
    h.load(list(SEED_TABLE), keys)
    h.run(close=True)
    fates = h.fates()
    want = h.expected(early_arrival="adjust", out_of_order="drop", late_arrival="drop")
    assert fates == want
    reasons = sorted(r for _, r in fates.values() if r)
    assert reasons == ["late_arrival", "out_of_order", "out_of_order"]
    # The early row is windowed at arrival + 5 minutes, and did not move the watermark: row 4 (12:08) is kept.
    assert fates[keys[2]] == (clock_ms(DAY, "12:16"), None)
    assert fates[keys[3]] == (clock_ms(DAY, "12:08"), None)
    assert h.results() == expected_results(fates)
    store = open_store(data_dir)
    errors = {r.reason: r.error for r in store.dlq_rows(FN)}
    store.close()
    assert "late_arrival_tolerance 5m" in errors["late_arrival"]
    assert (
        "behind the watermark" in errors["out_of_order"]
        and f"vBucket {vbucket_of(keys[0])}" in errors["out_of_order"]
    )


def test_substreams_judge_each_device_against_its_own_watermark_across_vbuckets_and_restarts(
    data_dir, monkeypatch, window_files
):
    window = dict(BASE, early_arrival_policy="drop", substream_key="device")
    h = Harness(data_dir, monkeypatch, window)
    keys = [f"reading-{i}" for i in range(len(SEED_TABLE))]
    assert len({vbucket_of(k) for k in keys}) > 6  # the devices' rows are spread over many vBuckets
    # Half the table, a stop, the rest and one row without a device: the watermarks survive the restart.
    h.load(list(SEED_TABLE[:6]), keys[:6])
    h.run(close=False)
    state = open_store(data_dir).window_states().load(FN)
    assert sorted(s[0][1] for s in state["arrival"]["watermarks"]) == ["device1", "device2", "device3"]
    h.load([*SEED_TABLE[6:], ("12:28", "12:28", "")], [*keys[6:], "no-device"])
    h.run(close=True)
    fates = h.fates()
    assert fates == h.expected(early_arrival="drop", substreams=True)
    # The seed's third figure: fewer rows adjusted, as each device has its own watermark.
    assert fates[keys[5]] == (clock_ms(DAY, "12:12"), None)  # device3 at 12:12 is not behind device3
    assert fates[keys[8]] == (clock_ms(DAY, "12:16"), None)
    assert fates[keys[11]] == (clock_ms(DAY, "12:22"), None)  # late arrival still applies
    assert fates["no-device"] == (None, "no_substream_key")
    assert h.results() == expected_results({k: f for k, f in fates.items()})
    c = h.counters()
    assert (c["window_early_input_events"], c["window_late_input_events"]) == (1, 1)
    assert c.get("window_out_of_order_events", 0) == 0


def test_the_gate_judges_in_arrival_order_and_keeps_early_rows_from_lifting_the_watermark():
    spec = WindowSpec.from_dict(dict(BASE, early_arrival_policy="adjust"))
    layout = RowLayout.for_spec(spec)
    t = [clock_ms(DAY, e) for e, _, _ in SEED_TABLE]
    a = [clock_ms(DAY, x) for _, x, _ in SEED_TABLE]
    n = len(t)
    # Given out of arrival order: the gate sorts them (arrival, vBucket, seqno) first.
    order = list(reversed(range(n)))
    table = build_row_batch(
        layout.schema,
        vb=[7] * n,
        seqno=[i + 1 for i in order],
        key=[f"k{i}" for i in order],
        event_time_ms=[t[i] for i in order],
        arrival_ms=[a[i] for i in order],
    )
    judged = ArrivalGate(layout).judge(table)
    assert judged.kept["seqno"].to_pylist() == list(range(1, n + 1))
    lifts = judged.kept[LIFTS].to_pylist()
    assert lifts == [i != 2 for i in range(n)]  # only the early row (the third) does not lift
    assert judged.adjusted.column("rules").to_pylist()[0] == "early"
    assert judged.kept.schema.field("event_time").type == pa.timestamp("us", tz="UTC")


def test_a_missing_substream_column_value_is_a_dead_letter_not_a_crash():
    spec = WindowSpec.from_dict(dict(BASE, substream_key="device"))
    layout = RowLayout.for_spec(spec)
    assert layout.substream_column == "device#substream"
    table = build_row_batch(
        layout.schema,
        vb=[1, 2],
        seqno=[1, 1],
        key=["a", "b"],
        event_time_ms=[DAY, DAY],
        arrival_ms=[DAY, DAY],
        columns={"device#substream": ["d1", None]},
    )
    judged = ArrivalGate(layout).judge(table)
    assert judged.kept["key"].to_pylist() == ["a"]
    assert judged.dropped["no_substream_key"]["key"].to_pylist() == ["b"]
    assert "substream key field 'device'" in judged.errors["no_substream_key"][0]


def test_eventing_windows_adjusted_lists_the_moved_rows_and_refuses_a_function_without_policies(
    data_dir, monkeypatch, capsys
):
    from eventing.cli import main

    h = Harness(data_dir, monkeypatch, dict(BASE, early_arrival_policy="drop"))
    keys = keys_in_one_vbucket(len(SEED_TABLE))
    h.load(list(SEED_TABLE), keys)
    h.run(close=True)
    capsys.readouterr()
    assert main(["--data-dir", data_dir, "windows", FN, "--adjusted", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["key"], r["windowed_ms"], r["rules"]) for r in rows] == [
        (keys[5], clock_ms(DAY, "12:17"), "out_of_order"),
        (keys[8], clock_ms(DAY, "12:18"), "out_of_order"),
        (keys[11], clock_ms(DAY, "12:22"), "late_arrival"),
    ]
    assert main(["--data-dir", data_dir, "windows", FN, "--adjusted"]) == 0
    out = capsys.readouterr().out
    assert "2026-01-01T12:22:00Z" in out and "late_arrival" in out
    assert main(["--data-dir", data_dir, "windows", FN]) == 0
    assert (
        "arrival-time policies: 2 out-of-order, 1 late input and 1 early input events"
        in capsys.readouterr().out
    )
    plain = FunctionDefinition.from_dict(
        {
            "name": "fn_plain",
            "source_bucket": "src",
            "window": {k: v for k, v in BASE.items() if k != "late_arrival_tolerance"},
        }
    )
    lifecycle.save_function(data_dir, plain, '"""Window-only."""\n')
    assert main(["--data-dir", data_dir, "windows", "fn_plain", "--adjusted"]) != 0
    err = capsys.readouterr().err
    assert (
        "declares no arrival-time policies" in err
        and "Traceback" not in err
        and len(err.strip().splitlines()) == 1
    )


def test_stats_show_azures_metrics(data_dir, monkeypatch):
    from eventing.ops.stats import function_stats

    h = Harness(data_dir, monkeypatch, dict(BASE, early_arrival_policy="drop"))
    h.load(list(SEED_TABLE), keys_in_one_vbucket(len(SEED_TABLE)))
    h.run(close=True)
    stats = function_stats(data_dir, FN)
    policies = stats["arrival_policies"]
    assert (
        policies["early_input_events"],
        policies["late_input_events"],
        policies["out_of_order_events"],
    ) == (1, 1, 2)
    assert policies["dropped_early"] == 1 and policies["rows_adjusted"] == 3
    assert policies["watermark_ms"] == clock_ms(DAY, "12:21")
    assert policies["watermark_delay_ms"] > 0
    json.dumps(stats)
    # The same figures in /metrics (the Prometheus rendering the HTTP server serves).
    from prometheus_client.parser import text_string_to_metric_families

    from eventing.http.metrics import render

    samples = {
        (s.name, tuple(s.labels.values())): s.value
        for f in text_string_to_metric_families(render(data_dir).decode())
        for s in f.samples
    }
    assert samples[("eventing_window_out_of_order_events_total", (FN,))] == 2
    assert samples[("eventing_window_late_input_events_total", (FN,))] == 1
    assert samples[("eventing_window_early_input_events_total", (FN,))] == 1
    assert samples[("eventing_window_rows_adjusted_total", (FN,))] == 3
    assert samples[("eventing_dead_letters_total", (FN, "early"))] == 1
    assert samples[("eventing_watermark_delay_seconds", (FN,))] > 0


def test_substream_rows_wait_for_earlier_arrivals_of_other_vbuckets_whatever_order_the_files_come_in(
    data_dir, window_files
):
    """Two vBuckets whose workers deliver in the wrong order (the later arrivals first), and a coordinator
    restarted while rows wait: the rows are still judged in one arrival order, as the reference does."""
    from eventing.core.mutation import decode_document
    from eventing.windows.runtime.row_writer import WindowRowWriter

    source = LocalBucket.create(data_dir, "src")
    keys: dict[int, list[str]] = {}
    for i in range(20_000):
        keys.setdefault(vbucket_of(f"r{i}"), []).append(f"r{i}")
    vb_a, vb_b = [vb for vb, ks in keys.items() if len(ks) >= 6][:2]
    loaded = []
    for i, (event, arrival, device) in enumerate(SEED_TABLE):
        vb = vb_a if i % 2 == 0 else vb_b
        key = keys[vb][i // 2]
        source.upsert(
            key, {"ts": clock_ms(DAY, event), "v": 1.0, "device": device}, arrival_ms=clock_ms(DAY, arrival)
        )
        loaded.append((vb, clock_ms(DAY, event), clock_ms(DAY, arrival), device, key))
    window = dict(BASE, early_arrival_policy="drop", substream_key="device")
    lifecycle.save_function(
        data_dir,
        FunctionDefinition.from_dict({"name": FN, "source_bucket": "src", "window": window}),
        '"""Window-only."""\n',
    )
    lifecycle.deploy(data_dir, FN)
    store = open_store(data_dir)
    clock = ManualClock(clock_ms(DAY, "12:30"))

    def coordinator() -> WindowCoordinator:
        return WindowCoordinator(
            data_dir,
            FN,
            1,
            window,
            store,
            aggregator=python_aggregator,
            clock=clock,
            close_windows=True,
            source_bucket="src",
        )

    layout = RowLayout.for_definition(FN, window)

    def deliver(vb: int, after: int, limit: int) -> None:
        writer = WindowRowWriter(data_dir, FN, 1, f"w{vb}-{after}", layout)
        for m in source.read_vb(vb, after, limit):
            assert writer.add(m, decode_document(m.doc))
        writer.flush()

    c = coordinator()
    deliver(vb_b, 0, 6)  # every row of b, whose first arrives after a's first: all wait
    c.poll()
    assert sum(rows for _, rows in c.held) == 6 and store.dlq_rows(FN) == []
    deliver(vb_a, 0, 3)  # a's first three: rows that arrived before a's fourth (12:18) go, the rest wait
    c.poll()
    assert sum(rows for _, rows in c.held) == 3  # b's rows that arrived at 12:19, 12:22 and 12:27
    c.close()
    c = coordinator()  # a restart while rows wait: they come back from the state
    assert sum(rows for _, rows in c.held) == 3
    deliver(vb_a, 3, 3)
    c.finish(end_of_input=True)
    assert c.held == [] and area_files(data_dir, FN, "held") == []
    c.close()
    from eventing.ops.windows import adjusted_rows

    dlq = {r.key: r.reason for r in store.dlq_rows(FN)}
    moved = {r["key"]: r["windowed_ms"] for r in adjusted_rows(data_dir, FN)}
    got = [(None, dlq[k]) if k in dlq else (moved.get(k, e), None) for _, e, _, _, k in loaded]
    want = reference_arrival_fates(
        [(vb, e, a, d) for vb, e, a, d, _ in loaded],
        out_of_order_tolerance_ms=2 * MIN,
        late_arrival_tolerance_ms=5 * MIN,
        early_arrival="drop",
        substreams=True,
    )
    assert got == want
    results = results_sink(data_dir, FN, window).read(FN).to_pylist()
    assert results == expected_results({k: f for (_, _, _, _, k), f in zip(loaded, want, strict=True)})
    store.close()


def test_session_windows_take_the_policies_windowed_times_too(data_dir, monkeypatch, window_files):
    from eventing.testing.windows import reference_sessions

    window = {
        "kind": "session",
        "gap": "3m",
        "time_field": "ts",
        "aggregates": ["count", {"op": "sum", "field": "v"}],
        "out_of_order_tolerance": "2m",
        "late_arrival_tolerance": "5m",
        "early_arrival_policy": "drop",
        "allowed_lateness": "1h",
    }
    h = Harness(data_dir, monkeypatch, window)
    keys = keys_in_one_vbucket(len(SEED_TABLE))
    h.load(list(SEED_TABLE), keys)
    h.run(close=True)
    fates = h.fates()
    assert fates == h.expected(early_arrival="drop")
    docs, times = [], {}
    for m in h.source.read_vb(vbucket_of(keys[0]), 0, 100):
        at, reason = fates[m.key]
        if reason is None:
            docs.append((m.vb, m.seqno, {"ts": 0, "v": 1.0}))
            times[(m.vb, m.seqno)] = at
    want = reference_sessions(docs, WindowSpec.from_dict(window), times=times).to_pylist()
    assert h.results() == want
    assert len(want) == 2  # rows windowed at 12:07-12:08, and at 12:17-12:23


# -- the batch form of the policies agrees with the row-by-row form -------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from eventing.windows.semantics.arrival import DROP_REASONS, NO_WATERMARK, ArrivalPolicy  # noqa: E402


@st.composite
def policy_batches(draw):
    settings_ = dict(
        out_of_order_tolerance_ms=draw(st.sampled_from([0, 2 * MIN])),
        out_of_order=draw(st.sampled_from(["adjust", "drop"])),
        late_arrival_tolerance_ms=draw(st.sampled_from([None, 0, 5 * MIN])),
        late_arrival=draw(st.sampled_from(["adjust", "drop"])),
        early_arrival=draw(st.sampled_from([None, "adjust", "drop"])),
        substreams=draw(st.booleans()),
    )
    batches = []
    for _ in range(draw(st.integers(1, 3))):
        rows = draw(
            st.lists(
                st.tuples(
                    st.integers(0, 40).map(lambda m: DAY + m * MIN),  # event time
                    st.integers(0, 40).map(lambda m: DAY + m * MIN),  # arrival time
                    st.sampled_from([0, 1, 2]),  # vBucket
                    st.sampled_from(["d1", "d2", 3, None]),  # substream key
                ),
                max_size=25,
            )
        )
        batches.append(rows)
    return settings_, batches


@settings(max_examples=120, deadline=None)
@given(case=policy_batches())
def test_observe_batch_gives_the_fates_state_and_metrics_of_observe_row_by_row(case):
    settings_, batches = case
    one, many = ArrivalPolicy(**settings_), ArrivalPolicy(**settings_)
    for rows in batches:
        expected = [one.observe(t, a, partition=vb, key=k) for t, a, vb, k in rows]
        got = many.observe_batch(
            [r[0] for r in rows],
            [r[1] for r in rows],
            partitions=[r[2] for r in rows],
            keys=[r[3] for r in rows],
        )
        for i, fate in enumerate(expected):
            assert DROP_REASONS[got.reason[i]] == fate.reason, i
            if fate.time_ms is not None:
                assert got.time_ms[i] == fate.time_ms, i
            assert (bool(got.early[i]), bool(got.late_arrival[i]), bool(got.out_of_order[i])) == (
                fate.early,
                fate.late_arrival,
                fate.out_of_order,
            ), i
            if fate.out_of_order:
                assert got.watermark_ms[i] != NO_WATERMARK and got.watermark_ms[i] == fate.watermark_ms
        mine, theirs = many.to_state(), one.to_state()
        assert mine["metrics"] == theirs["metrics"]
        assert {json.dumps(s): w for s, w in mine["watermarks"]} == {
            json.dumps(s): w for s, w in theirs["watermarks"]
        }
