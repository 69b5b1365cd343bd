"""Lifecycle property test (in-process executor): random sequences of loads, deploys (everything /
from_now), pauses, handler and setting edits, resumes, undeploys, rewinds, dead-letter replays, runs,
backups and restores, checked after every step against the plain model of eventing.testing.lifecycle_model:
each mutation handled by the deployment that owes it, effects exactly once, per-document order, failures
kept as dead letters, and everything handled after a fixed handler and a replay or a fresh deployment.
The long variant (marker `soak`) runs from scripts/soak.sh."""

from __future__ import annotations

import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventing.testing.lifecycle_model import HANDLERS, KEYS, run_steps

# Open issues the random sequences step over so they keep checking everything else (none today); each
# would have a kept example below, marked xfail(strict=True), that fails on it.
KNOWN: frozenset[str] = frozenset()

# One hang in ~40 loaded mutations: each one the `hang` handler meets costs execution_timeout (1 s).
KIND = st.integers(0, 39).map(
    lambda n: "hang" if n == 0 else ("bad" if n < 9 else ("delete" if n < 17 else "plain"))
)
LOAD = st.tuples(
    st.just("load"), st.lists(st.tuples(st.integers(0, len(KEYS) - 1), KIND), min_size=1, max_size=4)
)
SETTINGS = st.fixed_dictionaries(
    {},
    optional={
        "worker_count": st.integers(1, 3),
        "batch_size": st.sampled_from([1, 100]),
        "retries": st.integers(0, 1),
    },
)
STEP = st.one_of(
    LOAD,
    LOAD,
    st.tuples(st.just("deploy"), st.sampled_from(["everything", "from_now"])),
    st.just(("pause",)),
    st.just(("resume",)),
    st.just(("undeploy",)),
    st.tuples(st.just("edit"), st.sampled_from(sorted(HANDLERS)), SETTINGS),
    st.just(("run",)),
    st.just(("run",)),
    st.tuples(st.just("rewind"), st.integers(0, 3)),
    st.just(("replay",)),
    st.just(("backup",)),
    st.just(("restore",)),
)
STEPS = st.lists(STEP, min_size=1, max_size=20)


def check_sequence(steps: list[tuple], *, known: frozenset[str] = KNOWN, finale: bool = True) -> None:
    with tempfile.TemporaryDirectory() as data_dir:
        run_steps(data_dir, steps, known=known, finale=finale)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(STEPS)
def test_random_lifecycles_handle_every_mutation_once(steps):
    check_sequence(steps)


@pytest.mark.soak
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(STEP, min_size=1, max_size=40))
def test_random_lifecycles_long(steps):
    check_sequence(steps)


# Sequences kept as regression examples (each once failed on the code before a fix).
TIMED_OUT_THEN_FRESH_DEPLOYMENT = [
    # A mutation timed out under one deployment; undeploy, fix the handler, deploy from everything: the new
    # deployment must handle it (it was skipped because of the old deployment's `timeout` dead letter).
    ("load", [(0, "plain"), (1, "hang"), (2, "bad")]),
    ("edit", "hang", {}),
    ("deploy", "everything"),
    ("run",),
    ("undeploy",),
    ("edit", "fixed", {}),
    ("deploy", "everything"),
    ("run",),
]


STALE_LETTER_REPLAYED = [
    # Deployment 1 dead-letters doc0 (its handler raises); undeploy, fix the handler, deploy from everything:
    # deployment 2 handles doc0, but deployment 1's letter stays pending, and replaying it applies doc0's
    # effect a second time under deployment 2.
    ("load", [(0, "bad")]),
    ("edit", "bad", {}),
    ("deploy", "everything"),
    ("run",),
    ("undeploy",),
    ("edit", "fixed", {}),
    ("deploy", "everything"),
    ("run",),
    ("pause",),
    ("replay",),
]


REPLAYED_THEN_REWOUND = [
    # doc5 is dead-lettered; pause, fix the handler, replay the letter (doc5's effect applied), rewind to 0
    # and resume: the stream handles doc5 again and applies its effect a second time (rewind-then-replay too).
    ("load", [(5, "bad")]),
    ("edit", "bad", {}),
    ("deploy", "everything"),
    ("run",),
    ("pause",),
    ("edit", "fixed", {}),
    ("replay",),
    ("rewind", 0),
    ("resume",),
    ("run",),
]


def test_kept_example_replayed_then_rewound():
    check_sequence(REPLAYED_THEN_REWOUND, known=frozenset(), finale=False)


def test_kept_example_timed_out_then_fresh_deployment():
    check_sequence(TIMED_OUT_THEN_FRESH_DEPLOYMENT)


def test_kept_example_stale_letter_replayed():
    check_sequence(STALE_LETTER_REPLAYED, known=frozenset(), finale=False)
