"""Packed placement (Atlas, seed 000): the pure planner step by step on the seed's example, its rules, the
definition field, and the in-process service placing a packed function's workers on its one node."""

from __future__ import annotations

import json

import pytest

from eventing.control.nodes import load_packed_placement
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.errors import ConfigError
from eventing.storage.bucket import LocalBucket
from eventing.testing import check_ledger, deploy_function, ledger_definition, load_source
from eventing.workers.executor import InProcessExecutor
from metadata.factory import open_store
from scripts import simulate_placement
from sharding.placement import PackedPlacement, PlacementError

# The seed's example, one row per step: (action, function, node it lands on / leaves, slot, provisioned,
# released, every node's slots afterwards).
SEED_STEPS = [
    *[
        ("start", f"proc{i:02d}", "packed-1", i - 1, "packed-1" if i == 1 else None, None)
        for i in range(1, 5)
    ],
    *[
        ("start", f"proc{i:02d}", "packed-2", i - 5, "packed-2" if i == 5 else None, None)
        for i in range(5, 9)
    ],
    # "proc09 starts: Atlas provisions a third worker to host it."
    ("start", "proc09", "packed-3", 0, "packed-3", None),
    # "Later proc03 stops on the first worker."
    ("stop", "proc03", "packed-1", 2, None, None),
    # "If proc09 is stopped and restarted, it is reassigned to the first worker and the third is released."
    ("stop", "proc09", "packed-3", 0, None, "packed-3"),
    ("start", "proc09", "packed-1", 2, None, None),
]
SEED_END = ["packed-1: proc01 proc02 proc09 proc04", "packed-2: proc05 proc06 proc07 proc08"]


def test_the_seed_example_step_by_step():
    placement = PackedPlacement()
    for action, fn, node, slot, provisioned, released in SEED_STEPS:
        placement, step = placement.start(fn) if action == "start" else placement.stop(fn)
        assert (step.action, step.function, step.node, step.slot, step.provisioned, step.released) == (
            action,
            fn,
            node,
            slot,
            provisioned,
            released,
        ), step.describe()
    assert placement.describe() == SEED_END


def test_the_seed_branch_proc10_takes_the_slot_proc03_left():
    placement = PackedPlacement()
    for i in range(1, 10):
        placement, _ = placement.start(f"proc{i:02d}")
    placement, _ = placement.stop("proc03")
    placement, step = placement.start("proc10")
    assert (step.node, step.slot, step.provisioned) == ("packed-1", 2, None)
    assert placement.describe() == [
        "packed-1: proc01 proc02 proc10 proc04",
        "packed-2: proc05 proc06 proc07 proc08",
        "packed-3: proc09 - - -",
    ]


def test_the_simulation_prints_the_seed_example(capsys):
    assert simulate_placement.main(["--json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    last = runs["seed example"][-1]
    assert [n["slots"] for n in last["nodes"]] == [
        ["proc01", "proc02", "proc09", "proc04"],
        ["proc05", "proc06", "proc07", "proc08"],
    ]
    assert simulate_placement.main(["--steps", "+a,nonsense"]) == 2


def test_a_node_never_hosts_more_than_its_capacity_and_new_nodes_get_fresh_names():
    placement = PackedPlacement(capacity=2)
    for fn in "abcde":
        placement, _ = placement.start(fn)
    assert placement.describe() == ["packed-1: a b", "packed-2: c d", "packed-3: e -"]
    placement, step = placement.stop("e")
    assert step.released == "packed-3"
    placement, step = placement.start("f")
    assert step.provisioned == "packed-4"  # a released node's name is not reused


def test_starting_a_running_function_or_stopping_an_unknown_one_is_an_error():
    placement, _ = PackedPlacement().start("a")
    with pytest.raises(PlacementError, match="already running on node packed-1; stop it first"):
        placement.start("a")
    with pytest.raises(PlacementError, match="'b' is not running"):
        placement.stop("b")


def test_placement_state_round_trips():
    placement = PackedPlacement()
    for fn in ("a", "b", "c", "d", "e"):
        placement, _ = placement.start(fn)
    placement, _ = placement.stop("b")
    assert PackedPlacement.from_dict(json.loads(json.dumps(placement.to_dict()))) == placement


def test_the_definition_takes_placement_and_refuses_unknown_names():
    base = {"name": "fn", "source_bucket": "src"}
    assert FunctionDefinition.from_dict(base).placement == "spread"
    assert FunctionDefinition.from_dict({**base, "placement": "packed"}).placement == "packed"
    with pytest.raises(
        ConfigError, match="placement of function 'fn' is 'dense'; use one of 'spread', 'packed'"
    ):
        FunctionDefinition.from_dict({**base, "placement": "dense"})


def test_the_service_runs_a_packed_function_on_one_node_and_frees_its_slot(data_dir):
    source = load_source(data_dir, 100, 1000)
    deploy_function(data_dir, ledger_definition("fn_p", "src", "ledger", workers=3, placement="packed"))
    deploy_function(data_dir, ledger_definition("fn_s", "src", "ledger2", workers=2))
    seen: dict[str, object] = {}

    def on_progress(_summary) -> None:
        if "placement" not in seen and service.supervisors.get("fn_p") is not None:
            seen["placement"] = load_packed_placement(open_store(data_dir)).describe()

    service = EventingService(data_dir, InProcessExecutor(), until_caught_up=True, on_progress=on_progress)
    service.run()
    assert seen["placement"] == ["packed-1: fn_p - - -"]  # fn_s (spread) takes no slot
    store = open_store(data_dir)
    owners = {cp.owner for cp in store.checkpoints("fn_p").values()}
    assert owners == {"packed-1/w0", "packed-1/w1", "packed-1/w2"}  # every worker on its one node
    assert {cp.owner.split("/")[0] for cp in store.checkpoints("fn_s").values()} == {"local"}
    assert load_packed_placement(store).describe() == []  # caught up and stopped: slot freed, node released
    report = check_ledger(source, LocalBucket.open(data_dir, "ledger"))
    assert report.ok, report.summary()
