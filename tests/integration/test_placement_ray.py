"""Packed placement on real Ray: five packed functions (capacity 4 a node) run their workers on two nodes,
a spread function runs where the node plan says, every ledger is complete, and every slot is freed."""

from __future__ import annotations

import pytest

from eventing.control.nodes import load_packed_placement
from eventing.control.service import EventingService
from eventing.storage.bucket import LocalBucket
from eventing.testing import check_ledger, deploy_function, ledger_definition, load_source
from metadata.factory import open_store

pytestmark = pytest.mark.integration

PACKED = [f"fn_p{i}" for i in range(1, 6)]


def test_packed_functions_fill_a_node_before_the_next_on_ray(data_dir, ray_executor):
    source = load_source(data_dir, 100, 600, seed=5)
    for name in PACKED:
        deploy_function(
            data_dir, ledger_definition(name, "src", f"ledger_{name}", workers=2, placement="packed")
        )
    deploy_function(data_dir, ledger_definition("fn_spread", "src", "ledger_spread", workers=2))
    seen: list[list[str]] = []

    def on_progress(_summary) -> None:
        placement = load_packed_placement(open_store(data_dir)).describe()
        if placement and (not seen or seen[-1] != placement):
            seen.append(placement)

    summary = EventingService(data_dir, ray_executor, until_caught_up=True, on_progress=on_progress).run()
    assert not summary.errors
    # All five started together: four on the first node, the fifth provisioned a second one.
    assert ["packed-1: fn_p1 fn_p2 fn_p3 fn_p4", "packed-2: fn_p5 - - -"] in seen
    store = open_store(data_dir)
    for i, name in enumerate(PACKED):
        node = "packed-1" if i < 4 else "packed-2"
        assert {cp.owner for cp in store.checkpoints(name).values()} == {f"{node}/w0", f"{node}/w1"}
        report = check_ledger(source, LocalBucket.open(data_dir, f"ledger_{name}"))
        assert report.ok, report.summary()
    assert {cp.owner.split("/")[0] for cp in store.checkpoints("fn_spread").values()} == {"local"}
    assert load_packed_placement(store).describe() == []  # every function caught up and stopped
