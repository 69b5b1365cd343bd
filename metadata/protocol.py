"""The MetadataStore protocol: what the runtime needs from any metadata backend. ``WorkerMetadata`` is the
part a worker calls (the data service serves exactly these to workers without the store: its table
``eventing.storage.remote.META_CALLS``); ``MetadataStore`` is all of it."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from metadata.model import (
    Checkpoint,
    DlqRow,
    FunctionRecord,
    FunctionState,
    Lease,
    TimerChange,
    TimerDone,
    TimerRecord,
    UserRecord,
)


class WindowStateStore(Protocol):
    """The window coordinator's checkpoint: one JSON state per function, fenced. A coordinator `claim`s a
    function's state (bumping its fence); `commit` writes the state, the late rows' dead letters and
    counter increments only while the committer's fence is current, so two coordinators never both move
    it."""

    def claim(self, function: str) -> tuple[int, dict[str, Any] | None]: ...
    def commit(
        self,
        function: str,
        fence: int,
        state: Mapping[str, Any],
        dlq_rows: Iterable[DlqRow] = (),
        counters: Mapping[str, int | float] | None = None,
    ) -> bool: ...
    def load(self, function: str) -> dict[str, Any] | None: ...
    def reset(self, function: str) -> None: ...


class WorkerMetadata(Protocol):
    """What a worker asks of the metadata store for its own function: its record, ownership of vBuckets
    (claim, release), commits, timers, its dead letters, deaths on a mutation."""

    def get_function(self, name: str) -> FunctionRecord: ...
    def claim(
        self,
        function: str,
        vbuckets: Iterable[int],
        owner: str,
        *,
        min_epochs: Mapping[int, int] | None = None,
    ) -> dict[int, Checkpoint]: ...
    def commit(
        self,
        function: str,
        epochs: Mapping[int, int],
        seqnos: Mapping[int, int],
        dlq_rows: Iterable[DlqRow] = (),
        counters: Mapping[str, int] | None = None,
        timer_changes: Iterable[TimerChange] = (),
        timers_done: Iterable[TimerDone] = (),
    ) -> set[int]: ...
    def release(self, function: str, epochs: Mapping[int, int]) -> set[int]: ...
    def claim_timers(
        self,
        function: str,
        epochs: Mapping[int, int],
        now_ms: int,
        limit: int,
        *,
        reclaim: Iterable[int] = (),
    ) -> list[TimerRecord]: ...
    def get_timer(self, function: str, callback: str, reference: str) -> TimerRecord | None: ...
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
    ) -> list[DlqRow]: ...
    def count_death(self, function: str, vb: int, seqno: int) -> int:
        """One more death on the mutation (vb, seqno) (a timer's: TIMER_VB_BASE + vb, fire_seq); returns its
        deaths so far in this deployment."""
        ...

    def deaths(self, function: str) -> dict[tuple[int, int], int]: ...
    def close(self) -> None: ...


class MetadataStore(WorkerMetadata, Protocol):
    """Everything the runtime, ops and the APIs ask of a metadata backend (WorkerMetadata's calls too)."""

    # functions and lifecycle
    def put_function(self, name: str, definition: dict, source: str) -> FunctionRecord: ...
    def list_functions(self) -> list[FunctionRecord]: ...
    def delete_function(self, name: str) -> None: ...
    def transition(
        self, name: str, target: FunctionState, action: str, *, bump_generation: bool = False
    ) -> FunctionRecord: ...
    def set_deployed_by(self, name: str, deployed_by: dict | None) -> None: ...

    # users of the APIs (password hashes only) and their roles
    def put_user(self, name: str, password_hash: str, roles: Sequence[str]) -> UserRecord: ...
    def get_user(self, name: str) -> UserRecord: ...
    def list_users(self) -> list[UserRecord]: ...
    def delete_user(self, name: str) -> None: ...

    # checkpoints and ownership
    def init_checkpoints(
        self, function: str, positions: Mapping[int, int], bucket_uuid: str, epoch_base: int = 0
    ) -> None: ...
    def drop_checkpoints(self, function: str) -> None: ...
    def checkpoints(self, function: str) -> dict[int, Checkpoint]: ...
    def checkpoint_starts(self, function: str) -> dict[int, int]: ...
    def checkpoint_regressions(self, function: str, *, min_epoch: int = 0) -> list[dict]: ...
    def rewind_checkpoints(
        self, function: str, targets: Mapping[int, int], *, reapply_effects: bool = False
    ) -> dict[int, tuple[int, int]]:
        """Move a paused function's checkpoints back to `targets` ({vb: seqno}), so resuming handles the
        mutations after them again; returns {vb: (from, to)} of the vBuckets that moved.

        LifecycleError unless the function is paused. A vBucket at or below its target stays. Each move
        bumps the vBucket's epoch (an owner from before the pause is fenced), lowers the deployment's start
        to the target, and is recorded as a rewind (checkpoint_rewinds), never as a regression. Without
        reapply_effects a target below the start is refused (see metadata.model.plan_rewind); lowering the
        effect marks in the binding buckets is the caller's part (eventing.ops.rewind).
        """
        ...

    def checkpoint_rewinds(self, function: str, *, min_epoch: int = 0) -> list[dict]: ...

    # durable timers (partitioned by the vBucket of their reference, fenced by its epoch; claimed and read:
    # WorkerMetadata)
    def timer_backlog(self, function: str, now_ms: int) -> dict[str, int]: ...
    def drop_timers(self, function: str) -> None: ...

    # counters, dead letters, service liveness (deaths of a worker's process while its handler ran on one
    # mutation alone, count_death and deaths in WorkerMetadata, go with the deployment's checkpoints)
    def add_counters(self, function: str, counters: Mapping[str, int | float]) -> None: ...
    def set_gauges(self, function: str, gauges: Mapping[str, float]) -> None: ...
    def counters(self, function: str) -> dict[str, float]: ...
    def reset_counters(self, function: str, *, keep_prefixes: tuple[str, ...] = ()) -> None: ...
    def dlq_rows(
        self, function: str, *, limit: int | None = None, include_replayed: bool = False
    ) -> list[DlqRow]: ...
    def dlq_row(self, function: str, vb: int, seqno: int) -> DlqRow | None: ...
    def mark_replayed(self, function: str, keys: Iterable[tuple[int, int]]) -> int: ...
    def record_replay_failure(
        self, function: str, vb: int, seqno: int, reason: str, error: str, traceback: str
    ) -> None: ...
    def purge_dlq(
        self,
        function: str,
        reason: str | None = None,
        replayed_only: bool = False,
        *,
        keys: Iterable[tuple[int, int]] | None = None,
    ) -> int: ...
    def heartbeat(self, service_id: str, info: str) -> None: ...
    def remove_service(self, service_id: str) -> None: ...
    def live_services(self, max_age_s: float) -> list[str]: ...
    def verify_integrity(self) -> None: ...

    # leases (the service's leadership; a standby waits on it): taken with a compare-and-set
    def acquire_lease(
        self, name: str, holder: str, ttl_s: float, *, info: str = "", take_from: str | None = None
    ) -> Lease | None: ...
    def lease(self, name: str) -> Lease | None: ...
    def release_lease(self, name: str, holder: str) -> bool: ...

    # eventing nodes and small settings (node plan, rebalance requests)
    def nodes(self) -> list[dict]: ...
    def put_node(self, name: str, state: str, ray_node_id: str | None = None) -> None: ...
    def delete_node(self, name: str) -> None: ...
    def get_kv(self, key: str) -> str | None: ...
    def set_kv(self, key: str, value: str) -> None: ...
    def backup(self, target: str | os.PathLike[str]) -> None:
        """A consistent copy of the store in the file `target`, safe while other processes use the store
        (SQLite's online backup); a backend backed up by its own tools raises StoreError naming them."""
        ...

    def window_states(self) -> WindowStateStore: ...

    def __enter__(self) -> MetadataStore: ...

    def __exit__(self, *exc: object) -> None: ...
