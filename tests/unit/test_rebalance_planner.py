"""The rebalance planner: balanced, minimal-move and deterministic at node level and at worker level."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharding import (
    NUM_VBUCKETS,
    DuplicateNodeError,
    FunctionAssignment,
    InvalidOwnershipError,
    InvalidWorkerCountError,
    Move,
    NoNodesError,
    RebalanceError,
    VBucketPlan,
    WorkerId,
    assign_function,
    assign_workers,
    format_ranges,
    function_moves,
    minimum_moves,
    minimum_worker_moves,
    plan_rebalance,
    worker_moves,
    worker_plan,
)

# ---------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------


def worker_counts(assignment: FunctionAssignment) -> dict[str, int]:
    return {str(worker): count for worker, count in assignment.counts().items()}


def is_balanced(sizes: Sequence[int]) -> bool:
    return max(sizes) - min(sizes) <= 1


def assert_balanced(sizes: Sequence[int]) -> None:
    assert is_balanced(sizes), sizes


def within_node_moves(before: FunctionAssignment, after: FunctionAssignment) -> int:
    """vBuckets that stay on their node but change worker."""
    return sum(
        1 for old, new in zip(before.owners, after.owners, strict=True) if old.node == new.node and old != new
    )


def minimum_within_node_moves(before: FunctionAssignment, after_nodes: VBucketPlan) -> int:
    total = 0
    for node in dict.fromkeys(after_nodes.owners):
        vbs = after_nodes.vbuckets_of(node)
        previous = {vb: before.owners[vb].index for vb in vbs if before.owners[vb].node == node}
        total += minimum_worker_moves(vbs, previous, before.worker_count)
    return total


def brute_force_minimum_moves(current: Sequence[str], nodes: Sequence[str]) -> int:
    """Try every assignment of every vBucket to every node; keep the balanced ones."""
    best = len(current)
    for candidate in itertools.product(nodes, repeat=len(current)):
        sizes = Counter(candidate)
        if not is_balanced([sizes.get(node, 0) for node in nodes]):
            continue
        best = min(best, sum(1 for a, b in zip(current, candidate, strict=True) if a != b))
    return best


def brute_force_minimum_worker_moves(
    vbuckets: Sequence[int], previous: Mapping[int, int], worker_count: int
) -> int:
    best = len(vbuckets)
    for candidate in itertools.product(range(worker_count), repeat=len(vbuckets)):
        sizes = Counter(candidate)
        if not is_balanced([sizes.get(w, 0) for w in range(worker_count)]):
            continue
        moved = sum(
            1 for vb, w in zip(vbuckets, candidate, strict=True) if vb in previous and previous[vb] != w
        )
        best = min(best, moved)
    return best


def best_stay_over_every_choice_of_larger_nodes(current: Sequence[str], nodes: Sequence[str]) -> int:
    """Most vBuckets that can stay, trying every choice of which nodes get the +1 extras."""
    base, extra = divmod(len(current), len(nodes))
    held = Counter(current)
    best = 0
    for larger in itertools.combinations(nodes, extra):
        stay = sum(min(held.get(node, 0), base + (1 if node in larger else 0)) for node in nodes)
        best = max(best, stay)
    return best


# ---------------------------------------------------------------------------------------------------------
# Example cases: 1 -> 2 -> 3 -> 2 nodes with a 4-worker and a 3-worker function
# ---------------------------------------------------------------------------------------------------------


def test_first_deployment_gives_the_contiguous_initial_layout() -> None:
    plan = plan_rebalance(None, ["n1", "n2", "n3"])
    assert plan.before is None
    assert plan.after == VBucketPlan.initial(["n1", "n2", "n3"])
    assert plan.moves == ()
    assert plan.counts_after() == {"n1": 342, "n2": 341, "n3": 341}
    assert plan_rebalance({}, ["n1", "n2", "n3"]) == plan
    assert minimum_moves(None, ["n1", "n2", "n3"]) == 0


def test_one_node_to_two_moves_half_and_halves_every_worker() -> None:
    start = plan_rebalance(None, ["n1"])
    email0 = assign_function(start.after, 4, nodes=start.nodes)
    score0 = assign_function(start.after, 3, nodes=start.nodes)
    assert worker_counts(email0) == {"n1/w0": 256, "n1/w1": 256, "n1/w2": 256, "n1/w3": 256}
    assert worker_counts(score0) == {"n1/w0": 342, "n1/w1": 341, "n1/w2": 341}

    plan = plan_rebalance(start.after, ["n1", "n2"])
    assert plan.counts_before() == {"n1": 1024, "n2": 0}
    assert plan.counts_after() == {"n1": 512, "n2": 512}
    assert plan.move_count == 512 == minimum_moves(start.after, ["n1", "n2"])
    assert plan.describe() == ["n1 -> n2: 512 vBuckets 512-1023"]
    assert plan.joined() == ["n2"] and plan.departed() == []

    email1 = assign_function(plan.after, 4, email0, nodes=plan.nodes)
    assert set(email1.counts().values()) == {128}
    assert len(email1.counts()) == 8
    score1 = assign_function(plan.after, 3, score0, nodes=plan.nodes)
    assert worker_counts(score1) == {
        "n1/w0": 171, "n1/w1": 171, "n1/w2": 170,
        "n2/w0": 171, "n2/w1": 171, "n2/w2": 170,
    }  # fmt: skip


def test_one_node_to_two_nodes_gives_the_same_layout_as_a_fresh_two_node_deployment() -> None:
    plan = plan_rebalance(VBucketPlan.initial(["n1"]), ["n1", "n2"])
    assert plan.after == VBucketPlan.initial(["n1", "n2"])


def test_two_nodes_to_three_moves_341_to_the_new_node() -> None:
    before = VBucketPlan.initial(["n1", "n2"])
    plan = plan_rebalance(before, ["n1", "n2", "n3"])
    assert plan.counts_after() == {"n1": 342, "n2": 341, "n3": 341}
    assert plan.move_count == 341 == minimum_moves(before, ["n1", "n2", "n3"])
    assert plan.describe() == ["n1 -> n3: 170 vBuckets 342-511", "n2 -> n3: 171 vBuckets 853-1023"]
    assert all(move.to_node == "n3" for move in plan.moves)


def test_three_nodes_back_to_two_moves_only_the_leaving_nodes_vbuckets() -> None:
    two = VBucketPlan.initial(["n1", "n2"])
    three = plan_rebalance(two, ["n1", "n2", "n3"]).after
    plan = plan_rebalance(three, ["n1", "n2"])
    assert plan.counts_after() == {"n1": 512, "n2": 512}
    assert plan.move_count == 341 == minimum_moves(three, ["n1", "n2"])
    assert {move.from_node for move in plan.moves} == {"n3"}
    assert plan.departed() == ["n3"]
    # Joining and leaving again restores the original contiguous halves.
    assert plan.after == two


def test_sequence_one_two_three_two_keeps_every_function_balanced_and_minimal() -> None:
    steps = [["n1"], ["n1", "n2"], ["n1", "n2", "n3"], ["n1", "n2"]]
    expected_nodes = [{"n1": 1024}, {"n1": 512, "n2": 512}, {"n1": 342, "n2": 341, "n3": 341}]
    expected_nodes.append({"n1": 512, "n2": 512})
    expected_workers = {
        4: [[256] * 4, [128] * 8, [86, 86, 85, 85] + [86, 85, 85, 85] * 2, [128] * 8],
        3: [[342, 341, 341], [171, 171, 170] * 2, [114, 114, 114] + [114, 114, 113] * 2, [171, 171, 170] * 2],
    }
    nodes_plan: VBucketPlan | None = None
    functions: dict[int, FunctionAssignment | None] = {4: None, 3: None}
    for i, nodes in enumerate(steps):
        plan = plan_rebalance(nodes_plan, nodes)
        assert plan.counts_after() == expected_nodes[i]
        assert plan.move_count == minimum_moves(nodes_plan, nodes)
        for workers, previous in functions.items():
            assignment = assign_function(plan.after, workers, previous, nodes=plan.nodes)
            assert sorted(assignment.counts().values(), reverse=True) == sorted(
                expected_workers[workers][i], reverse=True
            )
            if previous is not None:
                assert within_node_moves(previous, assignment) == minimum_within_node_moves(
                    previous, plan.after
                )
            functions[workers] = assignment
        nodes_plan = plan.after


def test_removing_the_first_node_spreads_its_vbuckets_over_the_others() -> None:
    three = VBucketPlan.initial(["n1", "n2", "n3"])
    plan = plan_rebalance(three, ["n2", "n3"])
    assert plan.counts_after() == {"n2": 512, "n3": 512}
    assert plan.move_count == 342 == minimum_moves(three, ["n2", "n3"])
    assert plan.describe() == ["n1 -> n2: 171 vBuckets 0-170", "n1 -> n3: 171 vBuckets 171-341"]


def test_swapping_a_node_moves_exactly_its_vbuckets() -> None:
    two = VBucketPlan.initial(["n1", "n2"])
    plan = plan_rebalance(two, ["n1", "n3"])
    assert plan.describe() == ["n2 -> n3: 512 vBuckets 512-1023"]


def test_extras_go_to_the_nodes_that_hold_the_most() -> None:
    # n2 holds 6 of 10; with 3 nodes the one extra (4/3/3) goes to n2, so 4 stay there instead of 3.
    current = {vb: ("n2" if vb < 6 else "n1") for vb in range(10)}
    plan = plan_rebalance(current, ["n1", "n2", "n3"])
    assert plan.counts_after() == {"n1": 3, "n2": 4, "n3": 3}
    assert plan.move_count == 3 == minimum_moves(current, ["n1", "n2", "n3"])


def test_ties_for_the_extra_are_broken_by_node_order() -> None:
    current = VBucketPlan(("a", "a", "b", "b"))
    assert plan_rebalance(current, ["a", "b", "c"]).counts_after() == {"a": 2, "b": 1, "c": 1}
    assert plan_rebalance(current, ["b", "a", "c"]).counts_after() == {"b": 2, "a": 1, "c": 1}


def test_an_already_balanced_plan_moves_nothing() -> None:
    three = VBucketPlan.initial(["n1", "n2", "n3"])
    plan = plan_rebalance(three, ["n1", "n2", "n3"])
    assert plan.moves == () and plan.after == three
    assert plan.describe() == ["no vBucket changes node"]


def test_moves_are_listed_by_vbucket_with_source_and_destination() -> None:
    plan = plan_rebalance(VBucketPlan.initial(["n1"], 4), ["n1", "n2"])
    assert plan.moves == (Move(2, "n1", "n2"), Move(3, "n1", "n2"))
    assert str(plan.moves[0]) == "vb 2: n1 -> n2"


def test_mapping_and_plan_inputs_give_the_same_plan() -> None:
    three = VBucketPlan.initial(["n1", "n2", "n3"])
    assert plan_rebalance(dict(enumerate(three.owners)), ["n1", "n4"]) == plan_rebalance(three, ["n1", "n4"])


def test_removing_the_last_node_is_refused_with_the_fix() -> None:
    one = VBucketPlan.initial(["n1"])
    message = "cannot remove node 'n1': it is the last eventing node; add another node first"
    with pytest.raises(NoNodesError, match=message):
        plan_rebalance(one, [])
    with pytest.raises(NoNodesError, match="last eventing node"):
        minimum_moves(one, [])


def test_removing_every_node_is_refused_naming_them() -> None:
    with pytest.raises(NoNodesError, match="cannot remove every eventing node \\('n1', 'n2'\\)"):
        plan_rebalance(VBucketPlan.initial(["n1", "n2"]), [])


def test_first_deployment_without_nodes_is_refused() -> None:
    with pytest.raises(NoNodesError, match="no eventing nodes given"):
        plan_rebalance(None, [])


def test_duplicate_node_names_are_refused() -> None:
    with pytest.raises(DuplicateNodeError, match="node 'n2' is listed more than once"):
        plan_rebalance(VBucketPlan.initial(["n1"]), ["n1", "n2", "n2"])


def test_planner_errors_are_value_errors() -> None:
    for error in (NoNodesError, DuplicateNodeError, InvalidOwnershipError, InvalidWorkerCountError):
        assert issubclass(error, RebalanceError)
    assert issubclass(RebalanceError, ValueError)


def test_a_bare_string_is_not_taken_as_a_node_list() -> None:
    with pytest.raises(RebalanceError, match="list of node names"):
        plan_rebalance(None, "n1")


def test_ownership_that_misses_vbuckets_is_refused() -> None:
    with pytest.raises(InvalidOwnershipError, match="misses vBuckets 2-3"):
        plan_rebalance({0: "n1", 1: "n1"}, ["n1", "n2"], num_vbuckets=4)
    with pytest.raises(InvalidOwnershipError, match="covers 4 vBuckets but the plan is for 1024"):
        plan_rebalance(VBucketPlan.initial(["n1"], 4), ["n1"], num_vbuckets=NUM_VBUCKETS)


def test_worker_split_without_history_is_the_contiguous_worker_plan() -> None:
    vbs = list(range(NUM_VBUCKETS))
    for workers in (1, 3, 4, 7):
        assignment = assign_workers(vbs, {}, workers)
        groups = [[vb for vb in vbs if assignment[vb] == w] for w in range(workers)]
        assert groups == worker_plan(vbs, workers)
    three = assign_workers(vbs, None, 3)
    assert Counter(three.values()) == {0: 342, 1: 341, 2: 341}


def test_shrinking_a_node_keeps_each_remaining_vbucket_on_its_worker_when_possible() -> None:
    previous = {vb: vb // 256 for vb in range(NUM_VBUCKETS)}
    remaining = range(512)
    assignment = assign_workers(remaining, previous, 4)
    assert Counter(assignment.values()) == {0: 128, 1: 128, 2: 128, 3: 128}
    assert worker_moves(previous, assignment) == 256 == minimum_worker_moves(remaining, previous, 4)
    assert format_ranges(vb for vb, w in assignment.items() if w == 0) == "0-127"


def test_fewer_workers_hand_the_removed_workers_vbuckets_to_the_rest() -> None:
    previous = {vb: vb // 256 for vb in range(NUM_VBUCKETS)}
    assignment = assign_workers(range(NUM_VBUCKETS), previous, 3)
    assert Counter(assignment.values()) == {0: 342, 1: 341, 2: 341}
    assert worker_moves(previous, assignment) == minimum_worker_moves(range(NUM_VBUCKETS), previous, 3)


def test_worker_count_below_one_is_refused() -> None:
    with pytest.raises(InvalidWorkerCountError, match="at least 1 worker"):
        assign_workers(range(4), {}, 0)
    with pytest.raises(InvalidWorkerCountError):
        assign_function(VBucketPlan.initial(["n1"]), 0)


def test_a_vbucket_listed_twice_for_one_node_is_refused() -> None:
    with pytest.raises(InvalidOwnershipError, match="vBucket 3 is listed twice"):
        assign_workers([1, 3, 3], {}, 2)


def test_function_assignment_names_workers_by_node_and_index() -> None:
    assignment = assign_function(VBucketPlan.initial(["n1", "n2"], 8), 2, nodes=["n1", "n2", "n3"])
    assert assignment.owners[0] == WorkerId("n1", 0)
    assert str(assignment.owners[7]) == "n2/w1"
    assert assignment.vbuckets_of(WorkerId("n1", 1)) == [2, 3]
    # A node in the list that owns nothing still shows its idle workers.
    assert assignment.counts()[WorkerId("n3", 0)] == 0
    assert assignment.node_plan() == VBucketPlan.initial(["n1", "n2"], 8)


def test_function_moves_list_every_handoff() -> None:
    before = assign_function(VBucketPlan.initial(["n1"], 8), 2)
    after = assign_function(VBucketPlan.initial(["n1", "n2"], 8), 2, before)
    moves = function_moves(before, after)
    # n1 keeps 0-3 (all on w0 before) and splits them 2/2: vb 2-3 go to w1; vb 4-7 go to n2.
    assert [m.vb for m in moves] == [2, 3, 4, 5, 6, 7]
    assert moves[0].from_worker == WorkerId("n1", 0) and moves[0].to_worker == WorkerId("n1", 1)
    assert moves[2].from_worker == WorkerId("n1", 1) and moves[2].to_worker == WorkerId("n2", 0)
    assert len(function_moves(None, after)) == 8


# ---------------------------------------------------------------------------------------------------------
# Properties over random sequences of joins and leaves
# ---------------------------------------------------------------------------------------------------------


@st.composite
def membership_changes(draw: st.DrawFn, max_steps: int = 6) -> list[list[str]]:
    """Node lists, one per step: each step keeps some nodes (maybe none of the old ones) and adds 0..2 new."""
    fresh = itertools.count(1)
    nodes = [f"n{next(fresh)}" for _ in range(draw(st.integers(1, 4)))]
    steps = [nodes]
    for _ in range(draw(st.integers(1, max_steps))):
        kept = [node for node in nodes if draw(st.booleans())]
        joined = [f"n{next(fresh)}" for _ in range(draw(st.integers(0 if kept else 1, 2)))]
        nodes = kept + joined
        if draw(st.booleans()):
            nodes = draw(st.permutations(nodes))
        steps.append(list(nodes))
    return steps


def check_sequence(num_vbuckets: int, steps: list[list[str]], worker_counts_per_fn: list[int]) -> None:
    current: VBucketPlan | None = None
    functions: list[FunctionAssignment | None] = [None] * len(worker_counts_per_fn)
    for nodes in steps:
        plan = plan_rebalance(current, nodes, num_vbuckets)

        # Every vBucket has exactly one owner, a node of the new list, and sizes are balanced.
        assert len(plan.after.owners) == num_vbuckets
        assert set(plan.after.owners) <= set(nodes)
        counts = plan.counts_after()
        assert list(counts) == nodes and sum(counts.values()) == num_vbuckets
        assert_balanced(list(counts.values()))

        # Moves are exactly the changed owners, and there are as few as possible.
        if current is None:
            assert plan.after == VBucketPlan.initial(nodes, num_vbuckets) and plan.moves == ()
        else:
            changed = [vb for vb in range(num_vbuckets) if current.owners[vb] != plan.after.owners[vb]]
            assert [m.vb for m in plan.moves] == changed
            assert all(m.from_node == current.owners[m.vb] for m in plan.moves)
            assert all(m.to_node == plan.after.owners[m.vb] for m in plan.moves)
            assert plan.move_count == minimum_moves(current, nodes)
            assert num_vbuckets - plan.move_count == best_stay_over_every_choice_of_larger_nodes(
                current.owners, nodes
            )

        # Same input, same plan.
        assert plan_rebalance(current, list(nodes), num_vbuckets) == plan

        for i, workers in enumerate(worker_counts_per_fn):
            previous = functions[i]
            assignment = assign_function(plan.after, workers, previous, nodes=nodes)
            assert assignment == assign_function(plan.after, workers, previous, nodes=nodes)
            assert [owner.node for owner in assignment.owners] == list(plan.after.owners)
            per_worker = assignment.counts()
            for node in nodes:
                assert_balanced([per_worker[WorkerId(node, w)] for w in range(workers)])
            if previous is not None:
                assert within_node_moves(previous, assignment) == minimum_within_node_moves(
                    previous, plan.after
                )
            functions[i] = assignment
        current = plan.after


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    num_vbuckets=st.sampled_from([1, 5, 16, 64]),
    steps=membership_changes(),
    worker_counts_per_fn=st.lists(st.integers(1, 6), min_size=1, max_size=2),
)
def test_rebalance_stays_balanced_and_minimal_over_joins_and_leaves(
    num_vbuckets: int, steps: list[list[str]], worker_counts_per_fn: list[int]
) -> None:
    check_sequence(num_vbuckets, steps, worker_counts_per_fn)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=membership_changes(max_steps=4), worker_counts_per_fn=st.just([4, 3]))
def test_rebalance_of_1024_vbuckets_stays_balanced_and_minimal(
    steps: list[list[str]], worker_counts_per_fn: list[int]
) -> None:
    check_sequence(NUM_VBUCKETS, steps, worker_counts_per_fn)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_rebalance_moves_the_fewest_vbuckets(data: st.DataObject) -> None:
    """Against every balanced assignment, from any current ownership, balanced or not."""
    num_vbuckets = data.draw(st.integers(1, 7), label="num_vbuckets")
    pool = ["a", "b", "c", "d"]
    current = data.draw(st.lists(st.sampled_from(pool), min_size=num_vbuckets, max_size=num_vbuckets))
    nodes = data.draw(st.lists(st.sampled_from([*pool, "e"]), min_size=1, max_size=3, unique=True))
    plan = plan_rebalance(VBucketPlan(tuple(current)), nodes)
    assert_balanced(list(plan.counts_after().values()))
    expected = brute_force_minimum_moves(current, nodes)
    assert plan.move_count == expected
    assert minimum_moves(VBucketPlan(tuple(current)), nodes) == expected


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_rebalance_from_an_unbalanced_ownership_of_64_vbuckets_is_minimal(data: st.DataObject) -> None:
    current = data.draw(st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), min_size=64, max_size=64))
    nodes = data.draw(st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f", "g"]), min_size=1, unique=True))
    plan = plan_rebalance(dict(enumerate(current)), nodes)
    assert_balanced(list(plan.counts_after().values()))
    assert 64 - plan.move_count == best_stay_over_every_choice_of_larger_nodes(current, nodes)
    assert plan.move_count == minimum_moves(dict(enumerate(current)), nodes)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_worker_split_moves_the_fewest_vbuckets(data: st.DataObject) -> None:
    vbuckets = sorted(data.draw(st.sets(st.integers(0, 15), min_size=1, max_size=7), label="vbuckets"))
    worker_count = data.draw(st.integers(1, 3), label="worker_count")
    # Previous workers may cover only some vBuckets, include ones that left, or name removed workers.
    previous = data.draw(
        st.dictionaries(st.integers(0, 15), st.integers(0, 4), max_size=10), label="previous"
    )
    assignment = assign_workers(vbuckets, previous, worker_count)
    assert sorted(assignment) == vbuckets
    assert set(assignment.values()) <= set(range(worker_count))
    assert_balanced([sum(1 for w in assignment.values() if w == i) for i in range(worker_count)])
    expected = brute_force_minimum_worker_moves(vbuckets, previous, worker_count)
    assert worker_moves(previous, assignment) == expected
    assert minimum_worker_moves(vbuckets, previous, worker_count) == expected
    assert assign_workers(list(reversed(vbuckets)), dict(previous), worker_count) == assignment


@settings(max_examples=50, deadline=None)
@given(
    nodes=st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), min_size=1, unique=True),
    size=st.integers(1, 64),
)
def test_first_deployment_is_the_initial_plan_for_any_nodes(nodes: list[str], size: int) -> None:
    assert plan_rebalance(None, nodes, size).after == VBucketPlan.initial(nodes, size)


@settings(max_examples=50, deadline=None)
@given(vbuckets=st.sets(st.integers(0, 1023), min_size=1, max_size=200), workers=st.integers(1, 8))
def test_worker_split_without_history_matches_worker_plan(vbuckets: set[int], workers: int) -> None:
    assignment = assign_workers(vbuckets, {}, workers)
    groups = [sorted(vb for vb, w in assignment.items() if w == i) for i in range(workers)]
    assert groups == worker_plan(sorted(vbuckets), workers)


def test_spreading_the_given_up_vbuckets_keeps_worker_handoffs_at_the_node_moves():
    from sharding import VBucketPlan
    from sharding.rebalance import assign_function, function_moves, plan_rebalance

    one = VBucketPlan.initial(["n1"])
    before = assign_function(one, 4)
    spread = {vb: str(worker) for vb, worker in enumerate(before.owners)}
    plan = plan_rebalance(one, ["n1", "n2"], spread=spread)
    assert plan.move_count == 512 and plan.counts_after() == {"n1": 512, "n2": 512}
    after = assign_function(plan.after, 4, before, nodes=["n1", "n2"])
    assert len(function_moves(before, after)) == 512  # without spread: 768 (256 more inside n1)
    assert set(after.counts().values()) == {128}


@settings(max_examples=60, deadline=None)
@given(
    groups=st.integers(min_value=1, max_value=7),
    steps=st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=4),
)
def test_spread_never_changes_how_many_vbuckets_move(groups, steps):
    from sharding.rebalance import minimum_moves, plan_rebalance

    current = None
    for count in steps:
        nodes = [f"n{i}" for i in range(count)]
        spread = {vb: vb % groups for vb in range(64)}
        plan = plan_rebalance(current, nodes, 64, spread=spread)
        if current is not None:
            assert plan.move_count == minimum_moves(current, nodes, 64)
        assert max(plan.counts_after().values()) - min(plan.counts_after().values()) <= 1
        current = plan.after
