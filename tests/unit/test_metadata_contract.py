"""One contract for every metadata backend: lifecycle, functions, ownership epochs and fencing,
checkpoints, dead letters, counters, services, nodes and settings.

Backends:
- sqlite: SqliteMetadataStore on a file (always);
- postgresql: PostgresMetadataStore in a fresh schema on a throwaway server (always: the tests start
  PostgreSQL themselves, tests/conftest.py's pg_server);
- couchbase-logic: CouchbaseMetadataStore's logic over in-memory documents that follow Couchbase's CAS
  rules (always; everything but the SDK calls themselves);
- couchbase: CouchbaseMetadataStore on a live cluster, when $EVENTING_TEST_COUCHBASE_URL is set
  (`couchbase://host/bucket?username=..&password=..`; each test writes under its own key prefix and
  removes its documents afterwards).
Plus the Couchbase failure path, which needs no server: no answer, bad URLs, the factory's choice.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from metadata import (
    TIMER_VB_BASE,
    TRANSITIONS,
    USERS_MARK,
    ConfigError,
    CouchbaseMetadataStore,
    DlqRow,
    FencedError,
    FunctionState,
    LifecycleError,
    NotFoundError,
    OrderViolationError,
    SqliteMetadataStore,
    StoreError,
    TimerChange,
    TimerDone,
    open_store,
    parse_metadata_url,
)
from sharding import vbucket_of

LIVE_URL_ENV = "EVENTING_TEST_COUCHBASE_URL"


# -- documents in memory, with Couchbase's CAS rules -----------------------------------------------------


class MemoryDocuments:
    """A bucket in memory: JSON values, a fresh CAS per write, insert/replace/remove semantics and expiry.

    `before_write(key)` runs before every CAS-checked replace or remove (outside the lock), so a test can
    slip a competing write between a writer's read and its write.
    """

    where = "memory bucket 'test'"

    def __init__(self) -> None:
        self._data: dict[str, tuple[str, int, float | None]] = {}
        self._cas = itertools.count(1)
        self._lock = threading.Lock()
        self.before_write: Callable[[str], None] | None = None
        self.lost_races = 0

    def _live(self, key: str) -> tuple[str, int, float | None] | None:
        item = self._data.get(key)
        if item is not None and item[2] is not None and item[2] <= time.time():
            del self._data[key]
            return None
        return item

    def _hook(self, key: str) -> None:
        if self.before_write is not None:
            self.before_write(key)

    def get(self, key: str) -> tuple[dict, int] | None:
        with self._lock:
            item = self._live(key)
            return None if item is None else (json.loads(item[0]), item[1])

    def get_many(self, keys: Sequence[str]) -> dict[str, tuple[dict, int]]:
        return {k: got for k in keys if (got := self.get(k)) is not None}

    def insert(self, key: str, value: dict, *, expiry_s: float | None = None) -> bool:
        with self._lock:
            if self._live(key) is not None:
                return False
            self._data[key] = (
                json.dumps(value),
                next(self._cas),
                None if expiry_s is None else time.time() + expiry_s,
            )
            return True

    def replace(self, key: str, value: dict, cas: int) -> bool:
        self._hook(key)
        with self._lock:
            item = self._live(key)
            if item is None or item[1] != cas:
                self.lost_races += 1
                return False
            self._data[key] = (
                json.dumps(value),
                next(self._cas),
                None,
            )  # replace clears expiry, as in Couchbase
            return True

    def replace_many(self, items: Mapping[str, tuple[dict, int]]) -> set[str]:
        return {k for k, (v, cas) in items.items() if not self.replace(k, v, cas)}

    def upsert(self, key: str, value: dict, *, expiry_s: float | None = None) -> None:
        with self._lock:
            self._data[key] = (
                json.dumps(value),
                next(self._cas),
                None if expiry_s is None else time.time() + expiry_s,
            )

    def upsert_many(self, items: Mapping[str, dict]) -> None:
        for k, v in items.items():
            self.upsert(k, v)

    def remove(self, key: str, cas: int | None = None) -> bool:
        self._hook(key)
        with self._lock:
            item = self._live(key)
            if item is None or cas is not None and item[1] != cas:
                return False
            del self._data[key]
            return True

    def remove_many(self, keys: Sequence[str]) -> None:
        for k in keys:
            self.remove(k)

    def close(self) -> None:
        pass

    def keys(self) -> list[str]:
        return sorted(self._data)


class RecordingDocuments:
    """Wraps live documents and remembers every key written, so a test can remove what it wrote."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.where = inner.where
        self.written: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name in ("insert", "replace", "upsert"):
            return lambda key, *a, **kw: (self.written.add(key), attr(key, *a, **kw))[1]
        if name in ("replace_many", "upsert_many"):
            return lambda items, *a, **kw: (self.written.update(items), attr(items, *a, **kw))[1]
        return attr


# -- backends -----------------------------------------------------------------------------------------


class Backend:
    """Opens stores on one shared metadata location; two stores act like two processes."""

    def __init__(self, opener: Callable[[], Any], cleanup: Callable[[], None] = lambda: None):
        self._opener = opener
        self._cleanup = cleanup
        self._open: list[Any] = []

    def open(self) -> Any:
        store = self._opener()
        self._open.append(store)
        return store

    def close(self) -> None:
        self._cleanup()
        for store in self._open:
            store.close()


def _live_backend() -> Backend:
    url = os.environ.get(LIVE_URL_ENV)
    if not url:
        pytest.skip(
            f"no Couchbase cluster configured: set {LIVE_URL_ENV}=couchbase://host/bucket?username=..&password=.."
        )
    target = parse_metadata_url(url)
    prefix = f"contract-{uuid.uuid4().hex[:12]}"
    recorders: list[RecordingDocuments] = []

    def opener() -> CouchbaseMetadataStore:
        store = CouchbaseMetadataStore(
            target.connection_string,
            target.bucket,
            target.username,
            target.password,
            target.timeout_s,
            prefix=prefix,
        )
        recorder = RecordingDocuments(store._docs)
        recorders.append(recorder)
        store._docs = recorder  # type: ignore[assignment]
        return store

    def cleanup() -> None:
        if recorders:
            recorders[0].inner.remove_many(sorted(set().union(*(r.written for r in recorders))))

    return Backend(opener, cleanup)


def _postgres_backend(url: str) -> Backend:
    from metadata.postgres import PostgresMetadataStore

    return Backend(lambda: PostgresMetadataStore(url))


@pytest.fixture(params=["sqlite", "couchbase-logic", "couchbase", "postgresql"])
def backend(request, tmp_path):
    if request.param == "sqlite":
        b = Backend(lambda: SqliteMetadataStore(tmp_path / "metadata.sqlite3"))
    elif request.param == "postgresql":
        b = _postgres_backend(request.getfixturevalue("pg_schema_url"))
    elif request.param == "couchbase-logic":
        docs = MemoryDocuments()
        b = Backend(lambda: CouchbaseMetadataStore.on_documents(docs))
    else:
        b = _live_backend()
    yield b
    b.close()


@pytest.fixture
def store(backend):
    return backend.open()


def _dlq(vb: int, seqno: int, *, key: str = "k", reason: str = "error", error: str = "boom") -> DlqRow:
    return DlqRow("fn", vb, seqno, key, reason, error, "tb", 1, 1.0, 1.0, b"\x93\x00mutation")


def _path_to(target: FunctionState) -> list[FunctionState]:
    """The shortest legal path from undeployed to `target` (breadth-first over the transition table)."""
    paths = {FunctionState.UNDEPLOYED: [FunctionState.UNDEPLOYED]}
    queue = collections.deque([FunctionState.UNDEPLOYED])
    while queue:
        state = queue.popleft()
        for nxt in sorted(TRANSITIONS[state]):
            if nxt not in paths:
                paths[nxt] = [*paths[state], nxt]
                queue.append(nxt)
    return paths[target]


def _put_in_state(store, name: str, state: FunctionState) -> None:
    store.put_function(name, {"name": name}, "src")
    for nxt in _path_to(state)[1:]:
        store.transition(name, nxt, "move")


# -- functions and lifecycle ------------------------------------------------------------------------------


@pytest.mark.parametrize("current", list(FunctionState))
@pytest.mark.parametrize("target", list(FunctionState))
def test_only_transitions_in_the_table_are_allowed(store, current, target):
    _put_in_state(store, "fn", current)
    if target in TRANSITIONS[current]:
        assert store.transition("fn", target, "move").state is target
        assert store.get_function("fn").state is target
    else:
        with pytest.raises(LifecycleError, match=f"cannot move function 'fn': it is {current.value}"):
            store.transition("fn", target, "move")
        assert store.get_function("fn").state is current


def test_deploying_a_deployed_function_names_the_fix(store):
    _put_in_state(store, "fn", FunctionState.DEPLOYED)
    with pytest.raises(LifecycleError, match="it is deployed; undeploy it first"):
        store.transition("fn", FunctionState.DEPLOYING, "deploy")


def test_a_transition_can_bump_the_generation(store):
    store.put_function("fn", {}, "")
    assert store.transition("fn", FunctionState.DEPLOYING, "deploy", bump_generation=True).generation == 1
    assert store.transition("fn", FunctionState.DEPLOYED, "deploy").generation == 1
    assert store.get_function("fn").generation == 1


def test_functions_are_stored_listed_by_name_and_deleted(store):
    created = store.put_function(
        "fn_b", {"name": "fn_b", "workers": 3, "nested": {"a": [1, 2]}}, "def on_update(): pass"
    )
    store.put_function("fn_a", {"name": "fn_a"}, "src a")
    assert (created.state, created.generation, created.source) == (
        FunctionState.UNDEPLOYED,
        0,
        "def on_update(): pass",
    )
    got = store.get_function("fn_b")
    assert got.definition == {"name": "fn_b", "workers": 3, "nested": {"a": [1, 2]}}
    assert got.updated_at == pytest.approx(time.time(), abs=60)
    assert [f.name for f in store.list_functions()] == ["fn_a", "fn_b"]
    store.delete_function("fn_b")
    assert [f.name for f in store.list_functions()] == ["fn_a"]
    with pytest.raises(NotFoundError, match="unknown function 'fn_b' \\(known: fn_a\\)"):
        store.get_function("fn_b")


def test_unknown_functions_raise_not_found(store):
    with pytest.raises(NotFoundError, match="known: none"):
        store.get_function("fn")
    with pytest.raises(NotFoundError, match="unknown function 'fn'"):
        store.transition("fn", FunctionState.DEPLOYING, "deploy")
    with pytest.raises(NotFoundError, match="unknown function 'fn'"):
        store.delete_function("fn")
    store.put_function("fn_a", {}, "")
    with pytest.raises(NotFoundError, match="known: fn_a"):
        store.get_function("fn_b")


@pytest.mark.parametrize("state", [FunctionState.UNDEPLOYED, FunctionState.PAUSED])
def test_an_undeployed_or_paused_function_can_be_updated(store, state):
    _put_in_state(store, "fn", state)
    updated = store.put_function("fn", {"v": 2}, "new source")
    assert (updated.state, updated.definition, updated.source) == (state, {"v": 2}, "new source")


@pytest.mark.parametrize("state", [FunctionState.DEPLOYING, FunctionState.DEPLOYED, FunctionState.PAUSING])
def test_a_running_function_cannot_be_updated(store, state):
    _put_in_state(store, "fn", state)
    with pytest.raises(LifecycleError, match="pause or undeploy it first"):
        store.put_function("fn", {"v": 2}, "new")
    assert store.get_function("fn").source == "src"


def test_only_an_undeployed_function_can_be_deleted_and_it_takes_its_state_along(store):
    _put_in_state(store, "fn", FunctionState.DEPLOYED)
    store.init_checkpoints("fn", {0: 0, 1: 0}, "uuid")
    e = store.claim("fn", [0, 1], "n/w0")
    store.commit("fn", {0: e[0].epoch, 1: e[1].epoch}, {0: 4}, [_dlq(0, 2)], {"success": 3})
    with pytest.raises(LifecycleError, match="it is deployed; undeploy it first"):
        store.delete_function("fn")
    store.transition("fn", FunctionState.UNDEPLOYING, "undeploy")
    store.transition("fn", FunctionState.UNDEPLOYED, "undeploy")
    store.delete_function("fn")
    assert store.list_functions() == []
    assert store.checkpoints("fn") == {}
    assert store.counters("fn") == {}
    assert store.dlq_rows("fn", include_replayed=True) == []


def test_one_name_in_two_namespaces_is_two_functions_with_their_own_state(store):
    # A function's namespace is part of its name (eventing.core.function_names): `audit` is the global one,
    # `shop._default.audit` and `shop.sales.audit` are others; none shares another's state.
    names = ["audit", "shop._default.audit", "shop.sales.audit"]
    _put_in_state(store, "shop._default.audit", FunctionState.DEPLOYED)
    for i, name in enumerate(names):
        if name != "shop._default.audit":
            store.put_function(name, {"name": name, "n": i}, f"src {i}")
    store.init_checkpoints("shop._default.audit", {0: 0}, "uuid")
    e = store.claim("shop._default.audit", [0], "n/w0")
    store.commit("shop._default.audit", {0: e[0].epoch}, {0: 7}, [], {"success": 2})
    assert sorted(f.name for f in store.list_functions()) == names
    assert [store.get_function(n).definition.get("n") for n in names] == [0, None, 2]
    assert store.get_function("audit").state is FunctionState.UNDEPLOYED
    assert (store.counters("audit"), store.checkpoints("shop.sales.audit")) == ({}, {})
    assert store.counters("shop._default.audit") == {"success": 2}
    store.delete_function("shop.sales.audit")
    assert sorted(f.name for f in store.list_functions()) == names[:2]


def test_racing_transitions_let_exactly_one_process_win(backend):
    first = backend.open()
    _put_in_state(first, "fn", FunctionState.DEPLOYED)
    stores = [first, backend.open()]
    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def pause(s) -> None:
        barrier.wait()
        try:
            s.transition("fn", FunctionState.PAUSING, "pause")
            outcomes.append("won")
        except LifecycleError:
            outcomes.append("refused")

    threads = [threading.Thread(target=pause, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["refused", "won"]
    assert first.get_function("fn").state is FunctionState.PAUSING


# -- checkpoints, ownership and fencing ---------------------------------------------------------------------


def test_init_checkpoints_records_the_boundary_and_replaces_older_ones(store):
    store.init_checkpoints("fn", {0: 5, 1: 7, 2: 9}, "uuid-1")
    store.init_checkpoints("fn", {0: 10, 1: 11}, "uuid-2", epoch_base=1 << 32)
    cps = store.checkpoints("fn")
    assert sorted(cps) == [0, 1]
    assert (cps[0].seqno, cps[0].epoch, cps[0].owner, cps[0].bucket_uuid, cps[0].leased) == (
        10,
        1 << 32,
        None,
        "uuid-2",
        False,
    )
    assert cps[1].updated_at == pytest.approx(time.time(), abs=60)
    assert store.checkpoint_starts("fn") == {0: 10, 1: 11}
    store.drop_checkpoints("fn")
    assert store.checkpoints("fn") == {} and store.checkpoint_starts("fn") == {}


def test_claim_raises_the_epoch_and_fences_the_previous_owner(backend):
    store, zombie_store = backend.open(), backend.open()
    store.init_checkpoints("fn", {0: 0, 1: 0}, "uuid")
    old = zombie_store.claim("fn", [0, 1], "n/w0")
    new = store.claim("fn", [0], "n/w1")
    assert new[0].epoch == old[0].epoch + 1 and (new[0].owner, new[0].leased) == ("n/w1", True)
    fenced = zombie_store.commit("fn", {0: old[0].epoch, 1: old[1].epoch}, {0: 5, 1: 6}, [_dlq(0, 3)])
    assert fenced == {0}
    cps = store.checkpoints("fn")
    assert cps[0].seqno == 0 and cps[1].seqno == 6
    assert store.dlq_rows("fn") == []  # the zombie's dead letter for vb 0 was rejected too
    assert store.counters("fn")["fenced_checkpoint_writes"] == 1


def test_claim_reaches_the_minimum_epochs_asked_for(store):
    store.init_checkpoints("fn", {0: 0, 1: 0}, "uuid")
    claimed = store.claim("fn", [0, 1], "w", min_epochs={0: 50})
    assert (claimed[0].epoch, claimed[1].epoch) == (50, 1)


def test_claiming_vbuckets_without_checkpoints_is_fenced(store):
    store.init_checkpoints("fn", {0: 0}, "uuid")
    with pytest.raises(FencedError, match="no checkpoints for 1 vBuckets"):
        store.claim("fn", [0, 1], "w")


def test_epoch_base_keeps_older_deployments_fenced(backend):
    store, zombie_store = backend.open(), backend.open()
    store.init_checkpoints("fn", {0: 0}, "uuid")
    old = zombie_store.claim("fn", [0], "w")[0].epoch
    store.init_checkpoints("fn", {0: 0}, "uuid", epoch_base=1 << 32)
    assert zombie_store.commit("fn", {0: old}, {0: 9}) == {0}
    assert store.claim("fn", [0], "w")[0].epoch == (1 << 32) + 1
    assert store.checkpoints("fn")[0].seqno == 0


def test_checkpoint_never_moves_backwards(store):
    store.init_checkpoints("fn", {0: 0}, "uuid")
    e = store.claim("fn", [0], "w")[0].epoch
    store.commit("fn", {0: e}, {0: 10})
    with pytest.raises(OrderViolationError, match="vBucket 0 would move backwards from 10 to 9"):
        store.commit("fn", {0: e}, {0: 9}, [_dlq(0, 9)])
    assert store.checkpoints("fn")[0].seqno == 10
    assert store.dlq_rows("fn") == []  # the refused commit wrote nothing
    (refused,) = store.checkpoint_regressions("fn")
    assert {k: refused[k] for k in ("vb", "epoch", "from_seqno", "to_seqno", "how")} == {
        "vb": 0,
        "epoch": e,
        "from_seqno": 10,
        "to_seqno": 9,
        "how": "refused",
    }
    assert store.checkpoint_regressions("fn", min_epoch=e + 1) == []


def _paused_with_checkpoints(
    store, positions: dict[int, int], starts: dict[int, int] | None = None
) -> dict[int, int]:
    """A paused function 'fn' whose checkpoints were claimed, committed at `positions` and released."""
    _put_in_state(store, "fn", FunctionState.PAUSED)
    store.init_checkpoints("fn", starts or dict.fromkeys(positions, 0), "uuid")
    epochs = {vb: cp.epoch for vb, cp in store.claim("fn", positions, "n/w0").items()}
    store.commit("fn", epochs, positions)
    store.release("fn", epochs)
    return epochs


def test_a_rewind_moves_a_paused_functions_checkpoints_back_and_is_not_a_regression(store):
    epochs = _paused_with_checkpoints(store, {0: 10, 1: 20, 2: 3})
    moved = store.rewind_checkpoints("fn", {0: 4, 1: 0, 2: 5})
    assert moved == {0: (10, 4), 1: (20, 0)}  # vBucket 2 is already below its target: it stays
    cps = store.checkpoints("fn")
    assert {vb: cp.seqno for vb, cp in cps.items()} == {0: 4, 1: 0, 2: 3}
    assert (cps[0].epoch, cps[0].owner, cps[0].leased) == (epochs[0] + 1, "n/w0", False)
    assert cps[2].epoch == epochs[2]
    assert store.checkpoint_regressions("fn") == []
    rewinds = store.checkpoint_rewinds("fn")
    assert [(r["vb"], r["from_seqno"], r["to_seqno"], r["how"], r["epoch"]) for r in rewinds] == [
        (0, 10, 4, "rewind", epochs[0] + 1),
        (1, 20, 0, "rewind", epochs[1] + 1),
    ]
    assert store.checkpoint_rewinds("fn", min_epoch=epochs[0] + 2) == []


def test_an_owner_from_before_a_rewind_is_fenced(store):
    epochs = _paused_with_checkpoints(store, {0: 10})
    store.rewind_checkpoints("fn", {0: 2})
    assert store.commit("fn", epochs, {0: 11}) == {0}
    assert store.checkpoints("fn")[0].seqno == 2
    assert store.claim("fn", [0], "n/w1")[0].epoch == epochs[0] + 2


@pytest.mark.parametrize("state", [s for s in FunctionState if s is not FunctionState.PAUSED])
def test_only_a_paused_function_can_be_rewound(store, state):
    _put_in_state(store, "fn", state)
    store.init_checkpoints("fn", {0: 0}, "uuid")
    with pytest.raises(
        LifecycleError, match=f"cannot rewind function 'fn': it is {state.value}; only a paused"
    ):
        store.rewind_checkpoints("fn", {0: 0})


def test_a_rewind_below_the_feed_boundary_needs_the_effects_reapplied(store):
    _paused_with_checkpoints(store, {0: 30, 1: 30}, starts={0: 20, 1: 0})
    with pytest.raises(
        ConfigError,
        match="vBucket 0 .* started after seqno 20 .*rewind to 20 or later, or pass --reapply-effects",
    ):
        store.rewind_checkpoints("fn", {0: 5, 1: 5})
    assert {vb: cp.seqno for vb, cp in store.checkpoints("fn").items()} == {0: 30, 1: 30}  # nothing moved
    assert store.rewind_checkpoints("fn", {0: 5, 1: 5}, reapply_effects=True) == {0: (30, 5), 1: (30, 5)}
    assert store.checkpoint_starts("fn") == {0: 5, 1: 0}
    assert {r["how"] for r in store.checkpoint_rewinds("fn")} == {"rewind-reapply"}


def test_rewinding_vbuckets_without_checkpoints_or_to_a_negative_seqno_is_refused(store):
    _paused_with_checkpoints(store, {0: 3})
    with pytest.raises(ConfigError, match=r"no checkpoint for vBuckets \[7\]"):
        store.rewind_checkpoints("fn", {7: 0})
    with pytest.raises(ConfigError, match="to seqno -1; seqnos start at 0"):
        store.rewind_checkpoints("fn", {0: -1})


def test_commit_moves_checkpoints_and_counts_in_one_call(store):
    store.init_checkpoints("fn", {vb: 0 for vb in range(4)}, "uuid")
    epochs = {vb: cp.epoch for vb, cp in store.claim("fn", range(4), "w").items()}
    assert store.commit("fn", epochs, {0: 3, 2: 8}, (), {"success": 5, "failure": 0}) == set()
    assert {vb: cp.seqno for vb, cp in store.checkpoints("fn").items()} == {0: 3, 1: 0, 2: 8, 3: 0}
    assert store.counters("fn") == {"success": 5}  # zero increments are not stored


def test_release_keeps_owner_and_epoch_but_clears_the_lease(backend):
    store, zombie_store = backend.open(), backend.open()
    store.init_checkpoints("fn", {0: 0, 1: 0}, "uuid")
    stale = zombie_store.claim("fn", [1], "old")[1].epoch
    e = store.claim("fn", [0, 1], "w")
    assert zombie_store.release("fn", {1: stale}) == {1}
    assert store.checkpoints("fn")[1].leased  # the zombie's release changed nothing
    assert store.release("fn", {0: e[0].epoch, 1: e[1].epoch}) == set()
    cp = store.checkpoints("fn")[0]
    assert (cp.owner, cp.epoch, cp.leased) == ("w", e[0].epoch, False)


# -- dead letters -------------------------------------------------------------------------------------


def test_dlq_rows_are_inserted_once_per_function_vbucket_and_seqno(store):
    store.init_checkpoints("fn", {0: 0}, "uuid")
    e = store.claim("fn", [0], "w")[0].epoch
    store.commit("fn", {0: e}, {0: 1}, [_dlq(0, 1, error="first")])
    store.commit("fn", {0: e}, {0: 1}, [_dlq(0, 1, error="second")])
    (row,) = store.dlq_rows("fn")
    assert (row.error, row.mutation, row.replayed_at) == ("first", b"\x93\x00mutation", None)
    assert store.dlq_row("fn", 0, 1) == row
    assert store.dlq_row("fn", 0, 2) is None


def test_a_mutation_failing_again_after_its_replay_gets_its_dead_letter_back(store):
    store.init_checkpoints("fn", {0: 0}, "uuid")
    e = store.claim("fn", [0], "w")[0].epoch
    store.commit("fn", {0: e}, {0: 1}, [_dlq(0, 1, error="first")])
    assert store.mark_replayed("fn", [(0, 1)]) == 1
    assert store.find_dlq_rows("fn") == []
    store.commit("fn", {0: e}, {0: 1}, [_dlq(0, 1, error="again")])
    rows = store.find_dlq_rows("fn")
    assert [(r.error, r.replayed_at) for r in rows] == [("again", None)]
    assert rows[0].attempts == 2


def test_dlq_rows_can_be_found_replayed_retried_and_purged(store):
    store.init_checkpoints("fn", {0: 0, 5: 0}, "uuid")
    e = {vb: cp.epoch for vb, cp in store.claim("fn", [0, 5], "w").items()}
    rows = [
        _dlq(5, 2, key="a"),
        _dlq(0, 7, key="b", reason="timeout"),
        _dlq(0, 3, key="a"),
        _dlq(5, 1, key="c"),
    ]
    store.commit("fn", e, {0: 7, 5: 2}, rows)
    assert [(r.vb, r.seqno) for r in store.dlq_rows("fn")] == [(0, 3), (0, 7), (5, 1), (5, 2)]
    assert [(r.vb, r.seqno) for r in store.dlq_rows("fn", limit=2)] == [(0, 3), (0, 7)]
    assert [(r.vb, r.seqno) for r in store.find_dlq_rows("fn", key="a")] == [(0, 3), (5, 2)]
    assert [(r.vb, r.seqno) for r in store.find_dlq_rows("fn", vb=5, seqno=1)] == [(5, 1)]
    assert [(r.vb, r.seqno) for r in store.find_dlq_rows("fn", reason="timeout")] == [(0, 7)]
    store.commit("fn", e, {0: 7, 5: 2}, [dataclasses.replace(_dlq(5, 9, key="d"), generation=3)])
    assert [(r.vb, r.seqno) for r in store.find_dlq_rows("fn", generation=3)] == [(5, 9)]
    assert [(r.vb, r.seqno) for r in store.find_dlq_rows("fn", generation=0)] == [
        (0, 3),
        (0, 7),
        (5, 1),
        (5, 2),
    ]
    assert store.purge_dlq("fn", keys=[(5, 9)]) == 1

    assert store.mark_replayed("fn", [(0, 3), (5, 1), (9, 9)]) == 2
    assert store.mark_replayed("fn", [(0, 3)]) == 0  # already replayed
    assert [(r.vb, r.seqno) for r in store.dlq_rows("fn")] == [(0, 7), (5, 2)]
    assert [(r.vb, r.seqno) for r in store.find_dlq_rows("fn", replayed_only=True)] == [(0, 3), (5, 1)]
    assert len(store.dlq_rows("fn", include_replayed=True)) == 4
    assert store.dlq_row("fn", 0, 3).replayed_at == pytest.approx(time.time(), abs=60)

    store.record_replay_failure("fn", 5, 2, "timeout", "again", "tb2")
    again = store.dlq_row("fn", 5, 2)
    assert (again.attempts, again.reason, again.error, again.traceback) == (2, "timeout", "again", "tb2")

    assert store.purge_dlq("fn", replayed_only=True) == 2
    assert store.purge_dlq("fn", keys=[(0, 7), (1, 1)]) == 1
    assert [(r.vb, r.seqno) for r in store.dlq_rows("fn", include_replayed=True)] == [(5, 2)]
    assert store.purge_dlq("fn", reason="error") == 0
    assert store.purge_dlq("fn") == 1
    assert store.dlq_rows("fn", include_replayed=True) == []


def test_deaths_on_a_mutation_are_counted_per_deployment(backend):
    store = backend.open()
    store.init_checkpoints("fn", {0: 0, 5: 0}, "uuid")
    assert store.deaths("fn") == {}
    assert [store.count_death("fn", 5, 9) for _ in range(3)] == [1, 2, 3]
    assert store.count_death("fn", 0, 9) == 1
    assert store.count_death("fn", TIMER_VB_BASE + 5, 2) == 1  # a timer's callback (its fire_seq)
    assert store.count_death("other", 5, 9) == 1
    again = backend.open()  # another process sees them
    assert again.deaths("fn") == {(5, 9): 3, (0, 9): 1, (TIMER_VB_BASE + 5, 2): 1}
    store.init_checkpoints("fn", {0: 0, 5: 0}, "uuid")  # a new deployment starts without them
    assert store.deaths("fn") == {} and store.deaths("other") == {(5, 9): 1}
    store.count_death("fn", 5, 9)
    store.drop_checkpoints("fn")  # undeployed
    assert store.deaths("fn") == {}


# -- counters, services, nodes, settings --------------------------------------------------------------


def test_counters_add_and_gauges_set(store):
    store.add_counters("fn", {"success": 2, "failure": 1})
    store.add_counters("fn", {"success": 3, "latency_s": 0.25})
    store.set_gauges("fn", {"throughput_mps": 10.5})
    store.set_gauges("fn", {"throughput_mps": 7.0})
    store.add_counters("other", {"success": 1})
    assert store.counters("fn") == {"success": 5, "failure": 1, "latency_s": 0.25, "throughput_mps": 7.0}
    assert store.counters("other") == {"success": 1}
    assert store.counters("absent") == {}


def test_reset_counters_drops_one_functions_counters_but_the_kept_prefixes(store):
    store.add_counters("fn", {"on_update_success": 4, "dlq_error": 2})
    store.set_gauges("fn", {"throughput_mps": 3.0})
    store.add_counters("other", {"on_update_success": 1})
    store.reset_counters("fn", keep_prefixes=("dlq_",))
    assert store.counters("fn") == {"dlq_error": 2}
    assert store.counters("other") == {"on_update_success": 1}
    store.add_counters("fn", {"on_update_success": 1})  # counting starts again from zero
    assert store.counters("fn") == {"dlq_error": 2, "on_update_success": 1}
    store.reset_counters("fn")
    store.reset_counters("absent")
    assert store.counters("fn") == {} and store.counters("absent") == {}


def test_racing_counter_adds_lose_nothing(backend):
    stores = [backend.open(), backend.open()]
    barrier = threading.Barrier(2)

    def add(s) -> None:
        barrier.wait()
        for _ in range(25):
            s.add_counters("fn", {"success": 1})

    threads = [threading.Thread(target=add, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert stores[0].counters("fn") == {"success": 50}


def test_heartbeats_make_services_live_until_they_go_stale_or_leave(store):
    store.heartbeat("svc-a", '{"pid": 1}')
    store.heartbeat("svc-b", '{"pid": 2}')
    store.heartbeat("svc-a", '{"pid": 1}')
    assert sorted(store.live_services(60)) == ["svc-a", "svc-b"]
    time.sleep(0.05)
    assert store.live_services(0.01) == []
    store.remove_service("svc-a")
    assert store.live_services(60) == ["svc-b"]


def test_nodes_keep_the_order_they_were_added_in(store):
    store.put_node("n2", "active", "ray-2")
    time.sleep(0.01)
    store.put_node("n1", "joining")
    store.put_node("n2", "leaving")  # keeps its ray node id and its place
    store.put_node("n1", "active", "ray-1")
    nodes = store.nodes()
    assert [(n["name"], n["state"], n["ray_node_id"]) for n in nodes] == [
        ("n2", "leaving", "ray-2"),
        ("n1", "active", "ray-1"),
    ]
    assert nodes[0]["added_at"] <= nodes[1]["added_at"]
    store.delete_node("n2")
    store.delete_node("absent")
    assert [n["name"] for n in store.nodes()] == ["n1"]


def test_settings_round_trip(store):
    assert store.get_kv("plan") is None
    store.set_kv("plan", '{"a": 1}')
    store.set_kv("plan", '{"a": 2}')
    assert store.get_kv("plan") == '{"a": 2}'


def test_a_lease_is_held_renewed_and_refused_to_others_until_it_expires(store):
    assert store.lease("leader") is None
    first = store.acquire_lease("leader", "svc-a", 60, info='{"pid": 1}')
    assert first is not None and (first.holder, first.term, first.info) == ("svc-a", 1, '{"pid": 1}')
    assert store.acquire_lease("leader", "svc-b", 60) is None  # held: the standby keeps waiting
    time.sleep(0.01)
    renewed = store.acquire_lease("leader", "svc-a", 60, info='{"pid": 1}')
    assert renewed is not None and renewed.term == 1 and renewed.expires_at > first.expires_at
    assert renewed.acquired_at == first.acquired_at
    assert store.lease("leader") == renewed
    assert store.lease("other") is None


def test_an_expired_lease_goes_to_the_next_taker_with_a_higher_term_and_the_old_holder_learns_it(store):
    store.acquire_lease("leader", "svc-a", 0.05)
    time.sleep(0.1)
    taken = store.acquire_lease("leader", "svc-b", 60)
    assert taken is not None and (taken.holder, taken.term) == ("svc-b", 2)
    assert store.acquire_lease("leader", "svc-a", 60) is None  # the old leader's renewal fails: it steps down


def test_a_lease_of_a_holder_known_dead_is_taken_at_once_and_a_released_lease_is_free(store):
    store.acquire_lease("leader", "svc-a", 60)
    assert store.acquire_lease("leader", "svc-b", 60, take_from="svc-x") is None  # not the holder named
    taken = store.acquire_lease("leader", "svc-b", 60, take_from="svc-a")
    assert taken is not None and taken.holder == "svc-b" and taken.term == 2
    assert not store.release_lease("leader", "svc-a")  # not its lease any more
    assert store.release_lease("leader", "svc-b")
    assert store.lease("leader").expired(time.time())
    again = store.acquire_lease("leader", "svc-c", 60)
    assert again is not None and again.term == 3


def test_racing_takers_get_a_free_lease_exactly_once(backend):
    stores = [backend.open() for _ in range(4)]
    won: list[str] = []
    barrier = threading.Barrier(len(stores))

    def take(i: int) -> None:
        barrier.wait()
        if stores[i].acquire_lease("leader", f"svc-{i}", 60) is not None:
            won.append(f"svc-{i}")

    threads = [threading.Thread(target=take, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and stores[0].lease("leader").holder == won[0]


def test_a_healthy_store_passes_its_integrity_check(store):
    store.put_function("fn", {}, "")
    store.verify_integrity()


def _window_state(store):
    return store.window_states()


def test_a_window_coordinator_claim_fences_the_previous_coordinator(backend):
    store = backend.open()
    old, new = _window_state(store), _window_state(backend.open())
    assert old.claim("fn") == (1, None)
    assert old.commit("fn", 1, {"windows": [1]}, [_dlq(3, 4, reason="late")], {"late_rows": 1})
    assert new.claim("fn") == (2, {"windows": [1]})
    assert not old.commit("fn", 1, {"windows": [1, 2]}, [_dlq(3, 5, reason="late")], {"late_rows": 1})
    assert new.load("fn") == {"windows": [1]}
    assert [(r.vb, r.seqno, r.reason) for r in store.dlq_rows("fn")] == [(3, 4, "late")]
    assert store.counters("fn") == {"late_rows": 1}
    assert new.commit("fn", 2, {"windows": [2]}, [_dlq(3, 4, reason="late", error="again")])
    assert store.dlq_row("fn", 3, 4).error == "boom"  # inserted once


def test_window_state_keeps_the_arrival_policies_watermarks_and_metrics(backend):
    """The coordinator's arrival-time policy state (eventing.windows.semantics.arrival.ArrivalPolicy.to_state:
    per-vBucket or per-substream watermarks, substream keys as lists, and Azure's metrics) comes back exactly
    from a new coordinator's claim, in every backend's form."""
    from eventing.windows.semantics.arrival import ArrivalPolicy

    policy = ArrivalPolicy(
        out_of_order_tolerance_ms=120_000, late_arrival_tolerance_ms=300_000, substreams=True
    )
    for event, arrival, device in (
        (420_000, 420_000, "device1"),
        (1_020_000, 660_000, "device1"),
        (480_000, 780_000, "device3"),
        (720_000, 1_020_000, 7),
    ):
        policy.observe(event, arrival, key=device)
    state = {
        "version": 2,
        "arrival": policy.to_state(),
        "held": [["f1-000000001.arrow", 3]],
        "held_next": 2,
        "adjusted_next": 4,
    }
    ws = _window_state(backend.open())
    fence, _ = ws.claim("fn")
    assert ws.commit("fn", fence, state, [], {"window_early_input_events": 1})
    _, saved = _window_state(backend.open()).claim("fn")
    assert saved == json.loads(json.dumps(state))
    resumed = ArrivalPolicy(
        out_of_order_tolerance_ms=120_000, late_arrival_tolerance_ms=300_000, substreams=True
    ).restore(saved["arrival"])
    assert resumed.to_state() == policy.to_state()
    assert resumed.watermark_ms(("key", 7)) == policy.watermark_ms(("key", 7))
    assert (
        resumed.metrics()
        == policy.metrics()
        == {"out_of_order_events": 0, "late_input_events": 0, "early_input_events": 1}
    )


def test_resetting_window_state_forgets_it_and_fences_its_coordinator(store):
    ws = _window_state(store)
    fence, _ = ws.claim("fn")
    assert ws.commit("fn", fence, {"w": 1})
    ws.reset("fn")
    assert ws.load("fn") is None
    assert not ws.commit("fn", fence, {"w": 2})
    assert ws.claim("fn") == (fence + 2, None)


# -- the Couchbase logic's CAS loops, with a competing write slipped in -------------------------------------


def _slip_in_once(docs: MemoryDocuments, when: Callable[[str], bool], competitor: Callable[[], None]) -> None:
    def hook(key: str) -> None:
        if when(key):
            docs.before_write = None
            competitor()

    docs.before_write = hook


def test_a_claim_between_a_zombies_epoch_check_and_its_write_fences_the_zombie():
    docs = MemoryDocuments()
    zombie, owner = CouchbaseMetadataStore.on_documents(docs), CouchbaseMetadataStore.on_documents(docs)
    zombie.init_checkpoints("fn", {0: 0}, "uuid")
    old = zombie.claim("fn", [0], "old")[0].epoch
    # The zombie reads epoch `old` (still current), then the new owner claims before the zombie writes.
    _slip_in_once(docs, lambda key: key.endswith("::cp::fn::0"), lambda: owner.claim("fn", [0], "new"))
    assert zombie.commit("fn", {0: old}, {0: 42}) == {0}
    cp = owner.checkpoints("fn")[0]
    assert (cp.seqno, cp.epoch, cp.owner) == (0, old + 1, "new")
    assert docs.lost_races == 1


def test_a_transition_rechecks_the_state_another_process_set_in_between():
    docs = MemoryDocuments()
    a, b = CouchbaseMetadataStore.on_documents(docs), CouchbaseMetadataStore.on_documents(docs)
    _put_in_state(a, "fn", FunctionState.DEPLOYED)
    _slip_in_once(
        docs,
        lambda key: key.endswith("::fn::fn"),
        lambda: b.transition("fn", FunctionState.UNDEPLOYING, "undeploy"),
    )
    with pytest.raises(LifecycleError, match="cannot pause function 'fn': it is undeploying"):
        a.transition("fn", FunctionState.PAUSING, "pause")
    assert a.get_function("fn").state is FunctionState.UNDEPLOYING


def test_a_function_deployed_while_being_deleted_is_kept():
    docs = MemoryDocuments()
    a, b = CouchbaseMetadataStore.on_documents(docs), CouchbaseMetadataStore.on_documents(docs)
    a.put_function("fn", {}, "")
    _slip_in_once(
        docs,
        lambda key: key.endswith("::fn::fn"),
        lambda: b.transition("fn", FunctionState.DEPLOYING, "deploy"),
    )
    with pytest.raises(LifecycleError, match="it is deploying; undeploy it first"):
        a.delete_function("fn")
    assert [f.name for f in a.list_functions()] == ["fn"]


def test_a_checkpoint_moved_ahead_by_the_same_owner_in_between_is_not_moved_back():
    docs = MemoryDocuments()
    a, b = CouchbaseMetadataStore.on_documents(docs), CouchbaseMetadataStore.on_documents(docs)
    a.init_checkpoints("fn", {0: 0}, "uuid")
    e = a.claim("fn", [0], "w")[0].epoch
    _slip_in_once(docs, lambda key: key.endswith("::cp::fn::0"), lambda: b.commit("fn", {0: e}, {0: 20}))
    with pytest.raises(OrderViolationError, match="from 20 to 10"):
        a.commit("fn", {0: e}, {0: 10})
    assert a.checkpoints("fn")[0].seqno == 20


def test_a_worker_claiming_while_a_rewind_writes_makes_the_rewind_fail_not_undo_the_claim():
    docs = MemoryDocuments()
    a, b = CouchbaseMetadataStore.on_documents(docs), CouchbaseMetadataStore.on_documents(docs)
    _paused_with_checkpoints(a, {0: 10})
    _slip_in_once(docs, lambda key: key.endswith("::cp::fn::0"), lambda: b.claim("fn", [0], "n/w9"))
    with pytest.raises(LifecycleError, match="was resumed while its checkpoints were being rewound"):
        a.rewind_checkpoints("fn", {0: 0})
    cp = a.checkpoints("fn")[0]
    assert (cp.seqno, cp.owner) == (10, "n/w9") and a.checkpoint_rewinds("fn") == []


def test_a_couchbase_store_is_backed_up_with_couchbases_tools(tmp_path):
    with pytest.raises(StoreError, match="back it up with Couchbase's own tools, e.g. `cbbackupmgr backup`"):
        CouchbaseMetadataStore.on_documents(MemoryDocuments()).backup(tmp_path / "b.sqlite3")
    assert not (tmp_path / "b.sqlite3").exists()


def test_the_couchbase_documents_follow_the_documented_layout():
    docs = MemoryDocuments()
    store = CouchbaseMetadataStore.on_documents(docs, prefix="p")
    store.put_function("fn", {}, "")
    store.init_checkpoints("fn", {0: 0, 1023: 0}, "uuid")
    e = {vb: cp.epoch for vb, cp in store.claim("fn", [0, 1023], "w").items()}
    store.commit("fn", e, {0: 5}, [_dlq(0, 5)], {"success": 1})
    store.heartbeat("svc", "{}")
    store.put_node("n", "active")
    store.set_kv("plan", "{}")
    store.acquire_lease("leader", "svc", 5)
    store.put_user("ann", "scrypt$16384$8$1$s$h", ["admin"])
    store.count_death("fn", 0, 7)
    assert docs.keys() == sorted(
        [
            "p::functions",
            "p::fn::fn",
            "p::cp::fn::0",
            "p::cp::fn::1023",
            "p::ctr::fn",
            "p::dlq::fn::0::5",
            "p::dlqix::fn::0",
            "p::deaths::fn",
            "p::services",
            "p::svc::svc",
            "p::nodes",
            "p::kv::plan",
            "p::lease::leader",
            "p::users",
            "p::user::ann",
            "p::kv::users_created",
        ]
    )


# -- the Couchbase failure path and the factory (no server needed) -----------------------------------------


def test_connecting_where_no_server_answers_fails_within_the_timeout_naming_the_fix():
    started = time.monotonic()
    with pytest.raises(StoreError) as caught:
        CouchbaseMetadataStore("couchbase://127.0.0.1:1", "meta", "user", "secret", timeout_s=0.5)
    elapsed = time.monotonic() - started
    message = str(caught.value)
    assert 0.3 <= elapsed < 3.0
    assert "couchbase://127.0.0.1:1" in message and "bucket 'meta'" in message
    assert message.endswith("check EVENTING_METADATA_URL, credentials and that the cluster is reachable")
    assert "\n" not in message and "secret" not in message


def test_the_factory_opens_sqlite_under_the_data_directory_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv("EVENTING_METADATA_URL", raising=False)
    with open_store(tmp_path) as store:
        assert isinstance(store, SqliteMetadataStore) and store.path == tmp_path / "metadata.sqlite3"
    with pytest.raises(NotFoundError):
        open_store(tmp_path / "absent", create=False)


def test_the_factory_opens_couchbase_when_the_url_is_set(tmp_path, monkeypatch):
    opened: list[tuple] = []

    class Recorder:
        def __init__(self, *args, **kwargs):
            opened.append((args, kwargs))

    import metadata.couchbase

    monkeypatch.setattr(
        metadata.couchbase, "CouchbaseMetadataStore", Recorder
    )  # the factory imports it when used
    monkeypatch.setenv(
        "EVENTING_METADATA_URL", "couchbase://cb1:11210,cb2/meta?timeout=2&prefix=prod&network=external"
    )
    monkeypatch.setenv("EVENTING_COUCHBASE_USERNAME", "eventing")
    monkeypatch.setenv("EVENTING_COUCHBASE_PASSWORD", "s3cret")
    assert isinstance(open_store(tmp_path), Recorder)
    assert opened == [
        (
            ("couchbase://cb1:11210,cb2?network=external", "meta", "eventing", "s3cret", 2.0),
            {"prefix": "prod"},
        )
    ]
    assert not (tmp_path / "metadata.sqlite3").exists()


def test_the_factory_fails_fast_on_an_unreachable_cluster(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "EVENTING_METADATA_URL", "couchbase://127.0.0.1:1/meta?username=u&password=hidden&timeout=0.3"
    )
    started = time.monotonic()
    with pytest.raises(
        StoreError, match=r"cannot connect to the Couchbase metadata store at couchbase://127\.0\.0\.1:1 "
    ) as caught:
        open_store(tmp_path)
    assert time.monotonic() - started < 3.5
    assert "hidden" not in str(caught.value)


def test_credentials_in_the_url_win_over_the_environment():
    env = {"EVENTING_COUCHBASE_USERNAME": "env-user", "EVENTING_COUCHBASE_PASSWORD": "env-pw"}
    target = parse_metadata_url("couchbases://cb.example.com/meta?username=url-user&password=p%40ss", env)
    assert (target.connection_string, target.username, target.password) == (
        "couchbases://cb.example.com",
        "url-user",
        "p@ss",
    )
    assert (target.timeout_s, target.prefix) == (5.0, "eventing")
    assert parse_metadata_url("couchbase://u:pw@cb/meta", env).username == "u"
    assert parse_metadata_url("couchbase://cb/meta", env).password == "env-pw"


@pytest.mark.parametrize(
    "url", ["redis://cache/meta", "sqlite:///tmp/metadata.sqlite3", "cb.example.com/meta"]
)
def test_an_unknown_scheme_names_the_supported_ones(url, tmp_path, monkeypatch):
    monkeypatch.setenv("EVENTING_METADATA_URL", url)
    with pytest.raises(StoreError, match="unsupported scheme .*supported: couchbase://, couchbases://"):
        open_store(tmp_path)


@pytest.mark.parametrize(
    ("url", "fix"),
    [
        ("couchbase://cb", "must name one host list and one bucket"),
        ("couchbase:///meta", "must name one host list and one bucket"),
        ("couchbase://cb/meta?username=u", "has no credentials; add \\?username=..&password=.."),
        (
            "couchbase://cb/meta?username=u&password=pw&timeout=soon",
            "timeout='soon' is not a positive number",
        ),
    ],
)
def test_a_malformed_couchbase_url_names_the_fix(url, fix):
    with pytest.raises(StoreError, match=fix) as caught:
        parse_metadata_url(url, {})
    assert "pw&" not in str(caught.value) and "password=pw" not in str(caught.value)


# -- the SDK adapter against the real SDK's exception classes (no server needed) ---------------------------


class _Result:
    """What the SDK's GetResult offers the adapter: the decoded value and the CAS."""

    def __init__(self, value: Any, cas: int = 7):
        self.value, self.cas = value, cas


class _MultiResult:
    def __init__(self, results: dict, exceptions: dict):
        self.results, self.exceptions = results, exceptions


class _Collection:
    """A collection whose calls return stored values or raise the exception a test sets for an operation."""

    def __init__(self, values: dict[str, Any] | None = None):
        self.values = dict(values or {})
        self.raises: dict[str, BaseException] = {}

    def _maybe_raise(self, op: str) -> None:
        if op in self.raises:
            raise self.raises[op]

    def get(self, key, *a, **kw):
        self._maybe_raise("get")
        from couchbase.exceptions import DocumentNotFoundException

        if key not in self.values:
            raise DocumentNotFoundException()
        return _Result(self.values[key])

    def get_multi(self, keys, *a, **kw):
        self._maybe_raise("get")
        return _MultiResult({k: _Result(self.values[k]) for k in keys if k in self.values}, {})

    def upsert(self, key, value, *a, **kw):
        self._maybe_raise("upsert")
        self.values[key] = value

    def replace(self, key, value, *a, **kw):
        self._maybe_raise("replace")
        self.values[key] = value

    def insert(self, key, value, *a, **kw):
        self._maybe_raise("insert")
        self.values[key] = value


def _sdk_docs(values: dict[str, Any] | None = None):
    pytest.importorskip("couchbase")
    from metadata.couchbase import SdkDocuments

    collection = _Collection(values)
    return SdkDocuments.on_collection(collection), collection


CONNECT_HINT = "check EVENTING_METADATA_URL, credentials and that the cluster is reachable"


def test_an_operation_after_close_raises_store_error_not_the_sdks_runtime_error():
    docs, collection = _sdk_docs()
    store = CouchbaseMetadataStore.on_documents(docs)
    store.close()
    with pytest.raises(
        StoreError, match=r"metadata store .* is closed; get eventing::functions needs an open store"
    ):
        store.list_functions()
    store.close()  # closing twice is fine
    # The SDK raises a plain RuntimeError when its connection is gone: that is a StoreError too.
    docs, collection = _sdk_docs()
    collection.raises["get"] = RuntimeError(
        "Cannot perform operations without first establishing a connection."
    )
    with pytest.raises(StoreError, match="establishing a connection"):
        CouchbaseMetadataStore.on_documents(docs).get_kv("plan")


@pytest.mark.parametrize("value", [[1, 2], "text", 42, None])
def test_a_document_that_is_not_a_json_object_is_reported_as_corruption(value):
    from metadata import StoreCorruptError

    docs, _ = _sdk_docs({"eventing::functions": {"names": ["fn"]}, "eventing::fn::fn": value})
    store = CouchbaseMetadataStore.on_documents(docs)
    with pytest.raises(StoreCorruptError, match=r"document eventing::fn::fn is not a JSON object") as caught:
        store.get_function("fn")
    assert "restore the bucket from a backup" in str(caught.value) and CONNECT_HINT not in str(caught.value)
    with pytest.raises(StoreCorruptError, match="eventing::fn::fn"):
        store.verify_integrity()


def test_verify_integrity_reports_a_damaged_document_of_any_function():
    from metadata import StoreCorruptError

    docs = MemoryDocuments()
    store = CouchbaseMetadataStore.on_documents(docs)
    store.put_function("fn", {"name": "fn"}, "src")
    store.init_checkpoints("fn", {0: 0, 1: 0}, "uuid")
    store.verify_integrity()
    docs.upsert("eventing::cp::fn::1", ["not", "a", "checkpoint"])  # type: ignore[arg-type]
    with pytest.raises(
        StoreCorruptError, match=r"document eventing::cp::fn::1 is not a JSON object \(a list\)"
    ):
        store.verify_integrity()
    docs.upsert("eventing::cp::fn::1", {"seqno": 3})
    with pytest.raises(StoreCorruptError, match=r"document eventing::cp::fn::1 lacks a valid field"):
        store.verify_integrity()


def _sdk_error(name: str, **kwargs):
    from couchbase import exceptions

    return getattr(exceptions, name)(**kwargs)


@pytest.mark.parametrize(
    ("op", "error", "expected"),
    [
        ("replace", ("DocumentLockedException", {}), "the document is locked by another client"),
        (
            "upsert",
            ("CouchbaseException", {"message": "value too large", "error_code": 104}),
            "over Couchbase's 20 MiB value limit",
        ),
        ("upsert", ("InvalidArgumentException", {"message": "Expected timedelta"}), "Expected timedelta"),
    ],
)
def test_errors_that_are_not_connection_problems_get_their_own_message(op, error, expected):
    docs, collection = _sdk_docs({"eventing::kv::plan": {"value": "1"}})
    collection.raises[op] = _sdk_error(error[0], **error[1])
    store = CouchbaseMetadataStore.on_documents(docs)
    with pytest.raises(StoreError) as caught:
        if op == "replace":
            store.put_node("n", "active")  # insert, then a CAS replace of the same document
            store.put_node("n", "leaving")
        else:
            store.set_kv("plan", "2")
    message = str(caught.value)
    assert expected in message and CONNECT_HINT not in message and "\n" not in message


def test_a_connection_problem_carries_the_connection_hint():
    docs, collection = _sdk_docs()
    collection.raises["get"] = _sdk_error("UnAmbiguousTimeoutException", message="timed out")
    with pytest.raises(
        StoreError,
        match=f"get eventing::kv::plan failed: UnAmbiguousTimeoutException: timed out; {CONNECT_HINT}",
    ):
        CouchbaseMetadataStore.on_documents(docs).get_kv("plan")


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (
            "kv_timeout=2500",
            "option kv_timeout=2500 is refused by the Couchbase SDK .*takes durations only from code",
        ),
        ("bogus=1", "option 'bogus' is not a Couchbase SDK connection option"),
        ("enable_tls=maybe", "option enable_tls=maybe is refused by the Couchbase SDK"),
        (
            "network=external&kv_timout=1",
            "option 'kv_timout' is not a Couchbase SDK connection option \\(similar: kv_",
        ),
        ("transcoder=raw", "option 'transcoder' is not a Couchbase SDK connection option"),
    ],
)
def test_url_options_the_sdk_does_not_know_or_take_are_rejected(query, expected):
    pytest.importorskip("couchbase")
    from metadata.couchbase.adapter import check_connection_options

    with pytest.raises(StoreError, match=expected) as caught:
        check_connection_options(f"couchbase://cb?{query}")
    assert CONNECT_HINT not in str(caught.value)


def test_url_options_the_sdk_takes_pass():
    pytest.importorskip("couchbase")
    from metadata.couchbase.adapter import check_connection_options

    check_connection_options("couchbase://cb?network=external&enable_tls=true&num_io_threads=2&ssl=no_verify")
    check_connection_options("couchbase://cb")


def test_a_bad_url_option_fails_before_connecting_with_its_own_message(tmp_path, monkeypatch):
    pytest.importorskip("couchbase")
    monkeypatch.setenv(
        "EVENTING_METADATA_URL", "couchbase://127.0.0.1:1/meta?username=u&password=p&kv_timeout=2500"
    )
    started = time.monotonic()
    with pytest.raises(StoreError, match="option kv_timeout=2500 is refused") as caught:
        open_store(tmp_path)
    assert time.monotonic() - started < 1.0
    assert "cannot connect" not in str(caught.value) and CONNECT_HINT not in str(caught.value)


# -- durable timers -------------------------------------------------------------------------------------


def _timer(
    source_vb: int, reference: str, due_ms: int | None, *, callback: str = "cb", context: str = "{}"
) -> TimerChange:
    return TimerChange(source_vb, callback, reference, vbucket_of(reference), due_ms, context)


def _timer_setup(store, refs: list[str]) -> dict[int, int]:
    vbs = sorted({vbucket_of(r) for r in refs} | {0})
    store.init_checkpoints("fn", dict.fromkeys(vbs, 0), "uuid")
    return {vb: cp.epoch for vb, cp in store.claim("fn", vbs, "w").items()}


def test_timers_become_durable_with_the_commit_and_the_same_callback_and_reference_overwrites(store):
    epochs = _timer_setup(store, ["a", "b"])
    store.commit(
        "fn",
        epochs,
        {0: 1},
        timer_changes=[_timer(0, "a", 100), _timer(0, "b", 50), _timer(0, "a", 70, context='{"n": 2}')],
    )
    a = store.get_timer("fn", "cb", "a")
    assert (a.vb, a.due_ms, a.context, a.fire_seq) == (vbucket_of("a"), 70, '{"n": 2}', None)
    assert store.timer_backlog("fn", 60) == {"pending": 2, "due": 1}
    store.commit("fn", epochs, {0: 2}, timer_changes=[_timer(0, "b", None)])  # cancel
    assert store.get_timer("fn", "cb", "b") is None
    assert store.get_timer("fn", "other", "a") is None


def test_due_timers_are_claimed_once_with_increasing_fire_seqs_and_done_removes_them(store):
    refs = ["a", "b", "c"]
    epochs = _timer_setup(store, refs)
    store.commit(
        "fn", epochs, {0: 1}, timer_changes=[_timer(0, "a", 10), _timer(0, "b", 20), _timer(0, "c", 999)]
    )
    first = store.claim_timers("fn", epochs, 30, 100)
    assert [t.reference for t in first] == ["a", "b"] and all(t.fire_seq for t in first)
    assert store.claim_timers("fn", epochs, 30, 100) == []  # claimed: not handed out twice
    again = store.claim_timers("fn", epochs, 30, 100, reclaim=epochs)  # a restarted owner gets them back
    assert {(t.reference, t.fire_seq) for t in again} == {(t.reference, t.fire_seq) for t in first}
    store.commit(
        "fn", epochs, {}, timers_done=[TimerDone(t.vb, t.callback, t.reference, t.fire_seq) for t in first]
    )
    assert store.timer_backlog("fn", 10**6) == {"pending": 1, "due": 1}
    (c,) = store.claim_timers("fn", epochs, 10**6, 100)
    same_vb = [t.fire_seq for t in first if t.vb == c.vb]
    assert c.fire_seq > max(same_vb, default=0)


def test_a_timer_set_again_while_claimed_survives_the_done_of_its_old_firing(store):
    epochs = _timer_setup(store, ["a"])
    store.commit("fn", epochs, {0: 1}, timer_changes=[_timer(0, "a", 10)])
    (t,) = store.claim_timers("fn", epochs, 10, 10)
    store.commit(
        "fn",
        epochs,
        {0: 2},
        timer_changes=[_timer(0, "a", 500)],
        timers_done=[TimerDone(t.vb, t.callback, t.reference, t.fire_seq)],
    )
    again = store.get_timer("fn", "cb", "a")
    assert again is not None and (again.due_ms, again.fire_seq) == (500, None)


def test_timer_writes_and_claims_of_a_stale_owner_are_fenced(backend):
    store, zombie = backend.open(), backend.open()
    refs = ["a"]
    vb = vbucket_of("a")
    store.init_checkpoints("fn", dict.fromkeys({0, vb}, 0), "uuid")
    old = {v: cp.epoch for v, cp in zombie.claim("fn", sorted({0, vb}), "w0").items()}
    zombie.commit("fn", old, {}, timer_changes=[_timer(0, r, 10) for r in refs])
    new = {v: cp.epoch for v, cp in store.claim("fn", sorted({0, vb}), "w1").items()}
    assert zombie.claim_timers("fn", old, 100, 10) == []  # the old owner fires nothing any more
    assert zombie.commit("fn", old, {}, timer_changes=[_timer(0, "z", 5)]) >= {0}
    assert store.get_timer("fn", "cb", "z") is None
    (t,) = store.claim_timers("fn", new, 100, 10)
    assert zombie.commit(
        "fn", old, {}, timers_done=[TimerDone(t.vb, t.callback, t.reference, t.fire_seq)]
    ) >= {vb}
    assert store.get_timer("fn", "cb", "a") is not None  # the zombie's done was rejected


def test_timer_dead_letters_live_beside_the_vbucket_and_are_fenced_by_it(store):
    epochs = _timer_setup(store, [])
    row = _dlq(TIMER_VB_BASE + 0, 1, reason="timer_error")
    assert store.commit("fn", epochs, {}, [row]) == set()
    assert [(r.vb, r.seqno, r.reason) for r in store.dlq_rows("fn")] == [(TIMER_VB_BASE, 1, "timer_error")]


def test_drop_timers_removes_every_timer_of_the_function(store):
    epochs = _timer_setup(store, ["a", "b"])
    store.commit("fn", epochs, {}, timer_changes=[_timer(0, "a", 1), _timer(0, "b", 2)])
    store.drop_timers("fn")
    assert store.timer_backlog("fn", 10) == {"pending": 0, "due": 0}


# -- users of the APIs --------------------------------------------------------------------------------------


def test_users_are_stored_listed_by_name_replaced_and_deleted(store):
    assert store.list_users() == []
    bob = store.put_user("bob", "scrypt$16384$8$1$c2FsdA==$aGFzaA==", ["data_reader[shop.*.*]"])
    assert (bob.name, bob.roles) == ("bob", ("data_reader[shop.*.*]",))
    store.put_user("alice", "scrypt$16384$8$1$x$y", ["admin"])
    again = store.put_user("bob", "scrypt$16384$8$1$new$hash", ["ro_admin", "data_writer[shop.sales.*]"])
    assert again.created_at == bob.created_at  # replacing keeps when the user was created
    assert store.get_user("bob").password_hash == "scrypt$16384$8$1$new$hash"
    assert store.get_user("bob").roles == ("ro_admin", "data_writer[shop.sales.*]")
    assert [u.name for u in store.list_users()] == ["alice", "bob"]
    store.delete_user("bob")
    assert [u.name for u in store.list_users()] == ["alice"]
    with pytest.raises(NotFoundError, match="unknown user 'bob'"):
        store.get_user("bob")
    with pytest.raises(NotFoundError, match="unknown user 'bob'"):
        store.delete_user("bob")


def test_a_store_keeps_its_users_mark_once_its_last_user_is_deleted(store):
    assert store.get_kv(USERS_MARK) is None
    store.put_user("bob", "scrypt$16384$8$1$x$y", ["admin"])
    store.delete_user("bob")
    assert store.list_users() == [] and store.get_kv(USERS_MARK) is not None


def test_who_deployed_a_function_is_kept_with_it(store):
    assert store.put_function("fn", {}, "").deployed_by is None
    store.set_deployed_by("fn", {"user": "bob", "admin": False, "at": 1.0})
    store.transition("fn", FunctionState.DEPLOYING, "deploy", bump_generation=True)
    assert store.get_function("fn").deployed_by == {"user": "bob", "admin": False, "at": 1.0}
    assert [r.deployed_by for r in store.list_functions()] == [{"user": "bob", "admin": False, "at": 1.0}]
    store.set_deployed_by("fn", None)
    assert store.get_function("fn").deployed_by is None
    with pytest.raises(NotFoundError):
        store.set_deployed_by("absent", None)
