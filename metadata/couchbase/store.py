"""CouchbaseMetadataStore: the MetadataStore protocol over Couchbase documents (layout and guarantees in
the package docstring, metadata/couchbase/__init__.py). It answers functions, checkpoints and ownership,
commits and counters itself, and hands the rest to its collaborators, each made with the store's shared
document access (cas.py, CasDocuments): the dead letters (dlq.py, DeadLetters), the durable timers
(timers.py, Timers), the users of the APIs (users.py, Users) and the cluster's records (cluster.py,
ClusterRecords: services, leases, nodes, settings)."""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Self

from metadata.couchbase.adapter import SdkDocuments
from metadata.couchbase.cas import MAX_CAS_ATTEMPTS, CasDocuments
from metadata.couchbase.cluster import ClusterRecords
from metadata.couchbase.dlq import DeadLetters
from metadata.couchbase.documents import Doc, Documents
from metadata.couchbase.timers import Timers
from metadata.couchbase.users import Users
from metadata.errors import (
    ConfigError,
    FencedError,
    LifecycleError,
    NotFoundError,
    OrderViolationError,
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
    owner_vb,
    plan_rewind,
)
from sharding import NUM_VBUCKETS

if TYPE_CHECKING:
    from metadata.couchbase.window_state import CouchbaseWindowStateStore
    from metadata.protocol import MetadataStore


class CouchbaseMetadataStore:
    """MetadataStore on a Couchbase bucket (see metadata/couchbase/__init__.py for the layout and the
    guarantees).

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
        self.docs = CasDocuments(documents, prefix)
        self.prefix = prefix
        self.where = documents.where
        self.dead_letters = DeadLetters(self.docs)
        self.timers = Timers(self.docs)
        self.users = Users(self.docs)
        self.cluster = ClusterRecords(self.docs)

    def window_states(self) -> CouchbaseWindowStateStore:
        """The window coordinators' fenced state, one document per function (no cross-document transaction
        here: dead letters (insert-once) go first, then the state under its fence (CAS), then counters; a
        crash in between redoes the batch, and only counters can lag)."""
        from metadata.couchbase.window_state import CouchbaseWindowStateStore

        return CouchbaseWindowStateStore(self.docs, self.dead_letters, self.add_counters)

    def close(self) -> None:
        self.docs.raw.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def backup(self, target: str | os.PathLike[str]) -> None:
        """Not done here: Couchbase backs its buckets up with its own tools."""
        raise StoreError(
            f"the metadata store is in Couchbase ({self.where}); back it up with Couchbase's own tools, "
            f"e.g. `cbbackupmgr backup` of that bucket (documents under '{self.prefix}::'), not `eventing "
            "backup`"
        )

    def verify_integrity(self) -> None:
        """Read every function's documents (index, definition, checkpoints, counters) and check their shape:
        a document that is not a JSON object, or lacks the fields the store writes, raises StoreCorruptError
        naming it (the runtime must stop at its last checkpoint, never skip ahead of a damaged one)."""
        got = self.docs.get(self.docs.key("functions"))
        if got is not None and not (
            isinstance(got[0].get("names"), list) and all(isinstance(n, str) for n in got[0]["names"])
        ):
            raise self.docs.corrupt(self.docs.key("functions"), "is not a function index")
        for record in self.list_functions():
            self.checkpoints(record.name)
            self.counters(record.name)

    # -- functions ----------------------------------------------------------------------------------

    def put_function(self, name: str, definition: dict, source: str) -> FunctionRecord:
        """Create a function (undeployed) or update the definition of an undeployed or paused one."""
        # Index first: a crash before the document is written leaves a name that listing skips.
        self.docs.index_add(self.docs.key("functions"), "names", [name])

        def change(doc: Doc | None) -> Doc:
            now = time.time()
            if doc is None:
                state = FunctionState.UNDEPLOYED.value
                return {
                    "definition": definition,
                    "source": source,
                    "state": state,
                    "generation": 0,
                    "updated_at": now,
                }
            if doc["state"] not in (FunctionState.UNDEPLOYED.value, FunctionState.PAUSED.value):
                raise LifecycleError(
                    f"cannot update function '{name}': it is {doc['state']}; pause or undeploy it first"
                )
            return dict(doc, definition=definition, source=source, updated_at=now)

        written = self.docs.mutate(self.docs.key("fn", name), change)
        assert written is not None
        return _function(name, written)

    def get_function(self, name: str) -> FunctionRecord:
        got = self.docs.get(self.docs.key("fn", name))
        if got is None:
            known = ", ".join(r.name for r in self.list_functions()) or "none"
            raise NotFoundError(f"unknown function '{name}' (known: {known}); see `eventing list`")
        return self.docs.decode(self.docs.key("fn", name), _function, name, got[0])

    def list_functions(self) -> list[FunctionRecord]:
        index = self.docs.get(self.docs.key("functions"))
        names = index[0]["names"] if index else []
        docs = self.docs.get_many([self.docs.key("fn", n) for n in names])
        return [
            self.docs.decode(self.docs.key("fn", n), _function, n, docs[self.docs.key("fn", n)][0])
            for n in sorted(names)
            if self.docs.key("fn", n) in docs
        ]

    def delete_function(self, name: str) -> None:
        key = self.docs.key("fn", name)
        for _ in range(MAX_CAS_ATTEMPTS):
            got = self.docs.get(key)
            if got is None:
                raise NotFoundError(f"unknown function '{name}'; see `eventing list`")
            if got[0]["state"] != FunctionState.UNDEPLOYED.value:
                raise LifecycleError(
                    f"cannot delete function '{name}': it is {got[0]['state']}; undeploy it first"
                )
            if self.docs.raw.remove(key, got[1]):  # only if nobody deployed it since the check
                break
        else:
            raise StoreError(
                f"metadata store {self.where}: function '{name}' kept changing while being deleted"
            )
        self.drop_checkpoints(name)
        self.drop_timers(name)
        self.purge_dlq(name)
        self.docs.raw.remove_many(
            [self.docs.key("ctr", name), self.docs.key("cpreg", name), self.docs.key("win", name)]
        )
        self.docs.index_remove(self.docs.key("functions"), "names", [name])

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

        written = self.docs.mutate(self.docs.key("fn", name), change)
        assert written is not None
        return _function(name, written)

    def set_deployed_by(self, name: str, deployed_by: dict | None) -> None:
        """Record who deploys or resumes a function over the API (None: the local CLI, trusted as an
        admin)."""

        def change(doc: Doc | None) -> Doc:
            if doc is None:
                raise NotFoundError(f"unknown function '{name}'; see `eventing list`")
            return dict(doc, deployed_by=deployed_by)

        self.docs.mutate(self.docs.key("fn", name), change)

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
            raise ConfigError(
                f"vBuckets {bad[:5]} of function '{function}' are outside 0..{NUM_VBUCKETS - 1}"
            )
        now = time.time()
        keys = self.docs.cp_keys(function)
        self.docs.raw.upsert_many(
            {
                keys[vb]: {
                    "seqno": seqno,
                    "epoch": epoch_base,
                    "owner": None,
                    "bucket_uuid": bucket_uuid,
                    "updated_at": now,
                    "leased": False,
                    "start": seqno,
                }
                for vb, seqno in positions.items()
            }
        )
        dropped = [key for vb, key in keys.items() if vb not in positions]
        self.docs.raw.remove_many(
            [*dropped, self.docs.key("deaths", function)]
        )  # the last deployment's deaths

    def drop_checkpoints(self, function: str) -> None:
        self.docs.raw.remove_many([*self.docs.cp_keys(function).values(), self.docs.key("deaths", function)])

    def checkpoints(self, function: str) -> dict[int, Checkpoint]:
        keys = self.docs.cp_keys(function)
        docs = self.docs.get_many(list(keys.values()))
        return {
            vb: self.docs.decode(key, _checkpoint, function, vb, docs[key][0])
            for vb, key in keys.items()
            if key in docs
        }

    def checkpoint_starts(self, function: str) -> dict[int, int]:
        """Per vBucket, the seqno the current deployment started after (its feed boundary)."""
        keys = self.docs.cp_keys(function)
        docs = self.docs.get_many(list(keys.values()))
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
        got = self.docs.get(self.docs.key("cpreg", function))
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
        keys = {vb: self.docs.cp_key(function, vb) for vb in targets}
        docs = self.docs.get_many(list(keys.values()))
        current = {
            vb: (docs[k][0]["seqno"], docs[k][0]["epoch"], docs[k][0].get("start"))
            for vb, k in keys.items()
            if k in docs
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
                    doc,
                    seqno=to,
                    epoch=epoch + 1,
                    leased=False,
                    updated_at=now,
                    start=to if start is None else min(start, to),
                )

            return change

        self.docs.mutate_many({keys[vb]: rewind(vb, current[vb][1], to) for vb, (_, to) in moves.items()})
        how = REWIND_REAPPLY if reapply_effects else REWIND
        done = {vb: m for vb, m in moves.items() if vb not in raced}
        rows = [
            {"vb": vb, "epoch": current[vb][1] + 1, "from_seqno": f, "to_seqno": t, "how": how, "at": now}
            for vb, (f, t) in done.items()
        ]
        if rows:
            self.docs.mutate(
                self.docs.key("cpreg", function),
                lambda doc: {"rows": [*(doc or {"rows": []})["rows"], *rows]},
            )
        if raced:
            raise LifecycleError(
                f"function '{function}' was resumed while its checkpoints were being rewound: {len(done)} "
                f"vBuckets moved back, {len(raced)} (e.g. {sorted(raced)[:3]}) were claimed by a worker "
                "first; pause it and rewind again"
            )
        return moves

    def claim(
        self,
        function: str,
        vbuckets: Iterable[int],
        owner: str,
        *,
        min_epochs: Mapping[int, int] | None = None,
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
                return dict(
                    doc,
                    epoch=next_epoch(doc["epoch"], floor.get(vb, 0)),
                    owner=owner,
                    leased=True,
                    updated_at=now,
                )

            return change

        written = self.docs.mutate_many({self.docs.cp_key(function, vb): take(vb) for vb in vbs})
        claimed = {vb: written[self.docs.cp_key(function, vb)] for vb in vbs}
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
            set(epochs)
            | set(seqnos)
            | {owner_vb(r.vb) for r in dlq}
            | {c.source_vb for c in timer_list}
            | {d.vb for d in done}
        )
        keys = {vb: self.docs.cp_key(function, vb) for vb in vbs}
        current = self.docs.get_many(list(keys.values()))
        fenced = fenced_vbuckets(
            vbs, {vb: current[k][0]["epoch"] for vb, k in keys.items() if k in current}, epochs
        )
        for vb, seqno in seqnos.items():
            if vb not in fenced and seqno < current[keys[vb]][0]["seqno"]:
                self._refuse(function, vb, epochs[vb], current[keys[vb]][0]["seqno"], seqno, now)

        # 1. Dead letters first: a checkpoint never passes a mutation whose dead letter is not stored.
        #    A vBucket claimed by a new owner after the read above can still receive this batch's dead
        #    letters; they are keyed by (function, vBucket, seqno), the same documents the new owner writes.
        self.dead_letters.insert([r for r in dlq if owner_vb(r.vb) not in fenced])
        # Timers next (idempotent: a replay writes the same creates, a done matches its fire_seq once).
        self.timers.write(function, timer_list, done, fenced, now)

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
        for key in self.docs.raw.replace_many(
            {k: (d, cas) for k, (d, cas) in batch.items() if d is not None}
        ):
            self.docs.mutate(key, changes[key])

        # 3. Counters last; they are statistics, not positions.
        rejected = sum(1 for vb in seqnos if vb in fenced)
        self.add_counters(function, dict(counters or {}, fenced_checkpoint_writes=rejected))
        return fenced

    def _refuse(self, function: str, vb: int, epoch: int, from_seqno: int, to_seqno: int, at: float) -> None:
        """Record a refused backwards move (for `eventing verify`) and raise OrderViolationError."""
        row = {
            "vb": vb,
            "epoch": epoch,
            "from_seqno": from_seqno,
            "to_seqno": to_seqno,
            "how": "refused",
            "at": at,
        }
        self.docs.mutate(
            self.docs.key("cpreg", function), lambda doc: {"rows": [*(doc or {"rows": []})["rows"], row]}
        )
        raise OrderViolationError(
            f"checkpoint of function '{function}' vBucket {vb} would move backwards from {from_seqno} to "
            f"{to_seqno}"
        )

    def release(self, function: str, epochs: Mapping[int, int]) -> set[int]:
        """Give vBuckets up (lease cleared; owner and epoch kept) after a final commit; returns fenced
        ones."""
        fenced: set[int] = set()

        def give_up(vb: int, epoch: int) -> Callable[[Doc | None], Doc | None]:
            def change(doc: Doc | None) -> Doc | None:
                if doc is None or not holds(doc["epoch"], epoch):
                    fenced.add(vb)
                    return None
                return dict(doc, leased=False)

            return change

        self.docs.mutate_many({self.docs.cp_key(function, vb): give_up(vb, e) for vb, e in epochs.items()})
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

        self.docs.mutate(self.docs.key("ctr", function), change)

    def set_gauges(self, function: str, gauges: Mapping[str, float]) -> None:
        if gauges:
            self.docs.mutate(
                self.docs.key("ctr", function),
                lambda doc: {"values": {**(doc or {"values": {}})["values"], **gauges}},
            )

    def counters(self, function: str) -> dict[str, float]:
        got = self.docs.get(self.docs.key("ctr", function))
        return self.docs.decode(self.docs.key("ctr", function), lambda: dict(got[0]["values"])) if got else {}

    def reset_counters(self, function: str, *, keep_prefixes: tuple[str, ...] = ()) -> None:
        """Drop the function's counters (Couchbase's resetStatsCounters), but those whose name starts with
        one of `keep_prefixes`."""

        def change(doc: Doc | None) -> Doc | None:
            if doc is None:
                return None
            return {"values": {k: v for k, v in doc["values"].items() if k.startswith(keep_prefixes)}}

        self.docs.mutate(self.docs.key("ctr", function), change)

    # -- dead letters and deaths (DeadLetters) ----------------------------------------------------------

    def dlq_rows(
        self, function: str, *, limit: int | None = None, include_replayed: bool = False
    ) -> list[DlqRow]:
        return self.dead_letters.dlq_rows(function, limit=limit, include_replayed=include_replayed)

    def dlq_row(self, function: str, vb: int, seqno: int) -> DlqRow | None:
        return self.dead_letters.dlq_row(function, vb, seqno)

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
        generation: int | None = None,
        limit: int | None = None,
    ) -> list[DlqRow]:
        return self.dead_letters.find_dlq_rows(
            function,
            vb=vb,
            seqno=seqno,
            key=key,
            reason=reason,
            include_replayed=include_replayed,
            replayed_only=replayed_only,
            generation=generation,
            limit=limit,
        )

    def mark_replayed(self, function: str, keys: Iterable[tuple[int, int]]) -> int:
        return self.dead_letters.mark_replayed(function, keys)

    def record_replay_failure(
        self, function: str, vb: int, seqno: int, reason: str, error: str, traceback: str
    ) -> None:
        self.dead_letters.record_replay_failure(function, vb, seqno, reason, error, traceback)

    def purge_dlq(
        self,
        function: str,
        reason: str | None = None,
        replayed_only: bool = False,
        *,
        keys: Iterable[tuple[int, int]] | None = None,
    ) -> int:
        return self.dead_letters.purge_dlq(function, reason, replayed_only, keys=keys)

    def count_death(self, function: str, vb: int, seqno: int) -> int:
        return self.dead_letters.count_death(function, vb, seqno)

    def deaths(self, function: str) -> dict[tuple[int, int], int]:
        return self.dead_letters.deaths(function)

    # -- durable timers (Timers) ------------------------------------------------------------------------

    def claim_timers(
        self,
        function: str,
        epochs: Mapping[int, int],
        now_ms: int,
        limit: int,
        *,
        reclaim: Iterable[int] = (),
    ) -> list[TimerRecord]:
        return self.timers.claim_timers(function, epochs, now_ms, limit, reclaim=reclaim)

    def get_timer(self, function: str, callback: str, reference: str) -> TimerRecord | None:
        return self.timers.get_timer(function, callback, reference)

    def timer_backlog(self, function: str, now_ms: int) -> dict[str, int]:
        return self.timers.timer_backlog(function, now_ms)

    def drop_timers(self, function: str) -> None:
        self.timers.drop_timers(function)

    # -- users of the APIs (Users) ----------------------------------------------------------------------

    def put_user(self, name: str, password_hash: str, roles: Sequence[str]) -> UserRecord:
        return self.users.put_user(name, password_hash, roles)

    def get_user(self, name: str) -> UserRecord:
        return self.users.get_user(name)

    def list_users(self) -> list[UserRecord]:
        return self.users.list_users()

    def delete_user(self, name: str) -> None:
        self.users.delete_user(name)

    # -- services, leases, nodes and settings (ClusterRecords) ------------------------------------------

    def heartbeat(self, service_id: str, info: str) -> None:
        self.cluster.heartbeat(service_id, info)

    def remove_service(self, service_id: str) -> None:
        self.cluster.remove_service(service_id)

    def live_services(self, max_age_s: float) -> list[str]:
        return self.cluster.live_services(max_age_s)

    def acquire_lease(
        self, name: str, holder: str, ttl_s: float, *, info: str = "", take_from: str | None = None
    ) -> Lease | None:
        return self.cluster.acquire_lease(name, holder, ttl_s, info=info, take_from=take_from)

    def lease(self, name: str) -> Lease | None:
        return self.cluster.lease(name)

    def release_lease(self, name: str, holder: str) -> bool:
        return self.cluster.release_lease(name, holder)

    def nodes(self) -> list[dict]:
        return self.cluster.nodes()

    def put_node(self, name: str, state: str, ray_node_id: str | None = None) -> None:
        self.cluster.put_node(name, state, ray_node_id)

    def delete_node(self, name: str) -> None:
        self.cluster.delete_node(name)

    def get_kv(self, key: str) -> str | None:
        return self.cluster.get_kv(key)

    def set_kv(self, key: str, value: str) -> None:
        self.cluster.set_kv(key, value)


def _function(name: str, doc: Doc) -> FunctionRecord:
    return FunctionRecord(
        name,
        doc["definition"],
        doc["source"],
        FunctionState(doc["state"]),
        doc["generation"],
        doc["updated_at"],
        doc.get("deployed_by"),
    )


def _checkpoint(function: str, vb: int, doc: Doc) -> Checkpoint:
    return Checkpoint(
        function,
        vb,
        doc["seqno"],
        doc["epoch"],
        doc["owner"],
        doc["bucket_uuid"],
        doc["updated_at"],
        bool(doc["leased"]),
    )


if TYPE_CHECKING:

    def _implements_the_protocol(store: CouchbaseMetadataStore) -> MetadataStore:
        return store  # mypy checks every MetadataStore method is here with a compatible signature
