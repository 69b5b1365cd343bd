"""Values kept in the metadata store: function states and their transition table, checkpoints, DLQ rows."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from metadata.errors import ConfigError, LifecycleError, fix


class FunctionState(StrEnum):
    UNDEPLOYED = "undeployed"  # stored; no workers, no checkpoints
    DEPLOYING = "deploying"  # checkpoints being initialised from the feed boundary
    DEPLOYED = "deployed"  # the service runs it
    PAUSING = "pausing"  # the service is checkpointing and stopping its workers
    PAUSED = "paused"  # stopped with checkpoints kept; resume continues right after them
    UNDEPLOYING = "undeploying"  # the service is stopping its workers; checkpoints are then dropped


TRANSITIONS: dict[FunctionState, frozenset[FunctionState]] = {
    FunctionState.UNDEPLOYED: frozenset({FunctionState.DEPLOYING}),
    FunctionState.DEPLOYING: frozenset({FunctionState.DEPLOYED, FunctionState.UNDEPLOYED}),
    FunctionState.DEPLOYED: frozenset({FunctionState.PAUSING, FunctionState.UNDEPLOYING}),
    FunctionState.PAUSING: frozenset({FunctionState.PAUSED}),
    FunctionState.PAUSED: frozenset({FunctionState.DEPLOYED, FunctionState.UNDEPLOYING}),
    FunctionState.UNDEPLOYING: frozenset({FunctionState.UNDEPLOYED}),
}

# What a user should do instead, per (current state, attempted action).
_HINTS = {
    "deploy": "undeploy it first, or use `eventing resume` if it is paused",
    "pause": "only a deployed function can be paused",
    "resume": "only a paused function can be resumed; deploy it if it is undeployed",
    "undeploy": "only a deployed or paused function can be undeployed",
    "delete": "undeploy it first",
    "update": "pause or undeploy it first, then update the handler",
}


def check_transition(name: str, current: FunctionState, target: FunctionState, action: str) -> None:
    """Raise LifecycleError unless `current -> target` is in the transition table."""
    if target not in TRANSITIONS[current]:
        hint = _HINTS.get(action, "")
        raise LifecycleError(f"cannot {action} function '{name}': it is {current.value}; {hint}".rstrip("; "))


@dataclass(frozen=True)
class FunctionRecord:
    name: str
    definition: dict
    source: str
    state: FunctionState
    generation: int  # bumped on every deploy, so a running service notices a redeploy
    updated_at: float
    # Who last deployed or resumed it over the API: {"user": name, "admin": bool, "at": time}, or saved it
    # as a non-admin ("saved": true); None when only the local CLI (trusted as an admin) did. Handlers of a
    # non-admin run sandboxed.
    deployed_by: dict | None = None


@dataclass(frozen=True)
class UserRecord:
    """A user of the REST and Data APIs: a salted scrypt hash (never the password) and Couchbase-style
    roles."""

    name: str
    password_hash: str  # "scrypt$n$r$p$salt$hash" (eventing.security.users.hash_password)
    roles: tuple[str, ...]  # e.g. ("data_writer[shop.sales.*]", "eventing_manage_functions[shop:sales]")
    created_at: float


@dataclass(frozen=True)
class Checkpoint:
    function: str
    vb: int
    seqno: int  # last seqno whose effects are durable; processing resumes at seqno + 1
    epoch: int  # ownership epoch: a write with a lower epoch is from a zombie and is rejected
    owner: str | None  # "node/worker" of the last owner
    bucket_uuid: str  # identity of the source bucket; a recreated bucket is never resumed
    updated_at: float
    leased: bool = False  # True while the owner holds it; False once released


@dataclass(frozen=True)
class DlqRow:
    function: str
    vb: int
    seqno: int
    key: str
    reason: str  # error | timeout | undecodable | oversize | late | ...
    error: str
    traceback: str
    attempts: int
    first_failed_at: float
    last_failed_at: float
    mutation: bytes  # the mutation itself, msgpack-encoded (see eventing.core.mutation)
    replayed_at: float | None = None
    # The deployment (function generation) whose worker last dead-lettered it. A worker skips a `timeout`
    # letter of its own deployment (its process hung on that mutation and was recycled); a later deployment
    # handles the mutation afresh.
    generation: int = 0


# How a deliberate rewind of a checkpoint is recorded (next to the regressions `eventing verify` reports,
# but never counted as one): effect marks kept, or lowered so the rewound range's effects apply again.
REWIND = "rewind"
REWIND_REAPPLY = "rewind-reapply"


def check_rewind_allowed(name: str, state: FunctionState) -> None:
    if state is not FunctionState.PAUSED:
        raise LifecycleError(
            f"cannot rewind function '{name}': it is {state.value}; only a paused function can be rewound "
            "({fix} first)",
            fix=fix("pause", function=name),
        )


def plan_rewind(
    name: str,
    current: Mapping[int, tuple[int, int, int | None]],
    targets: Mapping[int, int],
    reapply_effects: bool,
) -> dict[int, tuple[int, int]]:
    """The (from, to) seqno per vBucket a rewind moves, from current = {vb: (seqno, epoch, start)}.

    A vBucket whose checkpoint is at or below its target stays (a rewind never moves one forward). With the
    effect marks kept, a target below the deployment's start (its feed boundary) is refused: the mutations
    between them were never handled, and the marks (a high-water mark per vBucket) would skip their effects.
    """
    unknown = sorted(set(targets) - set(current))
    if unknown:
        raise ConfigError(
            f"function '{name}' has no checkpoint for vBuckets {unknown[:5]}; vBuckets are 0..1023"
        )
    moves: dict[int, tuple[int, int]] = {}
    for vb, target in sorted(targets.items()):
        if target < 0:
            raise ConfigError(
                f"cannot rewind vBucket {vb} of function '{name}' to seqno {target}; seqnos start at 0"
            )
        seqno, _epoch, start = current[vb]
        if target >= seqno:
            continue
        if not reapply_effects and start is not None and target < start:
            raise ConfigError(
                f"cannot rewind vBucket {vb} of function '{name}' to seqno {target}: its deployment started "
                f"after seqno {start} (boundary from_now), and with the effect marks kept the effects of the "
                f"mutations in between, never handled, would be skipped; rewind to {start} or later, or pass "
                "--reapply-effects"
            )
        moves[vb] = (seqno, target)
    return moves


@dataclass(frozen=True)
class Lease:
    """A named lease (the service's leadership): who holds it and until when (wall-clock epoch seconds).

    `term` grows by one each time the lease changes hands, so a holder can tell its own tenure from a later
    one of the same name. Holders renew well before `expires_at`; anyone may take an expired lease.
    """

    name: str
    holder: str
    expires_at: float
    acquired_at: float  # when this holder took it (kept across renewals)
    term: int
    info: str = ""  # the holder's description (pid, host, executor), JSON by convention

    def expired(self, now: float) -> bool:
        return self.expires_at <= now


def next_lease(
    current: Lease | None, name: str, holder: str, ttl_s: float, info: str, take_from: str | None, now: float
) -> Lease | None:
    """The lease after `holder` asks for it at `now`, or None if it stays with someone else (both
    backends)."""
    if current is not None and current.holder == holder and current.expires_at > 0:
        return Lease(name, holder, now + ttl_s, current.acquired_at, current.term, info)  # a renewal
    if current is not None and not current.expired(now) and current.holder != take_from:
        return None
    return Lease(name, holder, now + ttl_s, now, (current.term if current else 0) + 1, info)


# Timers get a seqno space of their own next to each vBucket's mutations: their effects and dead letters
# are keyed by (TIMER_VB_BASE + vb, fire_seq), fenced by the epoch of vb.
TIMER_VB_BASE = 1024
# The setting (MetadataStore.get_kv) a store keeps from its first user on, deleted users or not: a server
# whose store had users never takes a caller without credentials for the local CLI (eventing.http.auth).
USERS_MARK = "users_created"


def owner_vb(vb: int) -> int:
    """The vBucket whose epoch fences an effect or dead letter keyed by `vb` (a timer's or a mutation's)."""
    return vb - TIMER_VB_BASE if vb >= TIMER_VB_BASE else vb


@dataclass(frozen=True)
class TimerRecord:
    """A durable timer of a function, identified by (callback, reference) and stored in the partition of
    its reference's vBucket, whose owner fires it."""

    function: str
    callback: str  # name of a function of the handler module, called with the context
    reference: str
    vb: int  # vbucket_of(reference): the owner of this vBucket fires it
    due_ms: int  # fires at or after this time (epoch milliseconds)
    context: str  # JSON text
    created_at: float
    fire_seq: int | None = None  # set when the owner claimed it for firing; stable across a crash


@dataclass(frozen=True)
class TimerChange:
    """A create (due_ms set) or a cancel (due_ms None) made by a handler call, durable with the commit
    that moves the checkpoint of `source_vb` (whose epoch fences it)."""

    source_vb: int
    callback: str
    reference: str
    vb: int
    due_ms: int | None
    context: str = "null"


@dataclass(frozen=True)
class TimerDone:
    """A fired timer (its callback returned or was dead-lettered): removed if it still holds `fire_seq`
    (a create of the same (callback, reference) since the claim is a new timer and stays)."""

    vb: int
    callback: str
    reference: str
    fire_seq: int
