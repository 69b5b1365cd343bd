"""Delivery modes (Dataflow, seed 002): at_least_once skips the effect marks and still loses nothing;
after a crash it applies the replayed mutations' effects again, where exactly_once skips them."""

from __future__ import annotations

import pytest

from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.errors import ConfigError
from eventing.storage.bucket import LocalBucket
from eventing.testing import check_ledger, deploy_function, ledger_definition, load_source
from eventing.workers.executor import InProcessExecutor
from eventing.workers.worker import WorkerCore, WorkerSpec
from metadata.factory import open_store
from sharding import NUM_VBUCKETS

COUNTER = """
def on_update(doc, meta):
    dst["count"] = {"n": dst.get("count", {"n": 0})["n"] + 1}

def on_delete(meta, options):
    dst["count"] = {"n": dst.get("count", {"n": 0})["n"] + 1}
"""


def test_delivery_defaults_to_exactly_once_and_refuses_unknown_modes():
    base = {"name": "fn", "source_bucket": "src"}
    assert FunctionDefinition.from_dict(base).delivery == "exactly_once"
    assert FunctionDefinition.from_dict({**base, "delivery": "at_least_once"}).delivery == "at_least_once"
    with pytest.raises(
        ConfigError,
        match="delivery of function 'fn' is 'at_most_once'; use one of 'exactly_once', 'at_least_once'",
    ):
        FunctionDefinition.from_dict({**base, "delivery": "at_most_once"})


@pytest.mark.parametrize("delivery", ["exactly_once", "at_least_once"])
def test_every_mutation_has_its_effect_in_both_modes(data_dir, delivery):
    source = load_source(data_dir, 300, 3000)
    deploy_function(data_dir, ledger_definition("fn_d", "src", "ledger", workers=3, delivery=delivery))
    EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    ledger = LocalBucket.open(data_dir, "ledger")
    report = check_ledger(source, ledger)
    assert report.ok, report.summary()
    assert report.handled == 3000
    marks = ledger.effect_marks("fn_d")
    # Deploy fences every vBucket once (seqno 0); exactly_once then moves each mark with its effects,
    # at_least_once never reads, fences or moves them: the per-flush cost it saves.
    moved = {vb for vb, (_, seqno) in marks.items() if seqno > 0}
    with_data = {vb for vb, high in enumerate(source.high_seqnos()) if high}
    assert moved == (set() if delivery == "at_least_once" else with_data)
    counters = open_store(data_dir).counters("fn_d")
    # Two writes a mutation (the ledger's effect and history entries), none skipped without a crash.
    assert counters["effects_applied"] == 6000 and counters.get("effects_duplicate", 0) == 0


@pytest.mark.parametrize(("delivery", "replayed_again"), [("exactly_once", False), ("at_least_once", True)])
def test_a_crash_replays_effects_only_at_least_once(data_dir, delivery, replayed_again):
    load_source(data_dir, 200, 2000)
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_n",
            "source_bucket": "src",
            "bindings": [{"alias": "dst", "bucket": "counts", "access": "rw"}],
            "batch_size": 100,
            "delivery": delivery,
        }
    )
    deploy_function(data_dir, defn, COUNTER)
    generation = open_store(data_dir).get_function("fn_n").generation
    spec = WorkerSpec(data_dir, "fn_n", generation, "local/w0", tuple(range(NUM_VBUCKETS)))
    first = WorkerCore(spec)
    first.step(300)
    first.commit()
    assert first.step(300).handled == 300
    first.flush_effects()  # effects durable, checkpoint not yet: then the worker dies
    del first
    second = WorkerCore(spec)
    while not second.step(500).caught_up:
        pass
    second.stop()
    count = LocalBucket.open(data_dir, "counts").get("count")["n"]
    # Nothing is lost in either mode; at_least_once applied the 300 replayed mutations' effects again.
    assert count == (2300 if replayed_again else 2000)
