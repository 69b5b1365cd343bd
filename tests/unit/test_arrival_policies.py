"""Azure Stream Analytics' arrival-time policies (seed 003), row by row on the seed's example table under
each of its three figures, plus the drop variants, the metrics and the declaration checks.

The seed's tolerances for its figures: early arrival 5 minutes, late arrival 5 minutes, out of order
(reordering) 2 minutes. Each expected row is (event time, arrival time, device, time it is windowed at or
None when dropped, outcome, dead-letter reason, watermark after it).

Where the seed states a value it is quoted next to the row. The values it leaves open are derived from its
rules and marked "derived": the watermark after every row (greatest windowed time so far - 2 minutes, never
backwards); that an adjusted row's windowed time moves the watermark like any other (in these tables it never
raises it); and that the third figure (substreams by DeviceId) uses the first figure's tolerances, with the
early-arrival policy on.
"""

from __future__ import annotations

import pytest

from eventing.windows.semantics import WindowConfigError, WindowSpec
from eventing.windows.semantics.arrival import ArrivalPolicy

DAY = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MIN = 60_000


def hm(text: str) -> int:
    hours, minutes = text.split(":")
    return DAY + (int(hours) * 60 + int(minutes)) * MIN


TABLE = [  # the seed's example data: event time, arrival time, DeviceId
    ("12:07", "12:07", "device1"),
    ("12:08", "12:08", "device2"),
    ("12:17", "12:11", "device1"),
    ("12:08", "12:13", "device3"),
    ("12:19", "12:16", "device1"),
    ("12:12", "12:17", "device3"),
    ("12:17", "12:18", "device2"),
    ("12:20", "12:19", "device2"),
    ("12:16", "12:21", "device3"),
    ("12:23", "12:22", "device2"),
    ("12:22", "12:24", "device2"),
    ("12:21", "12:27", "device3"),
]

# (windowed at, outcome, reason, watermark after)
FIGURE_1 = [  # early-arrival policy on
    ("12:07", "kept", None, "12:05"),  # seed: ordered, processed without adjustment (watermark derived)
    ("12:08", "kept", None, "12:06"),  # seed: idem
    (None, "dropped", "early", "12:06"),  # seed: 6 minutes early, dropped; the watermark does not move
    ("12:08", "kept", None, "12:06"),  # seed: processed without adjustment
    ("12:19", "kept", None, "12:17"),  # seed: idem; watermark 12:17 (seed, at the next row)
    ("12:17", "adjusted", None, "12:17"),  # seed: behind the watermark, adjusted to it (12:17)
    ("12:17", "kept", None, "12:17"),  # derived: equal to the watermark is not behind it
    ("12:20", "kept", None, "12:18"),  # derived
    ("12:18", "adjusted", None, "12:18"),  # derived: 12:16 behind 12:18, adjusted
    ("12:23", "kept", None, "12:21"),  # derived
    ("12:22", "kept", None, "12:21"),  # derived; seed: the watermark is 12:21 before the twelfth row
    ("12:22", "adjusted", None, "12:21"),  # seed: late arrival, adjusted to 12:22, above the watermark 12:21
]

FIGURE_2 = [  # no early-arrival policy
    ("12:07", "kept", None, "12:05"),
    ("12:08", "kept", None, "12:06"),
    ("12:17", "kept", None, "12:15"),  # seed: not dropped; the watermark rises to 12:15
    ("12:15", "adjusted", None, "12:15"),  # seed: the fourth event is moved 7 minutes, 12:08 -> 12:15
    ("12:19", "kept", None, "12:17"),  # derived from here on: as in the first figure
    ("12:17", "adjusted", None, "12:17"),
    ("12:17", "kept", None, "12:17"),
    ("12:20", "kept", None, "12:18"),
    ("12:18", "adjusted", None, "12:18"),
    ("12:23", "kept", None, "12:21"),
    ("12:22", "kept", None, "12:21"),
    ("12:22", "adjusted", None, "12:21"),
]

FIGURE_3 = [  # substreams by DeviceId: the watermark after each row is its device's (all derived)
    ("12:07", "kept", None, "12:05"),
    ("12:08", "kept", None, "12:06"),
    (None, "dropped", "early", "12:05"),  # device1's watermark
    ("12:08", "kept", None, "12:06"),
    ("12:19", "kept", None, "12:17"),
    ("12:12", "kept", None, "12:10"),  # seed: fewer adjusted events; device3 is not behind its own watermark
    ("12:17", "kept", None, "12:15"),
    ("12:20", "kept", None, "12:18"),
    ("12:16", "kept", None, "12:14"),  # not adjusted either, unlike the first figure
    ("12:23", "kept", None, "12:21"),
    ("12:22", "kept", None, "12:21"),
    ("12:22", "adjusted", None, "12:20"),  # the late-arrival rule still applies per row
]

FIGURES = {
    "figure1-early-policy": (dict(early_arrival="drop"), FIGURE_1, {"early": 1, "late": 1, "ooo": 2}),
    "figure2-no-early-policy": (dict(early_arrival=None), FIGURE_2, {"early": 0, "late": 1, "ooo": 3}),
    "figure3-substreams": (
        dict(early_arrival="drop", substreams=True),
        FIGURE_3,
        {"early": 1, "late": 1, "ooo": 0},
    ),
}


def seed_policy(**extra) -> ArrivalPolicy:
    return ArrivalPolicy(out_of_order_tolerance_ms=2 * MIN, late_arrival_tolerance_ms=5 * MIN, **extra)


def run_table(policy: ArrivalPolicy):
    return [policy.observe(hm(e), hm(a), key=device) for e, a, device in TABLE]


CASES = [pytest.param(name, i, id=f"{name}-row{i + 1}") for name in FIGURES for i in range(len(TABLE))]


@pytest.mark.parametrize(("figure", "row"), CASES)
def test_seed_table_row_by_row(figure, row):
    settings, expected, _ = FIGURES[figure]
    fates = run_table(seed_policy(**settings))
    at, outcome, reason, watermark = expected[row]
    fate = fates[row]
    assert fate.time_ms == (None if at is None else hm(at))
    assert fate.outcome == outcome
    assert fate.reason == reason
    assert fate.watermark_ms == hm(watermark)


@pytest.mark.parametrize("figure", FIGURES)
def test_seed_table_metrics(figure):
    settings, _, want = FIGURES[figure]
    policy = seed_policy(**settings)
    run_table(policy)
    assert (policy.early_input_events, policy.late_input_events, policy.out_of_order_events) == (
        want["early"],
        want["late"],
        want["ooo"],
    )
    assert policy.watermark_delay_ms(hm("12:27")) == hm("12:27") - policy.max_watermark_ms


def test_flags_name_the_rule_each_adjusted_row_met():
    fates = run_table(seed_policy(early_arrival="drop"))
    assert [i + 1 for i, f in enumerate(fates) if f.out_of_order] == [6, 9]
    assert [i + 1 for i, f in enumerate(fates) if f.late_arrival] == [12]
    assert [i + 1 for i, f in enumerate(fates) if f.early] == [3]


def test_drop_policies_send_rows_to_the_dead_letter_queue_with_their_reason():
    fates = run_table(seed_policy(early_arrival="drop", out_of_order="drop", late_arrival="drop"))
    dropped = {i + 1: f.reason for i, f in enumerate(fates) if f.outcome == "dropped"}
    assert dropped == {3: "early", 6: "out_of_order", 9: "out_of_order", 12: "late_arrival"}
    assert fates[-1].watermark_ms == hm("12:21")  # dropped rows never move the watermark


def test_an_adjusted_early_row_is_windowed_at_arrival_plus_five_minutes_and_leaves_the_watermark():
    fates = run_table(seed_policy(early_arrival="adjust"))
    assert (fates[2].time_ms, fates[2].outcome, fates[2].watermark_ms) == (
        hm("12:16"),
        "adjusted",
        hm("12:06"),
    )
    assert fates[3].outcome == "kept"  # the fourth row is not dragged forward as in the second figure


def test_a_row_without_its_substream_key_is_dropped_not_a_crash():
    policy = seed_policy(substreams=True)
    fate = policy.observe(hm("12:00"), hm("12:00"), key=None)
    assert (fate.outcome, fate.reason, fate.time_ms) == ("dropped", "no_substream_key", None)


def test_a_silent_input_advances_to_arrival_minus_the_late_tolerance():
    policy = seed_policy()
    policy.observe(hm("12:00"), hm("12:00"))
    policy.advance(hm("12:30"))
    assert policy.watermark_ms() == hm("12:25")
    policy.advance(hm("12:10"))  # never back
    assert policy.watermark_ms() == hm("12:25")


# -- declarations --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        ({"out_of_order_policy": "fix"}, "out_of_order_policy", "use 'adjust' or 'drop'"),
        ({"early_arrival_policy": "ignore"}, "early_arrival_policy", "use 'adjust' or 'drop'"),
        ({"late_arrival_policy": "drop"}, "late_arrival_policy", "set late_arrival_tolerance"),
        ({"substream_key": "device"}, "substream_key", "set late_arrival_tolerance"),
        ({"late_arrival_tolerance": "-5m"}, "late_arrival_tolerance", "late_arrival_tolerance"),
    ],
)
def test_bad_policy_declarations_name_the_field_and_the_fix(extra, field, words):
    with pytest.raises(WindowConfigError) as info:
        WindowSpec.from_dict({"kind": "tumbling", "size": "1m", "time_field": "ts", **extra}, function="fn_a")
    assert info.value.field == field
    assert words in str(info.value)
    assert "\n" not in str(info.value)


def test_processing_time_windows_refuse_arrival_policies():
    with pytest.raises(WindowConfigError, match="only applies to event-time windows"):
        WindowSpec.from_dict(
            {"kind": "tumbling", "size": "1m", "boundary": "processing_time", "out_of_order_policy": "drop"}
        )


def test_a_spec_with_policies_round_trips_and_builds_the_seed_policy():
    spec = WindowSpec.from_dict(
        {
            "kind": "tumbling",
            "size": "1m",
            "time_field": "ts",
            "out_of_order_tolerance": "2m",
            "early_arrival_policy": "drop",
            "out_of_order_policy": "adjust",
            "late_arrival_tolerance": "5m",
            "substream_key": "device",
        }
    )
    assert spec.uses_arrival_policies
    assert WindowSpec.from_dict(spec.to_dict()) == spec
    policy = ArrivalPolicy.for_spec(spec)
    fates = [policy.observe(hm(e), hm(a), key=d) for e, a, d in TABLE]
    assert [f.watermark_ms for f in fates] == [hm(w) for *_, w in FIGURE_3]
    assert not WindowSpec.from_dict(
        {"kind": "tumbling", "size": "1m", "time_field": "ts"}
    ).uses_arrival_policies


def test_policy_state_resumes_exactly_midway_through_the_table():
    import json

    a = seed_policy(early_arrival="drop", substreams=True)
    first = [a.observe(hm(e), hm(x), key=d) for e, x, d in TABLE[:6]]
    b = seed_policy(early_arrival="drop", substreams=True).restore(json.loads(json.dumps(a.to_state())))
    rest_a = [a.observe(hm(e), hm(x), key=d) for e, x, d in TABLE[6:]]
    rest_b = [b.observe(hm(e), hm(x), key=d) for e, x, d in TABLE[6:]]
    assert rest_a == rest_b and len(first) == 6
    assert a.metrics() == b.metrics()
