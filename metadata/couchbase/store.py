"""CouchbaseMetadataStore: the MetadataStore protocol over Couchbase documents (layout and guarantees in
the package docstring, metadata/couchbase/__init__.py)."""

from __future__ import annotations

import base64
import copy
import functools
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self, TypeVar

from metadata.couchbase.adapter import SdkDocuments
from metadata.couchbase.documents import Doc, Documents
from metadata.errors import (
    ConfigError,
    FencedError,
    LifecycleError,
    NotFoundError,
    OrderViolationError,
    StoreCorruptError,
    StoreError,
)
from metadata.fencing import fenced_vbuckets, holds, next_epoch
from metadata.model import (
    REWIND,
    REWIND_REAPPLY,
    Checkpoint,
    DlqRow,
    FunctionRecord,
    FunctionState,
    Lease,
    TimerChange,
    TimerDone,
    TimerRecord,
    UserRecord,
    check_rewind_allowed,
    check_transition,
    next_lease,
    owner_vb,
    plan_rewind,
)
from sharding import NUM_VBUCKETS, vbucket_of

if TYPE_CHECKING:
    from metadata.protocol import MetadataStore

T = TypeVar("T")

# (seconds), so a live service never vanishes, while a crashed one's document is reclaimed by the server.
SERVICE_TTL_S = 24 * 3600
# A CAS loop gives up after this many lost races (with backoff up to 50 ms: ~10 s of contention).
MAX_CAS_ATTEMPTS = 200
# Dead letters fetched per multi-get while filtering (bounds memory on large dead-letter queues).
DLQ_FETCH_CHUNK = 500

if TYPE_CHECKING:
    from metadata.couchbase.window_state import CouchbaseWindowStateStore


class CouchbaseMetadataStore:
    """MetadataStore on a Couchbase bucket (see metadata/couchbase/__init__.py for the layout and the guarantees).

    Connecting is eager: a cluster that does not answer within `timeout_s` raises StoreError naming the
    URL and the fix. Operations that fail later (the cluster went away) raise StoreError too; processing
    then stops at its last checkpoint, it never skips one.
    """

    def __init__(
        self,
        url: str,
        bucket: str,
        username: str,
        password: str,
        timeout_s: float = 5,
        *,
        prefix: str = "eventing",
    ):
        self._setup(SdkDocuments(url, bucket, username, password, timeout_s), prefix)

    @classmethod
    def on_documents(cls, documents: Documents, *, prefix: str = "eventing") -> CouchbaseMetadataStore:
        """The store's logic over any `Documents` (tests use an in-memory one with the same CAS rules)."""
        store = cls.__new__(cls)
        store._setup(documents, prefix)
        return store

    def _setup(self, documents: Documents, prefix: str) -> None:
        self._docs = documents
        self.prefix = prefix
        self.where = documents.where

    def window_states(self) -> CouchbaseWindowStateStore:
        """The window coordinators' fenced state, one document per function (no cross-document transaction
        here: dead letters (insert-once) go first, then the state under its fence (CAS), then counters; a
        crash in between redoes the batch, and only counters can lag)."""
        from metadata.couchbase.window_state import CouchbaseWindowStateStore

        return CouchbaseWindowStateStore(self)

    def close(self) -> None:
        self._docs.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def backup(self, target: str | os.PathLike[str]) -> None:
        """Not done here: Couchbase backs its buckets up with its own tools."""
        raise StoreError(
            f"the metadata store is in Couchbase ({self.where}); back it up with Couchbase's own tools, "
            f"e.g. `cbbackupmgr backup` of that bucket (documents under '{self.prefix}::'), not `eventing backup`"
        )

    def verify_integrity(self) -> None:
        """Read every function's documents (index, definition, checkpoints, counters) and check their shape:
        a document that is not a JSON object, or lacks the fields the store writes, raises StoreCorruptError
        naming it (the runtime must stop at its last checkpoint, never skip ahead of a damaged one)."""
        got = self._get(self._key("functions"))
        if got is not None and not (isinstance(got[0].get("names"), list) and all(isinstance(n, str) for n in got[0]["names"])):
            raise self._corrupt(self._key("functions"), "is not a function index")
        for record in self.list_functions():
            self.checkpoints(record.name)
            self.counters(record.name)

    def _corrupt(self, key: str, what: str) -> StoreCorruptError:
        return StoreCorruptError(
            f"metadata store {self.where}: document {key} {what}; restore the bucket from a backup "
            f"(cbbackupmgr), or remove the documents under prefix '{self.prefix}::' and deploy the functions again"
        )

    def _get(self, key: str) -> tuple[Doc, int] | None:
        """`Documents.get`, with a value that is not a JSON object reported as corruption."""
        got = self._docs.get(key)
        if got is not None and not isinstance(got[0], dict):
            raise self._corrupt(key, f"is not a JSON object (a {type(got[0]).__name__})")
        return got

    def _get_many(self, keys: Sequence[str]) -> dict[str, tuple[Doc, int]]:
        found = self._docs.get_many(keys)
        for key, (value, _) in found.items():
            if not isinstance(value, dict):
                raise self._corrupt(key, f"is not a JSON object (a {type(value).__name__})")
        return found

    def _decode(self, key: str, decode: Callable[..., T], *args: Any) -> T:
        """Turn a stored document into a value; missing or mistyped fields are corruption, not a crash."""
        try:
            return decode(*args)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise self._corrupt(key, f"lacks a valid field ({type(exc).__name__}: {exc})") from None

    # -- keys and CAS loops ---------------------------------------------------------------------------

    def _key(self, *parts: object) -> str:
        return "::".join([self.prefix, *(str(p) for p in parts)])

    def _cp_key(self, function: str, vb: int) -> str:
        return self._key("cp", function, vb)

    def _cp_keys(self, function: str) -> dict[int, str]:
        return {vb: self._cp_key(function, vb) for vb in range(NUM_VBUCKETS)}

    def _mutate(
        self,
        key: str,
        change: Callable[[Doc | None], Doc | None],
        *,
        expiry_s: float | None = None,
    ) -> Doc | None:
        """Read-check-write `key` until the write wins its CAS check; returns what was written.

        `change` gets a copy of the current document (None if absent) and returns the new one, or None
        to write nothing; it may raise, and it may be called again after a lost race, so it must only
        decide from its argument.
        """
        for attempt in range(MAX_CAS_ATTEMPTS):
            got = self._get(key)
            new = change(copy.deepcopy(got[0]) if got else None)
            if new is None:
                return None
            if got is None:
                if self._docs.insert(key, new, expiry_s=expiry_s):
                    return new
            elif self._docs.replace(key, new, got[1]):
                return new
            if attempt >= 3:
                time.sleep(min(0.001 * 2**attempt, 0.05))
        raise StoreError(
            f"metadata store {self.where}: document {key} kept changing under concurrent writers "
            f"({MAX_CAS_ATTEMPTS} attempts); check for a runaway process writing to it"
        )

    def _mutate_many(self, changes: Mapping[str, Callable[[Doc | None], Doc | None]]) -> dict[str, Doc | None]:
        """`_mutate` for many documents: one multi-get and one multi-replace, then each lost race alone."""
        current = self._get_many(list(changes))
        out: dict[str, Doc | None] = {}
        batch: dict[str, tuple[Doc, int]] = {}
        for key, change in changes.items():
            got = current.get(key)
            if got is None:
                out[key] = self._mutate(key, change)
                continue
            new = change(copy.deepcopy(got[0]))
            out[key] = new
            if new is not None:
                batch[key] = (new, got[1])
        for key in self._docs.replace_many(batch) if batch else set():
            out[key] = self._mutate(key, changes[key])
        return out

    def _index_add(self, key: str, field: str, values: Iterable[Any]) -> None:
        wanted = list(values)

        def change(doc: Doc | None) -> Doc | None:
            doc = doc or {field: []}
            missing = [v for v in wanted if v not in doc[field]]
            if not missing:
                return None
            doc[field] = sorted(doc[field] + missing)
            return doc

        self._mutate(key, change)

    def _index_remove(self, key: str, field: str, values: Iterable[Any]) -> None:
        unwanted = set(values)

        def change(doc: Doc | None) -> Doc | None:
            if doc is None or not unwanted & set(doc[field]):
                return None
            doc[field] = [v for v in doc[field] if v not in unwanted]
            return doc

        self._mutate(key, change)

    # -- functions ----------------------------------------------------------------------------------

    def put_function(self, name: str, definition: dict, source: str) -> FunctionRecord:
        """Create a function (undeployed) or update the definition of an undeployed or paused one."""
        # Index first: a crash before the document is written leaves a name that listing skips.
        self._index_add(self._key("functions"), "names", [name])

        def change(doc: Doc | None) -> Doc:
            now = time.time()
            if doc is None:
                state = FunctionState.UNDEPLOYED.value
                return {"definition": definition, "source": source, "state": state, "generation": 0, "updated_at": now}
            if doc["state"] not in (FunctionState.UNDEPLOYED.value, FunctionState.PAUSED.value):
                raise LifecycleError(
                    f"cannot update function '{name}': it is {doc['state']}; pause or undeploy it first"
                )
            return dict(doc, definition=definition, source=source, updated_at=now)

        written = self._mutate(self._key("fn", name), change)
        assert written is not None
        return _function(name, written)

    def get_function(self, name: str) -> FunctionRecord:
        got = self._get(self._key("fn", name))
        if got is None:
            known = ", ".join(r.name for r in self.list_functions()) or "none"
            raise NotFoundError(f"unknown function '{name}' (known: {known}); see `eventing list`")
        return self._decode(self._key("fn", name), _function, name, got[0])

    def list_functions(self) -> list[FunctionRecord]:
        index = self._get(self._key("functions"))
        names = index[0]["names"] if index else []
        docs = self._get_many([self._key("fn", n) for n in names])
        return [
            self._decode(self._key("fn", n), _function, n, docs[self._key("fn", n)][0])
            for n in sorted(names)
            if self._key("fn", n) in docs
        ]

    def delete_function(self, name: str) -> None:
        key = self._key("fn", name)
        for _ in range(MAX_CAS_ATTEMPTS):
            got = self._get(key)
            if got is None:
                raise NotFoundError(f"unknown function '{name}'; see `eventing list`")
            if got[0]["state"] != FunctionState.UNDEPLOYED.value:
                raise LifecycleError(f"cannot delete function '{name}': it is {got[0]['state']}; undeploy it first")
            if self._docs.remove(key, got[1]):  # only if nobody deployed it since the check
                break
        else:
            raise StoreError(f"metadata store {self.where}: function '{name}' kept changing while being deleted")
        self.drop_checkpoints(name)
        self.drop_timers(name)
        self.purge_dlq(name)
        self._docs.remove_many([self._key("ctr", name), self._key("cpreg", name), self._key("win", name)])
        self._index_remove(self._key("functions"), "names", [name])

    def transition(
        self, name: str, target: FunctionState, action: str, *, bump_generation: bool = False
    ) -> FunctionRecord:
        """Move a function to `target` atomically, or raise LifecycleError naming the state and the fix."""

        def change(doc: Doc | None) -> Doc:
            if doc is None:
                raise NotFoundError(f"unknown function '{name}'; see `eventing list`")
            check_transition(name, FunctionState(doc["state"]), target, action)
            generation = doc["generation"] + (1 if bump_generation else 0)
            return dict(doc, state=target.value, generation=generation, updated_at=time.time())

        written = self._mutate(self._key("fn", name), change)
        assert written is not None
        return _function(name, written)

    def set_deployed_by(self, name: str, deployed_by: dict | None) -> None:
        """Record who deploys or resumes a function over the API (None: the local CLI, trusted as an admin)."""

        def change(doc: Doc | None) -> Doc:
            if doc is None:
                raise NotFoundError(f"unknown function '{name}'; see `eventing list`")
            return dict(doc, deployed_by=deployed_by)

        self._mutate(self._key("fn", name), change)

    # -- users of the APIs ----------------------------------------------------------------------------

    def put_user(self, name: str, password_hash: str, roles: Sequence[str]) -> UserRecord:
        """Create a user, or replace the hash and roles of an existing one (keeping when it was created)."""
        self._index_add(self._key("users"), "names", [name])

        def change(doc: Doc | None) -> Doc:
            created = doc["created_at"] if doc is not None else time.time()
            return {"hash": password_hash, "roles": list(roles), "created_at": created}

        written = self._mutate(self._key("user", name), change)
        assert written is not None
        return _user(name, written)

    def get_user(self, name: str) -> UserRecord:
        got = self._get(self._key("user", name))
        if got is None:
            raise NotFoundError(f"unknown user '{name}'; see `eventing user list`")
        return self._decode(self._key("user", name), _user, name, got[0])

    def list_users(self) -> list[UserRecord]:
        index = self._get(self._key("users"))
        names = index[0]["names"] if index else []
        docs = self._get_many([self._key("user", n) for n in names])
        return [
            self._decode(self._key("user", n), _user, n, docs[self._key("user", n)][0])
            for n in sorted(names)
            if self._key("user", n) in docs
        ]

    def delete_user(self, name: str) -> None:
        if not self._docs.remove(self._key("user", name)):
            raise NotFoundError(f"unknown user '{name}'; see `eventing user list`")
        self._index_remove(self._key("users"), "names", [name])

    # -- checkpoints and ownership --------------------------------------------------------------------

    def init_checkpoints(
        self, function: str, positions: Mapping[int, int], bucket_uuid: str, epoch_base: int = 0
    ) -> None:
        """Start a deployment's checkpoints; epochs start at epoch_base so older deployments stay fenced.

        A zombie of an older deployment holds a lower epoch: its next commit reads the new documents
        (or loses its CAS race against these writes) and is fenced.
        """
        bad = sorted(vb for vb in positions if not 0 <= vb < NUM_VBUCKETS)
        if bad:
            raise ConfigError(f"vBuckets {bad[:5]} of function '{function}' are outside 0..{NUM_VBUCKETS - 1}")
        now = time.time()
        keys = self._cp_keys(function)
        self._docs.upsert_many(
            {
                keys[vb]: {
                    "seqno": seqno, "epoch": epoch_base, "owner": None, "bucket_uuid": bucket_uuid,
                    "updated_at": now, "leased": False, "start": seqno,
                }
                for vb, seqno in positions.items()
            }
        )
        self._docs.remove_many([key for vb, key in keys.items() if vb not in positions])

    def drop_checkpoints(self, function: str) -> None:
        self._docs.remove_many(list(self._cp_keys(function).values()))

    def checkpoints(self, function: str) -> dict[int, Checkpoint]:
        keys = self._cp_keys(function)
        docs = self._get_many(list(keys.values()))
        return {vb: self._decode(key, _checkpoint, function, vb, docs[key][0]) for vb, key in keys.items() if key in docs}

    def checkpoint_starts(self, function: str) -> dict[int, int]:
        """Per vBucket, the seqno the current deployment started after (its feed boundary)."""
        keys = self._cp_keys(function)
        docs = self._get_many(list(keys.values()))
        return {vb: docs[key][0]["start"] for vb, key in keys.items() if key in docs}

    def checkpoint_regressions(self, function: str, *, min_epoch: int = 0) -> list[dict]:
        """Backwards moves of the function's checkpoints that commit refused, oldest first (every write
        goes through commit here, so there is no 'applied' kind as SQLite's trigger can record).
        Deliberate rewinds (rewind_checkpoints) are not regressions; see checkpoint_rewinds."""
        return [r for r in self._moves(function, min_epoch) if r["how"] not in (REWIND, REWIND_REAPPLY)]

    def checkpoint_rewinds(self, function: str, *, min_epoch: int = 0) -> list[dict]:
        """The moves rewind_checkpoints made, oldest first (how: REWIND or REWIND_REAPPLY)."""
        return [r for r in self._moves(function, min_epoch) if r["how"] in (REWIND, REWIND_REAPPLY)]

    def _moves(self, function: str, min_epoch: int) -> list[dict]:
        got = self._get(self._key("cpreg", function))
        rows = [r for r in (got[0]["rows"] if got else []) if r["epoch"] >= min_epoch]
        return sorted(rows, key=lambda r: (r["at"], r["vb"]))

    def rewind_checkpoints(
        self, function: str, targets: Mapping[int, int], *, reapply_effects: bool = False
    ) -> dict[int, tuple[int, int]]:
        """Move a paused function's checkpoints back (see MetadataStore.rewind_checkpoints).

        Per document, as everything here: the state is checked first, then each checkpoint is replaced
        only while it still holds the epoch read with it, so a worker that claimed it in between (the
        function was resumed meanwhile) makes the rewind fail with LifecycleError instead of being undone.
        The rewinds are recorded after the checkpoints moved.
        """
        check_rewind_allowed(function, self.get_function(function).state)
        keys = {vb: self._cp_key(function, vb) for vb in targets}
        docs = self._get_many(list(keys.values()))
        current = {
            vb: (docs[k][0]["seqno"], docs[k][0]["epoch"], docs[k][0].get("start")) for vb, k in keys.items() if k in docs
        }
        moves = plan_rewind(function, current, targets, reapply_effects)
        now = time.time()
        raced: list[int] = []

        def rewind(vb: int, epoch: int, to: int) -> Callable[[Doc | None], Doc | None]:
            def change(doc: Doc | None) -> Doc | None:
                if doc is None or not holds(doc["epoch"], epoch):
                    raced.append(vb)
                    return None
                start = doc.get("start")
                return dict(
                    doc, seqno=to, epoch=epoch + 1, leased=False, updated_at=now,
                    start=to if start is None else min(start, to),
                )

            return change

        self._mutate_many({keys[vb]: rewind(vb, current[vb][1], to) for vb, (_, to) in moves.items()})
        how = REWIND_REAPPLY if reapply_effects else REWIND
        done = {vb: m for vb, m in moves.items() if vb not in raced}
        rows = [
            {"vb": vb, "epoch": current[vb][1] + 1, "from_seqno": f, "to_seqno": t, "how": how, "at": now}
            for vb, (f, t) in done.items()
        ]
        if rows:
            self._mutate(self._key("cpreg", function), lambda doc: {"rows": [*(doc or {"rows": []})["rows"], *rows]})
        if raced:
            raise LifecycleError(
                f"function '{function}' was resumed while its checkpoints were being rewound: {len(done)} vBuckets "
                f"moved back, {len(raced)} (e.g. {sorted(raced)[:3]}) were claimed by a worker first; pause it and "
                "rewind again"
            )
        return moves

    def claim(
        self, function: str, vbuckets: Iterable[int], owner: str, *, min_epochs: Mapping[int, int] | None = None
    ) -> dict[int, Checkpoint]:
        """Take ownership of vBuckets with a higher epoch; any previous owner is fenced from then on.

        min_epochs: per vBucket, an epoch the new one must reach at least (as in SqliteMetadataStore).
        """
        vbs = list(vbuckets)
        floor = dict(min_epochs or {})
        now = time.time()

        def take(vb: int) -> Callable[[Doc | None], Doc | None]:
            def change(doc: Doc | None) -> Doc | None:
                if doc is None:
                    return None
                return dict(doc, epoch=next_epoch(doc["epoch"], floor.get(vb, 0)), owner=owner, leased=True, updated_at=now)

            return change

        written = self._mutate_many({self._cp_key(function, vb): take(vb) for vb in vbs})
        claimed = {vb: written[self._cp_key(function, vb)] for vb in vbs}
        missing = {vb for vb, doc in claimed.items() if doc is None}
        if missing:
            raise FencedError(
                f"function '{function}' has no checkpoints for {len(missing)} vBuckets; "
                "it was undeployed while starting; deploy it again"
            )
        return {vb: _checkpoint(function, vb, doc) for vb, doc in claimed.items() if doc is not None}

    def commit(
        self,
        function: str,
        epochs: Mapping[int, int],
        seqnos: Mapping[int, int],
        dlq_rows: Iterable[DlqRow] = (),
        counters: Mapping[str, int] | None = None,
        timer_changes: Iterable[TimerChange] = (),
        timers_done: Iterable[TimerDone] = (),
    ) -> set[int]:
        """Write DLQ rows, then timers, then checkpoints, then counters, each checkpoint conditional on the
        owner's epoch (timer changes are fenced by their source vBucket, fired timers by theirs).

        Returns the vBuckets whose epoch moved on (the caller is a zombie for those): their checkpoints
        and DLQ rows are rejected. A checkpoint that would move backwards raises OrderViolationError
        before anything is written.
        """
        dlq = list(dlq_rows)
        timer_list = list(timer_changes)
        done = list(timers_done)
        now = time.time()
        # Every held vBucket is checked, not only those that moved: a zombie learns at its next commit
        # that it lost them all, and stops working on them.
        vbs = sorted(
            set(epochs) | set(seqnos) | {owner_vb(r.vb) for r in dlq} | {c.source_vb for c in timer_list}
            | {d.vb for d in done}
        )
        keys = {vb: self._cp_key(function, vb) for vb in vbs}
        current = self._get_many(list(keys.values()))
        fenced = fenced_vbuckets(vbs, {vb: current[k][0]["epoch"] for vb, k in keys.items() if k in current}, epochs)
        for vb, seqno in seqnos.items():
            if vb not in fenced and seqno < current[keys[vb]][0]["seqno"]:
                self._refuse(function, vb, epochs[vb], current[keys[vb]][0]["seqno"], seqno, now)

        # 1. Dead letters first: a checkpoint never passes a mutation whose dead letter is not stored.
        #    A vBucket claimed by a new owner after the read above can still receive this batch's dead
        #    letters; they are keyed by (function, vBucket, seqno), the same documents the new owner writes.
        self._insert_dlq([r for r in dlq if owner_vb(r.vb) not in fenced])
        # Timers next (idempotent: a replay writes the same creates, a done matches its fire_seq once).
        self._write_timers(function, timer_list, done, fenced, now)

        # 2. Checkpoints, each replaced only while it still holds the caller's epoch (CAS): a claim since
        #    the read changes the CAS, the retry sees the new epoch and the write is fenced.
        def advance(vb: int, seqno: int) -> Callable[[Doc | None], Doc | None]:
            def change(doc: Doc | None) -> Doc | None:
                if doc is None or not holds(doc["epoch"], epochs.get(vb)):
                    fenced.add(vb)
                    return None
                if seqno < doc["seqno"]:
                    self._refuse(function, vb, epochs[vb], doc["seqno"], seqno, now)
                return dict(doc, seqno=seqno, updated_at=now)

            return change

        changes = {keys[vb]: advance(vb, seqno) for vb, seqno in seqnos.items() if vb not in fenced}
        batch = {k: (c(copy.deepcopy(current[k][0])), current[k][1]) for k, c in changes.items()}
        for key in self._docs.replace_many({k: (d, cas) for k, (d, cas) in batch.items() if d is not None}):
            self._mutate(key, changes[key])

        # 3. Counters last; they are statistics, not positions.
        rejected = sum(1 for vb in seqnos if vb in fenced)
        self.add_counters(function, dict(counters or {}, fenced_checkpoint_writes=rejected))
        return fenced

    # -- timers ---------------------------------------------------------------------------------------

    def _timer_key(self, function: str, vb: int) -> str:
        return self._key("tmr", function, vb)

    def _write_timers(
        self, function: str, changes: list[TimerChange], done: list[TimerDone], fenced: set[int], now: float
    ) -> None:
        """As SqliteMetadataStore: fired timers (if they still hold their fire_seq) first, then creates and
        cancels in order; one CAS loop per vBucket document touched."""
        per_vb: dict[int, list[Callable[[Doc], None]]] = defaultdict(list)
        for d in done:
            if d.vb in fenced:
                continue

            def finish(doc: Doc, d: TimerDone = d) -> None:
                tid = _timer_id(d.callback, d.reference)
                if doc["timers"].get(tid, {}).get("fire_seq") == d.fire_seq:
                    del doc["timers"][tid]

            per_vb[d.vb].append(finish)
        for c in changes:
            if c.source_vb in fenced:
                continue

            def apply(doc: Doc, c: TimerChange = c) -> None:
                tid = _timer_id(c.callback, c.reference)
                if c.due_ms is None:
                    doc["timers"].pop(tid, None)
                else:
                    doc["timers"][tid] = {
                        "callback": c.callback, "reference": c.reference, "due_ms": c.due_ms,
                        "context": c.context, "created_at": now, "fire_seq": None,
                    }

            per_vb[c.vb].append(apply)

        def run(steps: list[Callable[[Doc], None]]) -> Callable[[Doc | None], Doc | None]:
            def change(doc: Doc | None) -> Doc | None:
                doc = doc or {"seq": 0, "timers": {}}
                for step in steps:
                    step(doc)
                return doc

            return change

        for vb, steps in per_vb.items():
            self._mutate(self._timer_key(function, vb), run(steps))

    def claim_timers(
        self,
        function: str,
        epochs: Mapping[int, int],
        now_ms: int,
        limit: int,
        *,
        reclaim: Iterable[int] = (),
    ) -> list[TimerRecord]:
        """As SqliteMetadataStore.claim_timers; each vBucket's document is claimed with its own CAS loop."""
        vbs = sorted(epochs)
        again = set(reclaim) & set(vbs)
        docs = self._docs.get_many([self._timer_key(function, vb) for vb in vbs])
        candidates: list[tuple[int, int, str]] = []
        for vb in vbs:
            got = docs.get(self._timer_key(function, vb))
            if got is None:
                continue
            for tid, t in got[0]["timers"].items():
                if t["fire_seq"] is None and t["due_ms"] <= now_ms:
                    candidates.append((t["due_ms"], vb, tid))
        candidates.sort()
        wanted: dict[int, set[str]] = defaultdict(set)
        for _, vb, tid in candidates[:limit]:
            wanted[vb].add(tid)
        if not wanted and not again:
            return []
        cps = self._docs.get_many([self._cp_key(function, vb) for vb in set(wanted) | again])
        out: list[TimerRecord] = []
        for vb in sorted(set(wanted) | again):
            cp = cps.get(self._cp_key(function, vb))
            if cp is None or not holds(cp[0]["epoch"], epochs[vb]):
                continue
            claimed: list[TimerRecord] = []

            def take(doc: Doc | None, vb: int = vb, claimed: list[TimerRecord] = claimed) -> Doc | None:
                claimed.clear()
                if doc is None:
                    return None
                if vb in again:
                    old = sorted((t for t in doc["timers"].values() if t["fire_seq"] is not None),
                                 key=lambda t: t["fire_seq"])
                    claimed.extend(_timer(function, vb, t) for t in old)
                fresh = sorted(
                    (t for tid, t in doc["timers"].items()
                     if tid in wanted.get(vb, ()) and t["fire_seq"] is None and t["due_ms"] <= now_ms),
                    key=lambda t: (t["due_ms"], t["callback"], t["reference"]),
                )
                for t in fresh:
                    doc["seq"] += 1
                    t["fire_seq"] = doc["seq"]
                    claimed.append(_timer(function, vb, t))
                return doc if fresh else None

            self._mutate(self._timer_key(function, vb), take)
            out.extend(claimed)
        return out

    def get_timer(self, function: str, callback: str, reference: str) -> TimerRecord | None:
        vb = vbucket_of(reference)
        got = self._docs.get(self._timer_key(function, vb))
        t = got[0]["timers"].get(_timer_id(callback, reference)) if got else None
        return None if t is None else _timer(function, vb, t)

    def timer_backlog(self, function: str, now_ms: int) -> dict[str, int]:
        docs = self._docs.get_many([self._timer_key(function, vb) for vb in range(NUM_VBUCKETS)])
        timers = [t for doc, _ in docs.values() for t in doc["timers"].values()]
        return {"pending": len(timers), "due": sum(1 for t in timers if t["due_ms"] <= now_ms)}

    def drop_timers(self, function: str) -> None:
        self._docs.remove_many([self._timer_key(function, vb) for vb in range(NUM_VBUCKETS)])

    def _refuse(self, function: str, vb: int, epoch: int, from_seqno: int, to_seqno: int, at: float) -> None:
        """Record a refused backwards move (for `eventing verify`) and raise OrderViolationError."""
        row = {"vb": vb, "epoch": epoch, "from_seqno": from_seqno, "to_seqno": to_seqno, "how": "refused", "at": at}
        self._mutate(self._key("cpreg", function), lambda doc: {"rows": [*(doc or {"rows": []})["rows"], row]})
        raise OrderViolationError(
            f"checkpoint of function '{function}' vBucket {vb} would move backwards from {from_seqno} to {to_seqno}"
        )

    def release(self, function: str, epochs: Mapping[int, int]) -> set[int]:
        """Give vBuckets up (lease cleared; owner and epoch kept) after a final commit; returns fenced ones."""
        fenced: set[int] = set()

        def give_up(vb: int, epoch: int) -> Callable[[Doc | None], Doc | None]:
            def change(doc: Doc | None) -> Doc | None:
                if doc is None or not holds(doc["epoch"], epoch):
                    fenced.add(vb)
                    return None
                return dict(doc, leased=False)

            return change

        self._mutate_many({self._cp_key(function, vb): give_up(vb, e) for vb, e in epochs.items()})
        return fenced

    # -- counters -------------------------------------------------------------------------------------

    def add_counters(self, function: str, counters: Mapping[str, int | float]) -> None:
        deltas = {k: v for k, v in counters.items() if v}
        if not deltas:
            return

        def change(doc: Doc | None) -> Doc:
            values = (doc or {"values": {}})["values"]
            for name, delta in deltas.items():
                values[name] = values.get(name, 0) + delta
            return {"values": values}

        self._mutate(self._key("ctr", function), change)

    def set_gauges(self, function: str, gauges: Mapping[str, float]) -> None:
        if gauges:
            self._mutate(
                self._key("ctr", function), lambda doc: {"values": {**(doc or {"values": {}})["values"], **gauges}}
            )

    def counters(self, function: str) -> dict[str, float]:
        got = self._get(self._key("ctr", function))
        return self._decode(self._key("ctr", function), lambda: dict(got[0]["values"])) if got else {}

    def reset_counters(self, function: str, *, keep_prefixes: tuple[str, ...] = ()) -> None:
        """Drop the function's counters (Couchbase's resetStatsCounters), but those whose name starts with
        one of `keep_prefixes`."""

        def change(doc: Doc | None) -> Doc | None:
            if doc is None:
                return None
            return {"values": {k: v for k, v in doc["values"].items() if k.startswith(keep_prefixes)}}

        self._mutate(self._key("ctr", function), change)

    # -- dead letters ---------------------------------------------------------------------------------

    def _dlq_key(self, function: str, vb: int, seqno: int) -> str:
        return self._key("dlq", function, vb, seqno)

    def _insert_dlq(self, rows: Sequence[DlqRow]) -> None:
        """Insert each dead letter once (a second insert of the same key is a no-op), then index it."""
        by_vb: dict[tuple[str, int], list[int]] = defaultdict(list)
        for r in rows:
            key = self._dlq_key(r.function, r.vb, r.seqno)
            if not self._docs.insert(key, _encode_dlq(r)):
                self._mutate(key, functools.partial(_revive_dlq, row=r))
            by_vb[(r.function, r.vb)].append(r.seqno)
        # Indexed after the rows: a crash in between is repaired when the batch is redone (the insert is
        # a no-op, the index entry is added then).
        for (function, vb), seqnos in by_vb.items():
            self._index_add(self._key("dlqix", function, vb), "seqnos", seqnos)

    def _dlq_positions(self, function: str, vb: int | None) -> list[tuple[int, int]]:
        vbs = range(2 * NUM_VBUCKETS) if vb is None else [vb]
        keys = {v: self._key("dlqix", function, v) for v in vbs}
        docs = self._get_many(list(keys.values()))
        return sorted((v, s) for v, key in keys.items() if key in docs for s in docs[key][0]["seqnos"])

    def dlq_rows(
        self, function: str, *, limit: int | None = None, include_replayed: bool = False
    ) -> list[DlqRow]:
        return self.find_dlq_rows(function, include_replayed=include_replayed, limit=limit)

    def dlq_row(self, function: str, vb: int, seqno: int) -> DlqRow | None:
        """The dead letter of (function, vBucket, seqno), replayed or not; None if there is none."""
        got = self._get(self._dlq_key(function, vb, seqno))
        return _decode_dlq(got[0]) if got else None

    def find_dlq_rows(
        self,
        function: str,
        *,
        vb: int | None = None,
        seqno: int | None = None,
        key: str | None = None,
        reason: str | None = None,
        include_replayed: bool = False,
        replayed_only: bool = False,
        limit: int | None = None,
    ) -> list[DlqRow]:
        """Dead letters matching every given filter, in (vBucket, seqno) order: per-document order."""
        positions = [(v, s) for v, s in self._dlq_positions(function, vb) if seqno is None or s == seqno]
        found: list[DlqRow] = []
        for i in range(0, len(positions), DLQ_FETCH_CHUNK):
            keys = [self._dlq_key(function, v, s) for v, s in positions[i : i + DLQ_FETCH_CHUNK]]
            docs = self._get_many(keys)
            for k in keys:
                if k not in docs:
                    continue  # removed after the index was read, or before its index entry was
                row = _decode_dlq(docs[k][0])
                if key is not None and row.key != key or reason is not None and row.reason != reason:
                    continue
                if replayed_only and row.replayed_at is None:
                    continue
                if not replayed_only and not include_replayed and row.replayed_at is not None:
                    continue
                found.append(row)
                if limit is not None and len(found) >= limit:
                    return found
        return found

    def mark_replayed(self, function: str, keys: Iterable[tuple[int, int]]) -> int:
        """Set replayed_at on the (vBucket, seqno) rows not yet replayed; returns how many changed."""
        now = time.time()

        def change(doc: Doc | None) -> Doc | None:
            if doc is None or doc["replayed_at"] is not None:
                return None
            return dict(doc, replayed_at=now)

        written = self._mutate_many({self._dlq_key(function, vb, s): change for vb, s in keys})
        return sum(1 for doc in written.values() if doc is not None)

    def record_replay_failure(
        self, function: str, vb: int, seqno: int, reason: str, error: str, traceback: str
    ) -> None:
        """A replay of the row failed again: attempts + 1, and the newest reason, error and traceback."""

        def change(doc: Doc | None) -> Doc | None:
            if doc is None or doc["replayed_at"] is not None:
                return None
            return dict(
                doc, reason=reason, error=error, traceback=traceback,
                attempts=doc["attempts"] + 1, last_failed_at=time.time(),
            )

        self._mutate(self._dlq_key(function, vb, seqno), change)

    def purge_dlq(
        self,
        function: str,
        reason: str | None = None,
        replayed_only: bool = False,
        *,
        keys: Iterable[tuple[int, int]] | None = None,
    ) -> int:
        """Delete dead letters (all of the function's, or those matching reason / replayed_only, or the
        given (vBucket, seqno) keys among them); returns how many rows were removed."""
        selected = None if keys is None else set(keys)
        rows = self.find_dlq_rows(function, reason=reason, include_replayed=True, replayed_only=replayed_only)
        removed: dict[int, list[int]] = defaultdict(list)
        for r in rows:
            if selected is not None and (r.vb, r.seqno) not in selected:
                continue
            if self._docs.remove(self._dlq_key(function, r.vb, r.seqno)):
                removed[r.vb].append(r.seqno)
        for vb, seqnos in removed.items():
            self._index_remove(self._key("dlqix", function, vb), "seqnos", seqnos)
        if reason is None and not replayed_only and selected is None:
            # Everything went: drop the index documents too (entries whose row vanished included).
            self._docs.remove_many([self._key("dlqix", function, vb) for vb in range(2 * NUM_VBUCKETS)])
        return sum(len(s) for s in removed.values())

    # -- services -------------------------------------------------------------------------------------

    def heartbeat(self, service_id: str, info: str) -> None:
        self._docs.upsert(
            self._key("svc", service_id), {"info": info, "heartbeat_at": time.time()}, expiry_s=SERVICE_TTL_S
        )
        index = self._get(self._key("services"))
        if index is None or service_id not in index[0]["ids"]:
            self._index_add(self._key("services"), "ids", [service_id])

    def remove_service(self, service_id: str) -> None:
        self._docs.remove(self._key("svc", service_id))
        self._index_remove(self._key("services"), "ids", [service_id])

    def live_services(self, max_age_s: float) -> list[str]:
        index = self._get(self._key("services"))
        ids = index[0]["ids"] if index else []
        docs = self._get_many([self._key("svc", i) for i in ids])
        since = time.time() - max_age_s
        return [i for i in ids if self._key("svc", i) in docs and docs[self._key("svc", i)][0]["heartbeat_at"] >= since]

    # -- leases ---------------------------------------------------------------------------------------

    def acquire_lease(
        self, name: str, holder: str, ttl_s: float, *, info: str = "", take_from: str | None = None
    ) -> Lease | None:
        """Take or renew lease `name` (see SqliteMetadataStore.acquire_lease): a CAS loop on its document,
        so of two racing takers the second re-reads the first's lease and declines."""
        taken: list[Lease | None] = [None]

        def change(doc: Doc | None) -> Doc | None:
            new = next_lease(_lease(name, doc) if doc else None, name, holder, ttl_s, info, take_from, time.time())
            taken[0] = new
            return None if new is None else _lease_doc(new)

        self._mutate(self._key("lease", name), change)
        return taken[0]

    def lease(self, name: str) -> Lease | None:
        got = self._docs.get(self._key("lease", name))
        return _lease(name, got[0]) if got else None

    def release_lease(self, name: str, holder: str) -> bool:
        released = [False]

        def change(doc: Doc | None) -> Doc | None:
            released[0] = doc is not None and doc["holder"] == holder and doc["expires_at"] > 0
            return {**doc, "expires_at": 0} if doc is not None and released[0] else None

        self._mutate(self._key("lease", name), change)
        return released[0]

    # -- eventing nodes -------------------------------------------------------------------------------

    def nodes(self) -> list[dict]:
        """Eventing nodes in the order they were added; state is active, joining or leaving."""
        got = self._get(self._key("nodes"))
        nodes = [dict(n, name=name) for name, n in (got[0]["nodes"] if got else {}).items()]
        return [
            {"name": n["name"], "state": n["state"], "ray_node_id": n["ray_node_id"], "added_at": n["added_at"]}
            for n in sorted(nodes, key=lambda n: (n["added_at"], n["name"]))
        ]

    def put_node(self, name: str, state: str, ray_node_id: str | None = None) -> None:
        def change(doc: Doc | None) -> Doc:
            nodes = (doc or {"nodes": {}})["nodes"]
            old = nodes.get(name)
            if old is None:
                nodes[name] = {"state": state, "ray_node_id": ray_node_id, "added_at": time.time()}
            else:
                old.update(state=state, ray_node_id=ray_node_id if ray_node_id is not None else old["ray_node_id"])
            return {"nodes": nodes}

        self._mutate(self._key("nodes"), change)

    def delete_node(self, name: str) -> None:
        def change(doc: Doc | None) -> Doc | None:
            if doc is None or name not in doc["nodes"]:
                return None
            del doc["nodes"][name]
            return doc

        self._mutate(self._key("nodes"), change)

    # -- small settings -------------------------------------------------------------------------------

    def get_kv(self, key: str) -> str | None:
        got = self._get(self._key("kv", key))
        return got[0]["value"] if got else None

    def set_kv(self, key: str, value: str) -> None:
        self._docs.upsert(self._key("kv", key), {"value": value})


def _lease(name: str, doc: Doc) -> Lease:
    return Lease(name, doc["holder"], doc["expires_at"], doc["acquired_at"], doc["term"], doc.get("info", ""))


def _lease_doc(lease: Lease) -> Doc:
    return {
        "holder": lease.holder, "expires_at": lease.expires_at, "acquired_at": lease.acquired_at,
        "term": lease.term, "info": lease.info,
    }


def _function(name: str, doc: Doc) -> FunctionRecord:
    return FunctionRecord(
        name, doc["definition"], doc["source"], FunctionState(doc["state"]), doc["generation"], doc["updated_at"],
        doc.get("deployed_by"),
    )


def _user(name: str, doc: Doc) -> UserRecord:
    return UserRecord(name, doc["hash"], tuple(doc["roles"]), doc["created_at"])


def _checkpoint(function: str, vb: int, doc: Doc) -> Checkpoint:
    return Checkpoint(
        function, vb, doc["seqno"], doc["epoch"], doc["owner"], doc["bucket_uuid"], doc["updated_at"],
        bool(doc["leased"]),
    )


def _encode_dlq(row: DlqRow) -> Doc:
    return {
        "function": row.function, "vb": row.vb, "seqno": row.seqno, "key": row.key, "reason": row.reason,
        "error": row.error, "traceback": row.traceback, "attempts": row.attempts,
        "first_failed_at": row.first_failed_at, "last_failed_at": row.last_failed_at,
        "mutation": base64.b64encode(row.mutation).decode("ascii"), "replayed_at": row.replayed_at,
        "generation": row.generation,
    }


def _revive_dlq(doc: Doc | None, row: DlqRow) -> Doc | None:
    """A mutation that fails again after its dead letter was replayed, or under a later deployment, gets the
    letter back (as SQLite's upsert does); an unreplayed letter of the same deployment stays as it is (a
    second insert after a crash is a no-op)."""
    if doc is None or (doc.get("replayed_at") is None and doc.get("generation", 0) >= row.generation):
        return None
    return dict(
        _encode_dlq(row),
        attempts=doc["attempts"] + row.attempts,
        first_failed_at=doc["first_failed_at"],
        replayed_at=None,
    )


def _decode_dlq(doc: Doc) -> DlqRow:
    return DlqRow(**dict(doc, mutation=base64.b64decode(doc["mutation"])))


if TYPE_CHECKING:

    def _implements_the_protocol(store: CouchbaseMetadataStore) -> MetadataStore:
        return store  # mypy checks every MetadataStore method is here with a compatible signature


def _timer_id(callback: str, reference: str) -> str:
    return f"{callback}\u0000{reference}"


def _timer(function: str, vb: int, t: Doc) -> TimerRecord:
    return TimerRecord(
        function, t["callback"], t["reference"], vb, t["due_ms"], t["context"], t["created_at"], t["fire_seq"]
    )
