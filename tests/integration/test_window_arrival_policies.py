"""Azure Stream Analytics' arrival-time policies in the window runtime on real Ray workers and real PySpark
(docs/time-semantics.md, seed 003), on the seed's example table loaded with its arrival times
(``LocalBucket.upsert`` takes the arrival time a mutation is journalled with, as an import would; every run
judges by that journalled time, never by when it read the row).

Row by row, for each figure of the seed and the drop variants: which rows were windowed at which time
(``eventing windows FN --adjusted``), which went to the dead-letter queue with which reason, the window
results against a plain computation of the same rules, and Azure's counters in ``eventing stats --json`` and
``/metrics``. Substreams by device id spread over many vBuckets. A stop/start in the middle and a service
killed between its state commit and its sink write give identical results."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.ops.windows import adjusted_rows
from eventing.storage.bucket import LocalBucket
from eventing.testing.windows import SEED_TABLE, clock_ms, python_aggregate, reference_arrival_fates
from eventing.windows.runtime.emission import FAULT_ENV, FAULT_EXIT_CODE
from eventing.windows.runtime.host import WindowOptions
from eventing.windows.runtime.paths import WindowPaths
from eventing.windows.spark.sink import ParquetWindowSink
from metadata.factory import open_store
from sharding import vbucket_of

pytestmark = pytest.mark.integration

CLOSE_WINDOWS = WindowOptions(close_windows=True)
DAY = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MIN = 60_000
BASE = {
    "kind": "tumbling",
    "size": "5m",
    "time_field": "ts",
    "group_by": ["device"],
    "aggregates": ["count", {"op": "sum", "field": "temp"}],
    # The seed's tolerances: out of order 2 minutes, late arrival 5 minutes (early arrival is fixed at 5).
    "out_of_order_tolerance": "2m",
    "late_arrival_tolerance": "5m",
    # Windows close at the end of the input: what a window holds depends on the policies alone.
    "allowed_lateness": "1h",
}
# name: (source bucket, window settings, reference settings)
FUNCTIONS = {
    "fn_fig1": ("one_vb", {"early_arrival_policy": "drop"}, {"early_arrival": "drop"}),
    "fn_fig2": ("one_vb", {"out_of_order_policy": "adjust"}, {"early_arrival": None}),
    "fn_drops": (
        "one_vb",
        {"early_arrival_policy": "adjust", "out_of_order_policy": "drop", "late_arrival_policy": "drop"},
        {"early_arrival": "adjust", "out_of_order": "drop", "late_arrival": "drop"},
    ),
    "fn_devices": (
        "spread",
        {"early_arrival_policy": "drop", "substream_key": "device"},
        {"early_arrival": "drop", "substreams": True},
    ),
}
NO_DEVICE = ("12:28", "12:28", None)  # a reading without its device: no substream


def one_vbucket_keys(n: int) -> list[str]:
    """The seed's figures 1 and 2 judge one input partition: here one vBucket, so keys that share one."""
    target, out, i = vbucket_of("reading-0"), [], 0
    while len(out) < n:
        if vbucket_of(f"reading-{i}") == target:
            out.append(f"reading-{i}")
        i += 1
    return out


ROWS = [*SEED_TABLE, NO_DEVICE]
KEYS = {"one_vb": one_vbucket_keys(len(ROWS)), "spread": [f"reading-{i}" for i in range(len(ROWS))]}


def load(data_dir: str, bucket: str, rows: range) -> None:
    source = LocalBucket.create(data_dir, bucket, exist_ok=True)
    for i in rows:
        event, arrival, device = ROWS[i]
        doc = {"ts": clock_ms(DAY, event), "temp": 20.0 + i}
        if device is not None:
            doc["device"] = device
        source.upsert(KEYS[bucket][i], doc, arrival_ms=clock_ms(DAY, arrival))
    source.close()


def deploy(data_dir: str, names: list[str]) -> None:
    for name in names:
        bucket, settings, _ = FUNCTIONS[name]
        defn = FunctionDefinition.from_dict(
            {
                "name": name,
                "source_bucket": bucket,
                "worker_count": 2,
                "checkpoint_interval": "50ms",
                "window": dict(BASE, **settings),
            }
        )
        lifecycle.save_function(data_dir, defn, '"""Window-only: the window does the work."""\n')
        lifecycle.deploy(data_dir, name)


def run(data_dir: str, executor, *, close: bool) -> None:
    windows = CLOSE_WINDOWS if close else None
    summary = EventingService(data_dir, executor, until_caught_up=True, windows=windows).run()
    assert not summary.errors, summary.errors


def expected_fates(name: str) -> dict[str, tuple[int | None, str | None]]:
    """Per key, from the plain reference of the seed's rules: windowed time, or the dead-letter reason."""
    bucket, _, settings = FUNCTIONS[name]
    keys = KEYS[bucket]
    rows = sorted(  # arrival order: arrival time, then vBucket
        (
            (clock_ms(DAY, a), vbucket_of(k), clock_ms(DAY, e), d, k)
            for (e, a, d), k in zip(ROWS, keys, strict=True)
        ),
        key=lambda r: r[:2],
    )
    fates = reference_arrival_fates(
        [(vb, e, a, d) for a, vb, e, d, _ in rows],
        out_of_order_tolerance_ms=2 * MIN,
        late_arrival_tolerance_ms=5 * MIN,
        **settings,
    )
    return {r[4]: f for r, f in zip(rows, fates, strict=True)}


def runtime_fates(data_dir: str, name: str) -> dict[str, tuple[int | None, str | None]]:
    """Per key, what the runtime did: the time it windowed the row at (from its adjusted-rows record, else
    the event time), or the dead-letter reason."""
    bucket = FUNCTIONS[name][0]
    store = open_store(data_dir)
    try:
        dlq = {r.key: r.reason for r in store.dlq_rows(name)}
    finally:
        store.close()
    moved = {r["key"]: r["windowed_ms"] for r in adjusted_rows(data_dir, name)}
    return {
        key: (None, dlq[key]) if key in dlq else (moved.get(key, clock_ms(DAY, event)), None)
        for (event, _, _), key in zip(ROWS, KEYS[bucket], strict=True)
    }


def results(data_dir: str, name: str) -> list[dict]:
    return ParquetWindowSink(WindowPaths.of(data_dir, name).root / "results").read(name).to_pylist()


def reference_results(name: str) -> list[dict]:
    """The window results of the reference's kept rows at their windowed times, in plain loops."""
    bucket = FUNCTIONS[name][0]
    fates = expected_fates(name)
    rows = []
    for i, ((_, _, device), key) in enumerate(zip(ROWS, KEYS[bucket], strict=True)):
        t, _ = fates[key]
        if t is not None:
            rows.append({"event_time_ms": t, "device": device, "temp": 20.0 + i})
    windows = {
        (r["event_time_ms"] // (5 * MIN) * 5 * MIN, r["event_time_ms"] // (5 * MIN) * 5 * MIN + 5 * MIN)
        for r in rows
    }
    return python_aggregate(
        rows,
        size_ms=5 * MIN,
        slide_ms=5 * MIN,
        group_by=["device"],
        aggregates=[("count", None, "count"), ("sum", "temp", "sum_temp")],
        windows=windows,
    ).to_pylist()


def stats_json(data_dir: str, name: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "eventing", "--data-dir", data_dir, "stats", name, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def one_shot(tmp_path_factory, ray_session, spark):
    """Every function deployed on the whole table, one `eventing run --until-caught-up --close-windows` on
    Ray."""
    from eventing.workers.executor import RayExecutor

    data_dir = str(tmp_path_factory.mktemp("arrivals") / "data")
    load(data_dir, "one_vb", range(len(ROWS)))
    load(data_dir, "spread", range(len(ROWS)))
    deploy(data_dir, list(FUNCTIONS))
    run(data_dir, RayExecutor(), close=True)
    return data_dir


# The seed's figures, as it states them (rows numbered from 1; the rest follow from its rules).
SEED_STATES = {
    "fn_fig1": {3: (None, "early"), 6: ("12:17", None), 12: ("12:22", None)},
    "fn_fig2": {3: ("12:17", None), 4: ("12:15", None), 6: ("12:17", None), 12: ("12:22", None)},
    "fn_devices": {
        3: (None, "early"),
        6: ("12:12", None),
        9: ("12:16", None),
        12: ("12:22", None),
        13: (None, "no_substream_key"),
    },
}


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_each_policy_windows_and_dead_letters_every_row_as_the_seeds_rules_say(one_shot, name):
    data_dir = one_shot
    got = runtime_fates(data_dir, name)
    assert got == expected_fates(name)
    keys = KEYS[FUNCTIONS[name][0]]
    for row, (at, reason) in SEED_STATES.get(name, {}).items():
        assert got[keys[row - 1]] == (None if at is None else clock_ms(DAY, at), reason), f"row {row}"
    # The adjusted rows' record keeps the document's event time and names the rules that moved each row.
    for r in adjusted_rows(data_dir, name):
        assert r["event_time_ms"] != r["windowed_ms"] and r["rules"]
    assert results(data_dir, name) == reference_results(name)


def test_drop_policies_dead_letter_with_the_reason_and_the_setting_that_decided(one_shot):
    store = open_store(one_shot)
    try:
        dlq = store.dlq_rows("fn_drops")
    finally:
        store.close()
    assert sorted(r.reason for r in dlq) == ["late_arrival", "out_of_order", "out_of_order"]
    for r in dlq:
        assert r.mutation, "the dead letter carries the mutation, so it can be inspected and replayed"
        setting = "late_arrival_tolerance 5m" if r.reason == "late_arrival" else "out_of_order_tolerance 2m"
        assert setting in r.error
    # Early rows are adjusted here (to arrival + 5 minutes) and never moved the watermark.
    early = [r for r in adjusted_rows(one_shot, "fn_drops") if r["rules"] == "early"]
    assert [(r["event_time_ms"], r["windowed_ms"]) for r in early] == [
        (clock_ms(DAY, "12:17"), clock_ms(DAY, "12:16"))
    ]


def test_azures_metrics_in_stats_json_and_in_metrics(one_shot):
    from eventing.http.auth import ServerConfig
    from eventing.http.server import start_in_thread

    want = {  # (early, late, out of order) input events, rows adjusted, dead letters by reason
        "fn_fig1": ((1, 1, 2), 3, {"early": 1}),
        "fn_fig2": ((0, 1, 3), 4, {}),
        "fn_drops": ((1, 1, 2), 1, {"late_arrival": 1, "out_of_order": 2}),
        "fn_devices": ((1, 1, 0), 1, {"early": 1, "no_substream_key": 1}),
    }
    for name, (events, adjusted, dropped) in want.items():
        stats = stats_json(one_shot, name)
        p = stats["arrival_policies"]
        assert (p["early_input_events"], p["late_input_events"], p["out_of_order_events"]) == events, name
        assert p["rows_adjusted"] == adjusted and p["rows_held"] == 0
        assert {k[len("dropped_") :]: v for k, v in p.items() if k.startswith("dropped_") and v} == dropped
        assert p["watermark_delay_ms"] > 0
        assert stats["window"]["rows_accepted"] == len(ROWS) - sum(dropped.values())
    config = ServerConfig(
        one_shot, port=_free_port(), admin_token="admin-token-0123456789", read_token="read-token-0123456789"
    )
    server = start_in_thread(config)
    try:
        text = httpx.get(
            f"http://127.0.0.1:{config.port}/metrics",
            headers={"Authorization": "Bearer read-token-0123456789"},
            timeout=60,
        ).text
    finally:
        server.should_exit = True
    samples = {
        (s.name, tuple(s.labels.values())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    for name, ((early, late, ooo), adjusted, dropped) in want.items():
        assert samples[("eventing_window_early_input_events_total", (name,))] == early
        assert samples[("eventing_window_late_input_events_total", (name,))] == late
        assert samples[("eventing_window_out_of_order_events_total", (name,))] == ooo
        assert samples[("eventing_window_rows_adjusted_total", (name,))] == adjusted
        assert samples[("eventing_watermark_delay_seconds", (name,))] > 0
        for reason, n in dropped.items():
            assert samples[("eventing_dead_letters_total", (name, reason))] == n


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_stop_and_start_in_the_middle_gives_identical_results(one_shot, data_dir, ray_executor, spark):
    """Half the table, a run that stops with windows open, the rest, a second run: the policies' watermarks
    come back from the window state, so every row meets the same fate as in the one-shot run."""
    names = ["fn_fig1", "fn_devices"]
    load(data_dir, "one_vb", range(7))
    load(data_dir, "spread", range(7))
    deploy(data_dir, names)
    run(data_dir, ray_executor, close=False)
    state = open_store(data_dir).window_states().load("fn_devices")
    assert sorted(w[0][1] for w in state["arrival"]["watermarks"]) == ["device1", "device2", "device3"]
    load(data_dir, "one_vb", range(7, len(ROWS)))
    load(data_dir, "spread", range(7, len(ROWS)))
    run(data_dir, ray_executor, close=True)
    for name in names:
        assert runtime_fates(data_dir, name) == runtime_fates(one_shot, name)
        assert results(data_dir, name) == results(one_shot, name)
        assert stats_json(data_dir, name)["arrival_policies"] | {"watermark_delay_ms": 0} == stats_json(
            one_shot, name
        )["arrival_policies"] | {"watermark_delay_ms": 0}


def test_a_service_killed_after_its_state_commit_gives_identical_results(
    one_shot, data_dir, ray_executor, spark
):
    """The service dies (os._exit, as kill -9) right after committing the closed windows and the policies'
    state, before the sink write; the next run on Ray emits them, and every fate is the one-shot run's."""
    names = ["fn_devices"]
    load(data_dir, "spread", range(len(ROWS)))
    deploy(data_dir, names)
    driver = subprocess.run(
        [
            sys.executable,
            "-m",
            "eventing",
            "--data-dir",
            data_dir,
            "run",
            "--until-caught-up",
            "--quiet",
            "--executor",
            "in-process",
            "--close-windows",
            "--spark-master",
            "local[1]",
        ],
        env={**os.environ, FAULT_ENV: "after_state_commit"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert driver.returncode == FAULT_EXIT_CODE, driver.stderr[-2000:]
    assert results(data_dir, "fn_devices") == []
    run(data_dir, ray_executor, close=True)
    assert runtime_fates(data_dir, "fn_devices") == runtime_fates(one_shot, "fn_devices")
    assert results(data_dir, "fn_devices") == results(one_shot, "fn_devices")


# -- windows closed per substream, on each device's own clock ---------------------------------------------

PACES_WINDOW = {
    "kind": "tumbling",
    "size": "1m",
    "time_field": "ts",
    "group_by": ["device"],
    "aggregates": ["count", {"op": "sum", "field": "temp"}],
    "out_of_order_tolerance": "30s",
    "late_arrival_tolerance": "5m",
    "substream_key": "device",
    "allowed_lateness": "0s",
}
T12 = clock_ms(DAY, "12:00")


def pace_rows() -> list[tuple[str, int, int]]:
    """(device, event ms, arrival ms), every 20 s of arrival for 12 minutes: `fast` on time, `slow` with its
    clock 3 minutes behind, `quiet` silent after 12:02:40."""
    rows = []
    for i in range(36):
        arrival = T12 + i * 20_000
        rows += [("fast", arrival, arrival), ("slow", arrival - 3 * MIN, arrival)]
        if i < 9:
            rows.append(("quiet", arrival, arrival))
    return rows


def load_paces(data_dir: str, rows: range) -> None:
    source = LocalBucket.create(data_dir, "paces", exist_ok=True)
    all_rows = pace_rows()
    for i in rows:
        device, event, arrival = all_rows[i]
        source.upsert(f"pace-{i}", {"ts": event, "temp": float(i), "device": device}, arrival_ms=arrival)
    source.close()


def reference_paces() -> list[dict]:
    """The windows each device's own watermark closes, in plain loops: per device, max(greatest event time -
    out-of-order tolerance, newest arrival - late-arrival tolerance) (seed 003's rule for a silent input)."""
    rows = pace_rows()
    clock = max(a for _, _, a in rows)
    out = []
    for device in ("fast", "quiet", "slow"):
        mine = [
            {"event_time_ms": t, "device": d, "temp": float(i)}
            for i, (d, t, _) in enumerate(rows)
            if d == device
        ]
        mark = max(max(r["event_time_ms"] for r in mine) - 30_000, clock - 5 * MIN)
        closed = {(s, s + MIN) for s in {r["event_time_ms"] // MIN * MIN for r in mine} if s + MIN <= mark}
        out += python_aggregate(
            mine,
            size_ms=MIN,
            slide_ms=MIN,
            group_by=["device"],
            aggregates=[("count", None, "count"), ("sum", "temp", "sum_temp")],
            windows=closed,
        ).to_pylist()
    return sorted(out, key=lambda r: (r["window_start_ms"], r["device"]))


def paces_results(data_dir: str) -> list[dict]:
    return sorted(results(data_dir, "fn_paces"), key=lambda r: (r["window_start_ms"], r["device"]))


def test_each_device_closes_its_windows_on_its_own_clock_and_a_stop_changes_nothing(
    tmp_path, ray_executor, spark
):
    """Without --close-windows only watermarks close windows: fast's close on fast's clock, slow's lag 3
    minutes behind without holding fast's back, and quiet's close as the arrival clock moves on. The same
    after a stop and start in the middle (the substreams' clocks come back from the window state)."""
    n = len(pace_rows())
    runs = {}
    for name, cuts in (("one_shot", [n]), ("stopped", [n // 2, n])):
        data_dir = str(tmp_path / name)
        defn = FunctionDefinition.from_dict(
            {
                "name": "fn_paces",
                "source_bucket": "paces",
                "worker_count": 2,
                "checkpoint_interval": "50ms",
                "window": PACES_WINDOW,
            }
        )
        LocalBucket.create(data_dir, "paces", exist_ok=True).close()
        lifecycle.save_function(data_dir, defn, '"""Window-only: the window does the work."""\n')
        lifecycle.deploy(data_dir, "fn_paces")
        done = 0
        for cut in cuts:
            load_paces(data_dir, range(done, cut))
            done = cut
            run(data_dir, ray_executor, close=False)
        runs[name] = paces_results(data_dir)
    want = reference_paces()
    assert runs["one_shot"] == want
    assert runs["stopped"] == want
    last = {d: max(r["window_start_ms"] for r in want if r["device"] == d) for d in ("fast", "slow", "quiet")}
    # Arrival clock 12:11:40: fast at 12:11:10, slow at 12:08:10, quiet (silent since 12:02:40) at 12:06:40.
    assert last == {"fast": T12 + 10 * MIN, "slow": T12 + 7 * MIN, "quiet": T12 + 2 * MIN}
