"""Durable timers on real Ray workers: every timer fires exactly once (ledger) while workers are killed
with SIGKILL during the firing span (a smaller run of scripts/bench_timers.py)."""

from __future__ import annotations

import pytest

from eventing.testing import timer_bench

pytestmark = pytest.mark.integration


def test_timers_fire_once_each_while_workers_are_killed(data_dir, ray_executor):
    timer_bench.prepare(data_dir)
    result = timer_bench.run(
        data_dir, ray_executor, 3000, span_s=8.0, lead_s=8.0, workers=3, kills=2, timeout_s=120
    )
    assert result.kills == 2
    assert (result.missing, result.fired_twice) == (0, 0), result.to_dict()
    assert result.counters["backlog"] == {"pending": 0, "due": 0}
    assert result.delay_p50_s >= 0  # at or after the due time
