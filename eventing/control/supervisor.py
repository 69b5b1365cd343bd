"""Runs one deployed function: starts its workers per the vBucket assignment, keeps them stepping with
bounded credits, restarts dead workers from their checkpoints, hands vBuckets over live on rebalance,
and stops them cleanly (checkpoint, release)."""

from __future__ import annotations

import logging
import socket
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from eventing.core.definition import FunctionDefinition
from eventing.errors import EventingError, FencedError
from eventing.storage.state import State
from eventing.workers import write_waiter
from eventing.workers.executor import Executor, WorkerDied
from eventing.workers.sandbox.default import isolation_of
from eventing.workers.worker import StepReport, WorkerSpec
from metadata import FunctionRecord
from sharding.rebalance import FunctionAssignment, assign_function, function_moves

log = logging.getLogger("eventing.control.supervisor")

# Outstanding step calls per worker. Two hide the ~0.7 ms Ray round trip; the bound on work in flight
# is workers x CREDITS x batch_size mutations (credit-based flow control, as in Flink).
CREDITS = 2
IDLE_POLL_S = 0.05  # a caught-up worker is asked again after this long (sooner when a write wakes it)
# While a worker could be woken by a write (caught up, nothing in flight) and others have steps in flight,
# the wait for those steps ends this soon, so the woken worker's step is not held up behind a long one.
WAKE_WAIT_S = 0.005
RESTART_BACKOFF_S = (0.2, 1.0, 2.0, 5.0)


@dataclass
class WorkerSlot:
    spec: WorkerSpec
    node: str
    handle: Any = None
    starting: Any = None  # future of the "start" call
    inflight: list[Any] = field(default_factory=list)
    ready: bool = False
    caught_up: bool = False
    backlog: int = 0
    restarts: int = 0
    next_step_at: float = 0.0
    started_at: float = 0.0
    pid: int | None = None  # the worker's process, once started
    respawn_at: float | None = None  # a dead worker is started again at this time
    leaving: bool = False  # on a departing node: stopped once its vBuckets are handed over
    failed: bool = False  # on a node that was failed over: never called or started again
    # A write to an owned vBucket was notified since the last step was sent: a step that then comes back
    # having handled nothing may have looked before that write, so the worker is stepped again at once.
    woken: bool = False
    wakes: int = 0  # notifications that stepped this worker


@dataclass
class Handoff:
    """One live rebalance of this function: vBuckets leave old workers, then are claimed by new ones."""

    target: FunctionAssignment
    started_at: float
    outgoing: dict[str, list[int]]  # old worker -> vBuckets it must release
    incoming: dict[str, list[int]]  # new worker -> vBuckets it will claim
    released_at: dict[int, float] = field(default_factory=dict)
    claimed_at: dict[int, float] = field(default_factory=dict)
    waiting: dict[str, list[int]] = field(
        default_factory=lambda: defaultdict(list)
    )  # released, not yet claimed
    calls: dict[Any, tuple[str, str, list[int]]] = field(
        default_factory=dict
    )  # future -> (kind, worker, vbs)
    revokes_issued: bool = False
    released_from: float = 0.0  # when the first revoke was sent (new workers were up by then)
    finished_at: float | None = None

    @property
    def moves(self) -> int:
        return sum(len(v) for v in self.incoming.values())

    def longest_unowned_s(self) -> float:
        gaps = [self.claimed_at[vb] - t for vb, t in self.released_at.items() if vb in self.claimed_at]
        return max(gaps, default=0.0)


class FunctionSupervisor:
    def __init__(
        self,
        state: State,
        record: FunctionRecord,
        executor: Executor,
        assignment: FunctionAssignment,
        *,
        until_caught_up: bool = False,
        placements: dict[str, str | None] | None = None,
        warm: dict[tuple[str, str, str | None], Any] | None = None,
    ):
        self.state = state
        self.record = record
        self.name = record.name
        self.defn = FunctionDefinition.from_dict(record.definition)
        self.executor = executor
        self.until_caught_up = until_caught_up
        self.placements = placements or {}
        # Workers started ahead of time by a standby service, by (function, worker id, Ray node id): taken
        # instead of starting new actors, which costs seconds.
        self.warm = warm if warm is not None else {}
        targets = None
        if until_caught_up:
            source = state.open_bucket(self.defn.source_bucket)
            targets = tuple(source.high_seqnos())
            source.close()
        self.targets = targets
        self.assignment = assignment
        self.slots: dict[str, WorkerSlot] = {}
        for worker in assignment.workers():
            self._add_slot(str(worker), worker.node, assignment.vbuckets_of(worker))
        self.handled = 0
        self.first_handled_at = (
            0.0  # epoch s: the earliest first handled batch of its workers (start-up figure)
        )
        self.error: EventingError | None = None
        self.started_at = time.monotonic()
        self.handoff: Handoff | None = None
        self.last_handoff: Handoff | None = None
        # Fault-injection points for tests: called with (worker id, vBuckets) right after a release or claim.
        self.after_release: Callable[[str, list[int]], None] | None = None
        self.after_claim: Callable[[str, list[int]], None] | None = None
        self._future_owner: dict[Any, str] = {}
        self.waking = False  # the service listens for write notifications (wake_vbuckets)
        self.wakes = 0  # notifications that stepped at least one of its workers

    def _add_slot(self, wid: str, node: str, vbuckets: list[int]) -> WorkerSlot:
        spec = WorkerSpec(
            self.state.location,
            self.name,
            self.record.generation,
            wid,
            tuple(vbuckets),
            self.targets,
            data_service=self.executor.data_service,
            isolation=isolation_of(self.defn, self.record.deployed_by),
        )
        slot = self.slots[wid] = WorkerSlot(spec, node)
        return slot

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        for slot in self.slots.values():
            self._spawn(slot)

    def _spawn(self, slot: WorkerSlot) -> None:
        ray_node = self.placements.get(slot.node)
        # Only where each worker has a process of its own: in-process, or in a process shared with other
        # functions' workers (whose calls run one at a time), a waiting step would hold up the others.
        # A fresh socket name for each start: a killed process may still hold the last one.
        if self.waking and self.executor.name != "in-process" and self.executor.shared is None:
            slot.spec = replace(slot.spec, wake_address=write_waiter.new_address())
        # Each machine running the function's workers takes its share of the URL bindings' limits.
        machines = len({self.placements.get(s.node) for s in self.slots.values()})
        if machines != slot.spec.machines:
            slot.spec = replace(slot.spec, machines=machines)
        slot.handle = self.warm.pop((self.name, slot.spec.worker_id, ray_node), None)
        if slot.handle is not None:
            slot.handle.call("respec", slot.spec)  # runs before "start": one actor's calls run in order
        else:
            slot.handle = self.executor.start_worker(slot.spec, ray_node)
        slot.starting = slot.handle.call("start")
        slot.ready = False
        slot.inflight = []
        slot.started_at = time.monotonic()
        self._future_owner[slot.starting] = slot.spec.worker_id

    @property
    def ready(self) -> bool:
        return all(s.ready for s in self.slots.values())

    @property
    def done(self) -> bool:
        return self.error is not None or (
            self.until_caught_up
            and self.handoff is None
            and all(s.ready and s.caught_up and not s.inflight for s in self.slots.values())
        )

    def wake(self) -> None:
        """Step every worker again, caught up or not (until_caught_up mode: timers became due)."""
        for slot in self.slots.values():
            slot.caught_up = False
            slot.next_step_at = 0.0

    def wake_vbuckets(self, vbuckets: set[int]) -> int:
        """Writes were committed to these vBuckets of the source bucket: step the workers owning them now
        instead of at their next poll. Returns how many workers were woken."""
        woken = 0
        for slot in self.slots.values():
            if vbuckets.isdisjoint(slot.spec.vbuckets):
                continue
            slot.woken = True
            slot.next_step_at = 0.0
            slot.wakes += 1
            woken += 1
        if woken:
            self.wakes += 1
        return woken

    def forward_wake(self, vbuckets: set[int], payload: bytes, sender: socket.socket) -> None:
        """On the service's listening thread: pass a write notification on to the workers owning those
        vBuckets, which may be waiting for it in their step (eventing.workers.write_waiter)."""
        for slot in list(self.slots.values()):
            address = slot.spec.wake_address
            if address and not vbuckets.isdisjoint(slot.spec.vbuckets):
                write_waiter.forward(sender, address, payload)

    def idle_until(self) -> float | None:
        """None while any call of this function is in flight (the pump waits on those); else the monotonic
        time its next step is due (inf: none is), so the service can block until then or until woken."""
        if self.handoff is not None and self.handoff.calls:
            return None
        due = float("inf")
        for slot in self.slots.values():
            if slot.starting is not None or slot.inflight:
                return None
            if slot.respawn_at is not None:
                due = min(due, slot.respawn_at)
            elif slot.ready and slot.handle is not None and slot.spec.vbuckets:
                if not (self.until_caught_up and slot.caught_up):
                    due = min(due, slot.next_step_at)
        return due

    @property
    def backlog(self) -> int:
        return sum(s.backlog for s in self.slots.values())

    @property
    def restarts(self) -> int:
        return sum(s.restarts for s in self.slots.values())

    def pump(self, timeout: float = 0.1) -> int:
        """Submit steps where credits allow, wait up to `timeout` for results, handle them. Returns
        handled."""
        now = time.monotonic()
        for slot in self.slots.values():
            if slot.respawn_at is not None and now >= slot.respawn_at:
                slot.respawn_at = None
                self._spawn(slot)
            if not slot.ready or slot.handle is None or not slot.spec.vbuckets:
                continue
            if self.until_caught_up and slot.caught_up:
                continue
            while len(slot.inflight) < CREDITS and now >= slot.next_step_at:
                slot.woken = False  # this step starts after every write notified so far
                # A caught-up worker with a waiter waits in its step for its next write (forward_wake).
                if slot.caught_up and slot.spec.wake_address:
                    fut = slot.handle.call("step", None, IDLE_POLL_S)
                else:
                    fut = slot.handle.call("step")
                slot.inflight.append(fut)
                self._future_owner[fut] = slot.spec.worker_id
                if slot.caught_up:
                    break  # an idle worker gets one probe at a time
        pending = [
            f
            for s in self.slots.values()
            for f in ([s.starting] if s.starting is not None else []) + s.inflight
        ]
        if self.handoff is not None:
            pending.extend(self.handoff.calls)
        if (
            self.waking
            and pending
            and any(
                s.ready and s.caught_up and not s.inflight and s.handle is not None
                for s in self.slots.values()
            )
        ):
            timeout = min(timeout, WAKE_WAIT_S)
        before = self.handled
        for fut in self.executor.wait(pending, timeout):
            self._settle(fut)
        return self.handled - before

    def _settle(self, fut: Any) -> None:
        if self.handoff is not None and fut in self.handoff.calls:
            self._settle_handoff(fut)
            return
        wid = self._future_owner.pop(fut, None)
        if wid is None:
            return
        slot = self.slots[wid]
        try:
            value = self.executor.result(fut)
        except WorkerDied as exc:
            self._restart(slot, str(exc))
            return
        except FencedError as exc:
            # A worker (re)starting after its function was redeployed or undeployed: this deployment is over,
            # not failed. The service's next look at the states stops it and starts the new deployment.
            log.warning("function %s worker %s stopped: %s", self.name, wid, exc)
            if fut is slot.starting:
                slot.starting = None
            elif fut in slot.inflight:
                slot.inflight.remove(fut)
            return
        except EventingError as exc:
            log.error("function %s worker %s failed: %s", self.name, wid, exc)
            self.error = exc
            if fut is slot.starting:
                slot.starting = None
            elif fut in slot.inflight:
                slot.inflight.remove(fut)
            return
        if fut is slot.starting:
            slot.starting = None
            slot.ready = True
            slot.pid = value
            self._issue_revokes()
            self._claim_waiting(wid)
            return
        slot.inflight.remove(fut)
        report: StepReport = value
        self.handled += report.handled
        if report.first_handled_at and (
            not self.first_handled_at or report.first_handled_at < self.first_handled_at
        ):
            self.first_handled_at = report.first_handled_at
        slot.caught_up = report.caught_up
        slot.backlog = report.backlog
        if report.fenced:
            log.warning(
                "function %s worker %s lost %d vBuckets to a newer owner", self.name, wid, len(report.fenced)
            )
        woken_here = self.waking and not slot.spec.wake_address  # else it waits for writes in its steps
        if report.timers_fired or report.waited or (report.handled and not (report.caught_up and woken_here)):
            # Busy: step again at once, even if an earlier step of this worker came back empty meanwhile.
            # A step that waited for a write is followed at once by the next waiting one. One that caught up,
            # where the service steps it as writes are notified (wake_vbuckets), waits for that or its poll:
            # a step at once would find nothing, at the cost of a round trip and a look (a sandboxed or
            # remote worker's, a read of its host).
            slot.next_step_at = 0.0
        elif not slot.woken:
            slot.next_step_at = time.monotonic() + IDLE_POLL_S

    def _restart(self, slot: WorkerSlot, why: str) -> None:
        if slot.failed:
            return  # its node is gone: the failover rebalance moves its vBuckets
        for fut in slot.inflight + ([slot.starting] if slot.starting is not None else []):
            self._future_owner.pop(fut, None)
        delay = RESTART_BACKOFF_S[min(slot.restarts, len(RESTART_BACKOFF_S) - 1)]
        slot.restarts += 1
        log.warning(
            "function %s worker %s died (%s); restarting from its checkpoints in %.1fs",
            self.name,
            slot.spec.worker_id,
            why,
            delay,
        )
        if slot.handle is not None:
            self.executor.kill(slot.handle)
        # Respawned by pump() once the backoff has passed: the service loop never sleeps here, so the
        # function's other workers (and other functions) keep flowing meanwhile.
        slot.handle = None
        slot.starting = None
        slot.inflight = []
        slot.ready = False
        slot.caught_up = False
        slot.respawn_at = time.monotonic() + delay

    # -- node failover ------------------------------------------------------------------------------

    def fail_node(self, node: str) -> list[str]:
        """Give up the workers of a dead eventing node: no more calls, no respawn. The failover rebalance
        that follows then releases their vBuckets at once (their last checkpoints stand) and the surviving
        workers claim them with higher epochs, which fences anything those workers might still write."""
        gone = []
        for wid, slot in self.slots.items():
            if slot.node != node or slot.failed:
                continue
            for fut in slot.inflight + ([slot.starting] if slot.starting is not None else []):
                self._future_owner.pop(fut, None)
            if slot.handle is not None:
                self.executor.kill(slot.handle)
            slot.handle = None
            slot.starting = None
            slot.inflight = []
            slot.ready = False
            slot.caught_up = False
            slot.respawn_at = None
            slot.leaving = True
            slot.failed = True
            gone.append(wid)
        if self.handoff is not None and gone:
            self._drop_from_handoff(self.handoff, set(gone))
        return gone

    def _drop_from_handoff(self, handoff: Handoff, gone: set[str]) -> None:
        """A rebalance in flight loses workers with their node: what they were releasing counts as
        released (their last checkpoints stand), what they were to claim stays unclaimed (it goes to the
        survivors in the failover rebalance that follows), so the rebalance can still finish."""
        for fut, (kind, wid, vbs) in list(handoff.calls.items()):
            if wid not in gone:
                continue
            del handoff.calls[fut]
            if kind == "revoke":
                self._released(wid, vbs)
            else:
                for vb in vbs:
                    handoff.claimed_at.setdefault(vb, time.monotonic())
        for wid in gone:
            for vb in handoff.incoming.pop(wid, []):
                handoff.claimed_at.pop(vb, None)
            handoff.waiting.pop(wid, None)
        self._issue_revokes()
        self._maybe_finish()

    # -- live rebalance -----------------------------------------------------------------------------

    def start_rebalance(self, node_owners: tuple[str, ...], nodes: list[str]) -> Handoff:
        """Begin handing vBuckets over to match the new node plan; other vBuckets keep flowing.

        For each moving vBucket: its old worker finishes the step it started, flushes effects, writes its
        checkpoint and releases (revoke_vbuckets); then the new worker claims it with a higher epoch and
        resumes right after that checkpoint (assign_vbuckets). Calls on one actor run in order, so the
        revoke lands between two steps and nothing of that vBucket is handled twice or out of order.
        """
        from sharding import VBucketPlan

        target = assign_function(
            VBucketPlan(node_owners), self.defn.worker_count, self.assignment, nodes=nodes
        )
        handoff = Handoff(target, time.monotonic(), defaultdict(list), defaultdict(list))
        for move in function_moves(self.assignment, target):
            assert move.from_worker is not None
            handoff.outgoing[str(move.from_worker)].append(move.vb)
            handoff.incoming[str(move.to_worker)].append(move.vb)
        for worker in target.workers():
            wid = str(worker)
            if wid not in self.slots:
                self._spawn(self._add_slot(wid, worker.node, []))
        for slot in self.slots.values():
            slot.leaving = slot.node not in nodes
        self.handoff = handoff
        self.assignment = target
        self._issue_revokes()
        return handoff

    def _issue_revokes(self) -> None:
        """Release moving vBuckets only once every receiving worker is up: a new actor takes seconds to
        start, and a vBucket should not wait that long without an owner."""
        handoff = self.handoff
        if handoff is None or handoff.revokes_issued:
            return
        if not all(self.slots[wid].ready or self.slots[wid].failed for wid in handoff.incoming):
            return
        handoff.revokes_issued = True
        handoff.released_from = time.monotonic()
        for wid, vbs in handoff.outgoing.items():
            slot = self.slots[wid]
            leaving = set(vbs)
            slot.spec = replace(
                slot.spec, vbuckets=tuple(vb for vb in slot.spec.vbuckets if vb not in leaving)
            )
            if slot.handle is None:
                self._released(wid, vbs)  # down (waiting to respawn): its last checkpoint stands
            else:
                handoff.calls[slot.handle.call("revoke_vbuckets", vbs)] = ("revoke", wid, vbs)
        self._maybe_finish()

    def _settle_handoff(self, fut: Any) -> None:
        handoff = self.handoff
        assert handoff is not None
        kind, wid, vbs = handoff.calls.pop(fut)
        now = time.monotonic()
        try:
            self.executor.result(fut)
        except WorkerDied as exc:
            if kind == "revoke":
                # The old owner died before releasing: its last checkpoint stands, and the new owner's
                # higher epoch fences it should it come back. Restart it for what it still owns.
                log.warning("function %s worker %s died while releasing (%s)", self.name, wid, exc)
                self._restart_if_needed(wid, str(exc))
            else:
                # The new owner died before its first checkpoint: its restart claims again (its spec
                # already lists the vBuckets) and resumes after the old owner's checkpoint.
                self._restart(self.slots[wid], str(exc))
                for vb in vbs:
                    handoff.claimed_at.setdefault(vb, time.monotonic())
                self._maybe_finish()
                return
        except EventingError as exc:
            self.error = exc
            return
        if kind == "revoke":
            self._released(wid, vbs)
            if self.after_release is not None:
                self.after_release(wid, vbs)
        else:
            for vb in vbs:
                handoff.claimed_at[vb] = now
            self.slots[wid].caught_up = False
            if self.after_claim is not None:
                self.after_claim(wid, vbs)
        self._maybe_finish()

    def _released(self, wid: str, vbs: list[int]) -> None:
        """vBuckets left their old worker: queue each for its new worker and claim where it is up."""
        handoff = self.handoff
        assert handoff is not None
        now = time.monotonic()
        gone = set(vbs)
        for vb in vbs:
            handoff.released_at[vb] = now
        for new_wid, new_vbs in handoff.incoming.items():
            released = [vb for vb in new_vbs if vb in gone]
            if released:
                handoff.waiting[new_wid].extend(released)
                self._claim_waiting(new_wid)

    def _restart_if_needed(self, wid: str, why: str) -> None:
        slot = self.slots[wid]
        if slot.spec.vbuckets:
            self._restart(slot, why)

    def _claim_waiting(self, wid: str) -> None:
        """Hand released vBuckets to their new worker once it is up."""
        handoff = self.handoff
        if handoff is None or not handoff.waiting.get(wid):
            return
        slot = self.slots[wid]
        if not slot.ready:
            return
        vbs = handoff.waiting.pop(wid)
        slot.spec = replace(slot.spec, vbuckets=tuple(sorted(set(slot.spec.vbuckets) | set(vbs))))
        handoff.calls[slot.handle.call("assign_vbuckets", vbs)] = ("assign", wid, vbs)

    def _maybe_finish(self) -> None:
        handoff = self.handoff
        if handoff is None or not handoff.revokes_issued or handoff.calls or any(handoff.waiting.values()):
            return
        if len(handoff.claimed_at) < handoff.moves:
            return
        handoff.finished_at = time.monotonic()
        kept = {str(w) for w in handoff.target.workers()}  # a failed node's workers stay until its failover
        for wid, slot in list(self.slots.items()):
            if slot.leaving and not slot.spec.vbuckets and wid not in kept:
                self._end_slot(wid)
        self.last_handoff, self.handoff = handoff, None
        log.info(
            "function %s rebalanced: %d vBuckets moved in %.2fs, longest unowned %.0f ms",
            self.name,
            handoff.moves,
            handoff.finished_at - handoff.started_at,
            handoff.longest_unowned_s() * 1000,
        )

    def _end_slot(self, wid: str) -> None:
        slot = self.slots.pop(wid)
        for fut in slot.inflight:
            self._future_owner.pop(fut, None)
        if slot.handle is not None:
            self.executor.kill(slot.handle)

    # -- stopping -----------------------------------------------------------------------------------

    def stop(self, timeout: float = 60.0) -> None:
        """Let in-flight steps finish, then checkpoint and release every vBucket, then end the workers."""
        deadline = time.monotonic() + timeout
        while self.handoff is not None and time.monotonic() < deadline:
            self.pump(0.2)
        for slot in self.slots.values():
            while (slot.inflight or slot.starting is not None) and time.monotonic() < deadline:
                for fut in self.executor.wait(
                    list(slot.inflight) + ([slot.starting] if slot.starting else []), 0.5
                ):
                    self._settle(fut)
        stops = {}
        for wid, slot in self.slots.items():
            if slot.handle is not None and slot.ready:
                stops[wid] = slot.handle.call("stop")
        stopped = set()
        for wid, fut in stops.items():
            try:
                self.executor.wait([fut], max(0.1, deadline - time.monotonic()))
                self.executor.result(fut)
                stopped.add(wid)
            except (WorkerDied, EventingError) as exc:
                log.warning(
                    "function %s worker %s did not stop cleanly (%s); its checkpoints stand",
                    self.name,
                    wid,
                    exc,
                )
        for wid, slot in self.slots.items():
            if slot.handle is not None:
                # A worker that stopped cleanly may go back to a kept pool (eventing ray start); any other
                # ends.
                if wid in stopped:
                    self.executor.release(slot.handle)
                else:
                    self.executor.kill(slot.handle)
                slot.handle = None
