"""Lifecycle property test on Ray: the steps of tests/unit/test_lifecycle_property.py against an `eventing
run` service subprocess, plus kill -9 of a worker process and of the service, checked after every step
against the model of eventing.testing.lifecycle_model (effects exactly once per deployment, nothing skipped,
failures kept as dead letters and handled after a fix and a replay or a fresh deployment)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventing.testing.lifecycle_model import FINALE, HANDLERS, KEYS, ServiceDriver

pytestmark = pytest.mark.integration

KNOWN: frozenset[str] = frozenset()  # see tests/unit/test_lifecycle_property.py
KIND = st.sampled_from(["plain", "plain", "plain", "bad", "delete"])  # no hangs: each costs a second
LOAD = st.tuples(
    st.just("load"), st.lists(st.tuples(st.integers(0, len(KEYS) - 1), KIND), min_size=1, max_size=4)
)
STEP = st.one_of(
    LOAD,
    st.tuples(st.just("deploy"), st.sampled_from(["everything", "from_now"])),
    st.just(("pause",)),
    st.just(("resume",)),
    st.just(("undeploy",)),
    st.tuples(st.just("edit"), st.sampled_from(sorted(set(HANDLERS) - {"hang"})), st.just({})),
    st.tuples(st.just("rewind"), st.integers(0, 2)),
    st.just(("replay",)),
    st.just(("kill_worker",)),
    st.just(("kill_service",)),
)

# Every kind of step at least once, both kills while the function is deployed with work to do.
FIXED = [
    ("load", [(0, "plain"), (1, "bad"), (2, "plain")]),
    ("edit", "bad", {}),
    ("deploy", "everything"),
    ("load", [(3, "plain"), (0, "plain")]),
    ("kill_worker",),
    ("load", [(4, "plain"), (1, "delete"), (5, "bad")]),
    ("kill_service",),
    ("load", [(2, "plain")]),
    ("pause",),
    ("edit", "fixed", {"worker_count": 3}),
    ("rewind", 0),
    ("replay",),
    ("resume",),
    ("load", [(0, "plain")]),
    ("undeploy",),
    ("deploy", "from_now"),
    ("load", [(1, "bad"), (3, "delete")]),
    ("kill_worker",),
]


def check_sequence(ray_session, steps) -> ServiceDriver:
    address = ray_session.get_runtime_context().gcs_address
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = str(Path(tmp) / "data")
        driver = ServiceDriver(data_dir, address, known=KNOWN)
        try:
            for step in [*steps, *FINALE]:
                driver.apply(step)
                problems = driver.check()
                assert not problems, f"after {driver.describe()}: " + "; ".join(map(str, problems[:5]))
        finally:
            driver.close()
    return driver


def test_a_fixed_lifecycle_with_kills(ray_session):
    driver = check_sequence(ray_session, FIXED)
    assert driver.kills == {"worker": 2, "service": 1}


@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(st.lists(STEP, min_size=4, max_size=10))
def test_random_lifecycles_with_kills(ray_session, steps):
    check_sequence(ray_session, steps)
