"""The eventing service: runs every deployed function and follows lifecycle changes made by other
processes (deploy, pause, resume, undeploy) through the metadata store."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from eventing.control import failover
from eventing.control.failover import (
    HEALTH_POLL_S,
    LEADER_LEASE,
    STANDBY_POLL_S,
    FailoverDetector,
    failover_survivors,
    lease_ttl_s,
    ray_node_health,
    wall_of,
)
from eventing.control.leadership import LeaseKeeper, expiry_hint, service_alive
from eventing.control.lifecycle import SERVICE_STALE_S, complete_transition
from eventing.control.mirrors import MirrorHost
from eventing.control.nodes import Topology, function_assignment, packed_node_plan, save_packed_placement
from eventing.control.supervisor import FunctionSupervisor
from eventing.core.definition import FunctionDefinition
from eventing.errors import EventingError
from eventing.storage import wake
from eventing.storage.state import StateLike, as_state
from eventing.windows.runtime.host import WindowHost, WindowOptions
from eventing.workers import write_waiter
from eventing.workers.executor import Executor
from eventing.workers.worker import WorkerSpec
from metadata import FunctionState, Lease
from sharding import VBucketPlan
from sharding.placement import PackedPlacement

log = logging.getLogger("eventing.control.service")

STATE_POLL_S = 0.5
DEAD_LETTERS_EVERY_S = 1.0  # how often a run's dead-letter counts are read for its progress
WARM_REFRESH_S = 5.0  # a standby checks this often which workers it would need
# With nothing in flight, the loop blocks until a worker's next step is due, a write notification or
# this long at most (the state poll, window coordinators and progress reports keep their pace).
IDLE_BLOCK_S = 0.05


@dataclass
class FunctionProgress:
    name: str
    handled: int = 0
    backlog: int = 0
    state: str = "starting"
    # Mutations per second. While the function runs: over the last second or so (0 while it is paused).
    # Once the run is over (caught up, stopped): its average over the time it was handling mutations, from
    # its first batch to its last, across pauses and resumes (start-up and idle time left out).
    rate_mps: float = 0.0
    error: str | None = None
    # Dead letters this run added, by reason (`error`, `timeout`, `late`, ...): a run in which mutations
    # failed must not look like a clean one.
    dead_letters: dict[str, int] = field(default_factory=dict)
    log_path: str | None = None  # the handler log, once a handler logged something
    first_handled_at: float = 0.0  # epoch s: when its first batch of mutations began (0: none yet)


@dataclass
class RunSummary:
    functions: dict[str, FunctionProgress] = field(default_factory=dict)
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    leadership: dict = field(default_factory=dict)  # how this service became leader (and when it took over)
    failovers: list[dict] = field(default_factory=list)  # nodes this service failed over
    workers_ready_s: float | None = None  # from the start of run() until every function's workers were up


class EventingService:
    """Runs until stopped; with `until_caught_up`, stops once every function reached the high seqnos
    its source had when the function started, after a final checkpoint.

    The running service is the leader: it holds the leader lease (eventing.control.failover). With
    `standby`, it first waits for that lease and takes over when the leader dies. It fails over eventing
    nodes whose Ray node has been down for `failover_timeout_s` (None: $EVENTING_FAILOVER_TIMEOUT or 10 s).
    """

    def __init__(
        self,
        state: StateLike,
        executor: Executor,
        *,
        until_caught_up: bool = False,
        functions: list[str] | None = None,
        on_progress: Callable[[RunSummary], None] | None = None,
        windows: WindowOptions | None = None,
        standby: bool = False,
        failover_timeout_s: float | None = None,
    ):
        self.state = as_state(state)
        self.executor = executor
        self.until_caught_up = until_caught_up
        self.only = set(functions) if functions else None
        self.on_progress = on_progress
        self.store = self.state.metadata
        self.store.verify_integrity()
        self.service_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.supervisors: dict[str, FunctionSupervisor] = {}
        self.finished: set[str] = set()  # caught up (until_caught_up mode)
        self._due_timer_wakes: dict[str, int] = {}  # function -> due timers when its workers were last woken
        self.summary = RunSummary()
        # Windowed functions' coordinators.
        self.windows = WindowHost(self.state, errors=self.summary.errors, options=windows or WindowOptions())
        # Mirrors' followers (tables of PostgreSQL databases into collections), run by the leader alone.
        self.mirrors = None if until_caught_up else MirrorHost(self.state, errors=self.summary.errors)
        self.stop_event = threading.Event()
        self._last_state_poll = 0.0
        self._last_gauges = 0.0
        self._last_dead_letters = 0.0
        self._rate_window: dict[str, tuple[float, int]] = {}
        self.standby = standby
        self.role = "standby" if standby else "leader"
        self.lease_ttl_s = lease_ttl_s()
        self.detector = FailoverDetector(
            failover.failover_timeout_s() if failover_timeout_s is None else failover_timeout_s
        )
        self._last_health = 0.0
        self._keeper: LeaseKeeper | None = None
        self._leading_since: float | None = None
        self._deferred: list[str] = []  # nodes due for failover while a rebalance runs (logged once)
        # A standby's workers, started while it waits (idle, claiming nothing), handed to its supervisors
        # when it takes over: Ray needs seconds to start an actor, the hand-over a call.
        self.warm: dict[tuple[str, str, str | None], Any] = {}
        self._last_warm = 0.0
        # (alive, why) per Ray node id; only Ray has nodes to lose (tests may plug in their own)
        self.node_health: Callable[[Iterable[str]], dict[str, tuple[bool, str]]] | None = (
            ray_node_health if executor.name == "ray" else None
        )

        # Packed functions (placement: packed) on their nodes. Only this service runs functions on the data
        # directory, so the placement starts empty with it: nothing runs before it starts them.
        self.packed = PackedPlacement()
        self._handled_before: dict[str, int] = {}  # handled by earlier starts in this run (pause/resume)
        # Per function: (handled, epoch s) when the supervisor's count last grew, and the seconds of handling
        # of its earlier starts in this run: the run's average rate without start-up and idle time.
        self._last_growth: dict[str, tuple[int, float]] = {}
        self._busy_before: dict[str, float] = {}
        self._dlq_baseline: dict[str, dict[str, int]] = {}  # dead letters by reason when this run began
        # Write notifications (eventing.storage.wake): committed writes in any process on this machine wake
        # the caught-up workers owning their vBuckets. Not in until_caught_up mode (its targets are fixed),
        # nor with EVENTING_WAKE=0 (the poll alone).
        self.waker: wake.WakeListener | None = None
        self.workers_wait = False  # workers wait for writes in their steps without the service's waker
        self._wake_sender: socket.socket | None = None  # the listener thread's, to pass notifications on
        self.wakes: Counter[str] = Counter()  # notifications that woke a worker, by bucket
        self.wake_log: deque[tuple[float, str, frozenset[int], int]] = deque(
            maxlen=256
        )  # (time, bucket, vbs, woken)

    def _info(self) -> str:
        return json.dumps({"pid": os.getpid(), "executor": self.executor.name, "role": self.role})

    def run(self) -> RunSummary:
        # Every path out (a refused start, a standby stopped before taking over, a failed data service, the
        # main loop's end or error) releases each resource once, in reverse order of acquisition.
        with contextlib.ExitStack() as held:
            held.callback(self.store.remove_service, self.service_id)  # registered by its first heartbeat
            held.callback(self.executor.close)  # the data service, started ahead (standby) or below
            held.callback(self._cool_down)  # started-ahead workers no function took
            self._lead()
            if self.stop_event.is_set():  # a standby stopped before it had to take over
                return self.summary
            start = self._leading_since = time.monotonic()
            self.store.heartbeat(self.service_id, self._info())
            self._keeper = LeaseKeeper(self)
            self._keeper.start()
            held.callback(self._keeper.finish)  # a clean stop frees the lease: a standby takes over at once
            self.executor.check_placements(Topology(self.store).placements())
            self.executor.serve(
                self.state
            )  # the data service, for workers on nodes without the data directory
            if not self.until_caught_up and wake.enabled() and self._workers_listen():
                # A server's workers each listen on a connection of their own and wait in their steps
                # (eventing.storage.postgres.wake_wait): a LISTEN of the service would receive every write
                # notification once more and step no worker sooner.
                self.workers_wait = True
            elif not self.until_caught_up and wake.enabled():
                waker = self.state.wake_listener()
                self._wake_sender = write_waiter.sender_socket()
                held.callback(
                    self._wake_sender.close
                )  # after the listener's thread ended (callbacks run LIFO)
                if waker.start():
                    self.waker = waker
                    held.callback(waker.close)
                    waker.on_notify = self._forward_wake
            held.callback(lambda: self._report(time.monotonic() - start, final=True))
            held.callback(self.windows.close)
            if self.mirrors is not None:
                held.callback(self.mirrors.close)
            held.callback(self._stop_all)
            self._main_loop(start)
        self.summary.seconds = time.monotonic() - start
        return self.summary

    def _main_loop(self, start: float) -> None:
        self._sync_states()
        while not self.stop_event.is_set():
            now = time.monotonic()
            if now - self._last_state_poll >= STATE_POLL_S:
                self._sync_states()
            self._apply_wakes()
            for sup in list(self.supervisors.values()):
                sup.pump(timeout=0.05 / max(1, len(self.supervisors)))
                if sup.error is not None:
                    self._fail(sup)
                elif sup.done and not self._wake_for_due_timers(sup):
                    self._stop_function(sup.name, run_over=True)
                    self.finished.add(sup.name)
                    self.summary.functions[sup.name].state = "caught up"
            self.windows.poll(self.supervisors)
            if self.mirrors is not None:
                self.mirrors.poll()
            if (
                self._leading_since is not None
                and self.supervisors
                and all(sup.ready for sup in self.supervisors.values())
            ):
                # Lease taken -> every function's workers up and claimed: the takeover's cost after the lease.
                self.summary.leadership["workers_ready_s"] = round(time.monotonic() - self._leading_since, 3)
                self._leading_since = None
                self._cool_down()
            if (
                self.summary.workers_ready_s is None
                and self.supervisors
                and all(sup.ready for sup in self.supervisors.values())
            ):
                self.summary.workers_ready_s = round(time.monotonic() - start, 3)
            self._report(now - start)
            if self.until_caught_up and not self.supervisors and self._nothing_left():
                break
            if not self.supervisors:
                self.stop_event.wait(0.1)
            else:
                self._idle_wait()

    def _forward_wake(self, bucket: str, vbuckets: set[int], payload: bytes) -> None:
        """On the listener's thread, as each write notification arrives: workers waiting in their step get
        it at once (the loop's `_apply_wakes` steps those that are not waiting)."""
        try:
            supervisors = list(self.supervisors.values())
        except RuntimeError:  # the loop changed the set of functions meanwhile: the loop's pass covers it
            return
        sender = self._wake_sender
        if sender is None or self.state.directory is None:
            return  # a server's workers listen themselves (eventing.storage.postgres.wake_wait)
        for sup in supervisors:
            if sup.defn.source_bucket == bucket:
                sup.forward_wake(vbuckets, payload, sender)

    def _workers_listen(self) -> bool:
        """Whether every worker listens for the writes to its vBuckets itself: on a server's state (its
        notifications reach any machine), in a process of its own (a waiting step holds up no other)."""
        return (
            self.state.directory is None
            and self.executor.name != "in-process"
            and self.executor.shared is None
        )

    def _apply_wakes(self) -> None:
        """Step now the workers whose vBuckets got writes since the last pass."""
        if self.waker is None:
            return
        for bucket, vbs in self.waker.take().items():
            woken = 0
            for sup in self.supervisors.values():
                if sup.defn.source_bucket == bucket:
                    woken += sup.wake_vbuckets(vbs)
            if woken:
                self.wakes[bucket] += 1
            self.wake_log.append((time.monotonic(), bucket, frozenset(vbs), woken))

    def _idle_wait(self) -> None:
        """With no call in flight, block until a worker's next step is due, a write notification arrives,
        or the service is stopped, instead of going round the loop meanwhile."""
        due = time.monotonic() + IDLE_BLOCK_S
        for sup in self.supervisors.values():
            until = sup.idle_until()
            if until is None:
                return  # the pump waits on the calls in flight
            due = min(due, until)
        delay = due - time.monotonic()
        if delay <= 0:
            return
        if self.waker is not None:
            self.waker.wait(delay)
        else:
            self.stop_event.wait(delay)

    def _stop_all(self) -> None:
        """Stop every running function at the end of the run: checkpointed, its workers ended."""
        for name in list(self.supervisors):
            self._stop_function(name, run_over=True)

    def stop(self) -> None:
        self.stop_event.set()
        if self.waker is not None:
            self.waker.interrupt()

    # -- leadership ---------------------------------------------------------------------------------

    def _lead(self) -> None:
        """Become the leader: take the lease now, or (standby) wait for it. Without `standby`, a second
        service is refused as before."""
        if not self.standby:
            others = [sid for sid in self.store.live_services(SERVICE_STALE_S) if service_alive(sid)]
            lease = self.store.lease(LEADER_LEASE)
            if (
                not others
                and lease is not None
                and not lease.expired(time.time())
                and service_alive(lease.holder)
            ):
                others = [lease.holder]
            taken = None if others else self._take_lease(lease)
            if taken is None:
                holder = (others or [lease.holder if lease else "?"])[0]
                raise EventingError(
                    f"another eventing service ({holder}) is running on this data directory; stop it first "
                    "(Ctrl-C), or run commands against it instead of starting a second one; to wait as a "
                    f"standby and take over when it stops, add --standby{expiry_hint(lease, holder)}"
                )
            self.summary.leadership = {"role": "leader", "term": taken.term, "waited_s": 0.0}
            return
        waiting_since = time.monotonic()
        self.store.heartbeat(self.service_id, self._info())
        self._serve_ahead()
        last_holder = None
        logged = False
        while not self.stop_event.is_set():
            lease = self.store.lease(LEADER_LEASE)
            if lease is not None and lease.holder != self.service_id and not lease.expired(time.time()):
                last_holder = lease.holder
            taken = self._take_lease(lease)
            if taken is not None:
                waited = time.monotonic() - waiting_since
                self.role = "leader"
                self.summary.leadership = {
                    "role": "leader",
                    "term": taken.term,
                    "waited_s": round(waited, 3),
                    "took_over_from": last_holder,
                }
                if last_holder is not None:
                    log.warning(
                        "standby %s took over from %s (lease term %d)",
                        self.service_id,
                        last_holder,
                        taken.term,
                    )
                    if not service_alive(last_holder):
                        self.store.remove_service(last_holder)  # its heartbeat row would look live a while
                return
            if not logged:
                log.warning(
                    "standby %s waiting for the leader %s", self.service_id, lease.holder if lease else "?"
                )
                logged = True
            self.store.heartbeat(self.service_id, self._info())
            self._warm_up()
            self.stop_event.wait(STANDBY_POLL_S)

    def _serve_ahead(self) -> None:
        """A standby on a cluster starts its own data service while it waits: the leader's actors end with
        the leader's process (Ray ends what a dead driver owned), and the workers this standby starts on
        nodes without the data directory need one the moment it takes over. Two services over the same
        files are harmless: every answer comes from the files and every write is fenced by epochs."""
        try:
            self.executor.serve(self.state)
        except EventingError as exc:
            log.warning(
                "standby could not start its data service ahead of time (%s); it will at takeover", exc
            )

    def _warm_up(self) -> None:
        """Start (idle) the workers this standby would need now, every WARM_REFRESH_S: one per worker of
        every deployed function, on the Ray node its eventing node is pinned to."""
        now = time.monotonic()
        if now - self._last_warm < WARM_REFRESH_S:
            return
        self._last_warm = now
        try:
            topology = Topology(self.store)
            pending = topology.pending_request()
            plan = VBucketPlan(tuple(pending["owners"])) if pending else topology.node_plan()
            placements = topology.placements()
            for record in self.store.list_functions():
                if record.state is not FunctionState.DEPLOYED or (
                    self.only is not None and record.name not in self.only
                ):
                    continue
                count = FunctionDefinition.from_dict(record.definition).worker_count
                for worker in function_assignment(self.store, record.name, count, plan).workers():
                    key = (record.name, str(worker), placements.get(worker.node))
                    if key not in self.warm:
                        # A placeholder: the supervisor sends the real spec ("respec") before "start".
                        spec = WorkerSpec(
                            location=self.state.location,
                            function=record.name,
                            generation=record.generation,
                            worker_id=str(worker),
                            vbuckets=(),
                            data_service=self.executor.data_service,
                        )
                        self.warm[key] = self.executor.start_worker(spec, key[2])
        except EventingError as exc:
            log.warning("standby could not start its workers ahead of time (%s); it will at takeover", exc)

    def _cool_down(self) -> None:
        """End the started-ahead workers no function took (the plan or the functions changed meanwhile)."""
        for handle in self.warm.values():
            self.executor.kill(handle)
        self.warm.clear()

    def _take_lease(self, lease: Lease | None) -> Lease | None:
        """Take the leader lease if it is free, or held by a service whose process is gone (same host)."""
        dead = (
            lease.holder
            if lease is not None and lease.holder != self.service_id and not service_alive(lease.holder)
            else None
        )
        return self.store.acquire_lease(
            LEADER_LEASE, self.service_id, self.lease_ttl_s, info=self._info(), take_from=dead
        )

    def lost_leadership(self, holder: str | None) -> None:
        """Called by the lease keeper: another service holds the lease now. Stop; its workers have fenced
        ours."""
        message = f"lost the leader lease to {holder or 'nobody (it could not be renewed)'}; stopping"
        log.error(message)
        self.summary.errors.append(message)
        self.stop_event.set()

    # -- following the metadata store -------------------------------------------------------------------

    def _sync_states(self) -> None:
        self._last_state_poll = time.monotonic()
        self.store.heartbeat(self.service_id, self._info())
        for record in self.store.list_functions():
            name = record.name
            if self.only is not None and name not in self.only:
                continue
            running = self.supervisors.get(name)
            if record.state is FunctionState.DEPLOYED:
                if running is not None and running.record.generation != record.generation:
                    self._stop_function(name)  # redeployed meanwhile: start over with the new deployment
                    running = None
                if running is None and name not in self.finished:
                    self._start_function(record)
            elif record.state is FunctionState.PAUSING:
                if running is not None:
                    self._stop_function(name)
                complete_transition(self.store, name, FunctionState.PAUSED, "pause")
                self._progress(name).state = "paused"
            elif record.state is FunctionState.UNDEPLOYING:
                if running is not None:
                    self._stop_function(name)
                complete_transition(self.store, name, FunctionState.UNDEPLOYED, "undeploy")
                self._progress(name).state = "undeployed"
            elif running is not None:
                self._stop_function(name)
        self._follow_rebalance()
        self._watch_nodes()

    # -- node failover ------------------------------------------------------------------------------

    def _watch_nodes(self) -> None:
        """Fail over eventing nodes whose Ray node has been down for the failover timeout."""
        now = time.monotonic()
        if self.node_health is None or now - self._last_health < HEALTH_POLL_S:
            return
        self._last_health = now
        topology = Topology(self.store)
        owning = topology.owning_nodes()
        pending = topology.pending_request()
        watched = set(owning) | set(pending["nodes"] if pending else [])  # a rebalance's joining nodes too
        pinned = {
            n["name"]: n["ray_node_id"]
            for n in topology.nodes()
            if n["ray_node_id"] and n["state"] != "failed" and n["name"] in watched
        }
        if not pinned:
            self.detector.observe(now, {})
            return
        try:
            health = self.node_health(pinned.values())
        except Exception as exc:  # noqa: BLE001 - Ray's control plane busy: look again next time
            log.warning("cannot read Ray's node table (%s); looking again in %.0fs", exc, HEALTH_POLL_S)
            return
        due = self.detector.observe(now, {name: health.get(rid, (True, "")) for name, rid in pinned.items()})
        if due:
            self._fail_over(topology, owning, due)

    def _fail_over(self, topology: Topology, owning: list[str], due: list[str]) -> None:
        if topology.pending_request() is not None or any(s.handoff for s in self.supervisors.values()):
            # Let the rebalance in progress finish without the dead workers (what they release counts as
            # released, what they were to claim waits), then fail the node over.
            for node in due:
                for sup in self.supervisors.values():
                    sup.fail_node(node)
            if self._deferred != due:
                log.warning(
                    "nodes %s are due for failover once the rebalance in progress ends", ", ".join(due)
                )
                self._deferred = due
            return
        self._deferred = []
        survivors = failover_survivors(owning, due)
        if not survivors:
            log.error(
                "cannot fail over %s: no other node holds vBuckets; add a node and rebalance", ", ".join(due)
            )
            return
        down_since = min(self.detector.down_since[n] for n in due)
        record = {
            "nodes": due,
            "why": {n: self.detector.why.get(n, "") for n in due},
            "down_since": wall_of(down_since),
            "failed_at": time.time(),
            "timeout_s": self.detector.timeout_s,
            "service": self.service_id,
        }
        for node in due:
            self.store.put_node(node, "failed")
            self.detector.forget(node)
            for sup in self.supervisors.values():
                sup.fail_node(node)
        plan = topology.plan(targets=survivors)
        request = topology.request_rebalance(plan, failover=record)
        log.warning(
            "failed over eventing node(s) %s after %.1fs down: %d vBuckets go to %s (rebalance %s)",
            ", ".join(due),
            time.monotonic() - down_since,
            plan.move_count,
            ", ".join(survivors),
            request["id"],
        )
        self._follow_rebalance()

    # -- rebalance ----------------------------------------------------------------------------------

    def _follow_rebalance(self) -> None:
        """Start a requested rebalance on every running function; record the new plan once all are done."""
        topology = Topology(self.store)
        request = topology.pending_request()
        if request is None:
            return
        live = [sid for sid in self.store.live_services(SERVICE_STALE_S) if service_alive(sid)]
        if request["status"] == "running" and request.get("service") not in live:
            # The service that ran it stopped midway: carry it on from where the checkpoints' owners stand.
            request = topology.update_request(
                request, status="requested", restarted=request.get("restarted", 0) + 1
            )
        if request["status"] == "requested":
            owners, nodes = tuple(request["owners"]), request["nodes"]
            placements = topology.placements()  # joining nodes' Ray nodes, before workers start there
            for sup in self.supervisors.values():
                if self.packed.node_of(sup.name) is None:  # a packed function stays on its one node
                    sup.placements = placements
                    sup.start_rebalance(owners, nodes)
            self._rebalance_started = time.monotonic()
            self._handled_at_rebalance = sum(s.handled for s in self.supervisors.values())
            topology.update_request(request, status="running", service=self.service_id)
            request = topology.pending_request()
            assert request is not None
        if request.get("service") != self.service_id or any(s.handoff for s in self.supervisors.values()):
            return
        handoffs = [s.last_handoff for s in self.supervisors.values() if s.last_handoff is not None]
        elapsed = time.monotonic() - getattr(self, "_rebalance_started", time.monotonic())
        topology.complete(request["owners"])
        extra = {}
        if "failover" in request:
            # From the first sign of the node's death to the last claim of its vBuckets by a survivor.
            claimed = [wall_of(max(h.claimed_at.values())) for h in handoffs if h.claimed_at]
            last_claim = max(claimed, default=time.time())
            extra["failover_unowned_s"] = round(last_claim - request["failover"]["down_since"], 3)
            self.summary.failovers.append({**request["failover"], "unowned_s": extra["failover_unowned_s"]})
            log.warning(
                "failover of %s done: its vBuckets had no live owner for %.1fs",
                ", ".join(request["failover"]["nodes"]),
                extra["failover_unowned_s"],
            )
        topology.update_request(
            request,
            status="done",
            finished_at=time.time(),
            seconds=round(elapsed, 3),
            longest_unowned_ms=round(max((h.longest_unowned_s() for h in handoffs), default=0.0) * 1000, 1),
            worker_moves={s.name: s.last_handoff.moves for s in self.supervisors.values() if s.last_handoff},
            **extra,
        )

    def _wake_for_due_timers(self, sup: FunctionSupervisor) -> bool:
        """Caught up includes timers already due. Each worker fires the due timers of its own vBuckets, but a
        timer that another worker created late may be due on a worker that already reported caught up: step
        the workers again while the store holds due timers and the last wake fired some of them."""
        due = self.store.timer_backlog(sup.name, int(time.time() * 1000))["due"]
        last = self._due_timer_wakes.get(sup.name)
        if due == 0 or (last is not None and due >= last):
            if due:
                log.warning(
                    "function %s: %d due timers did not fire; they fire on the next run", sup.name, due
                )
            return False
        self._due_timer_wakes[sup.name] = due
        sup.wake()
        return True

    def _nothing_left(self) -> bool:
        for record in self.store.list_functions():
            if self.only is not None and record.name not in self.only:
                continue
            if (
                record.state in (FunctionState.DEPLOYED, FunctionState.DEPLOYING)
                and record.name not in self.finished
            ):
                return False
        return True

    def _start_function(self, record) -> None:
        try:
            topology = Topology(self.store)
            definition = FunctionDefinition.from_dict(record.definition)
            worker_count = definition.worker_count
            packed = None
            if definition.placement == "packed":
                packed, step = self.packed.start(record.name)
                plan = packed_node_plan(step.node)
                log.info("function %s placed: %s", record.name, step.describe())
            else:
                pending = topology.pending_request()
                plan = VBucketPlan(tuple(pending["owners"])) if pending else topology.node_plan()
            assignment = function_assignment(self.store, record.name, worker_count, plan)
            sup = FunctionSupervisor(
                self.state,
                record,
                self.executor,
                assignment,
                until_caught_up=self.until_caught_up,
                placements=topology.placements(),
                warm=self.warm,
            )
            if packed is not None:
                self.packed = packed
                save_packed_placement(self.store, packed)
        except Exception as exc:  # noqa: BLE001 - one function that cannot start must not stop the others
            message = (
                str(exc) if isinstance(exc, EventingError) else f"cannot start: {type(exc).__name__}: {exc}"
            )
            self._progress(record.name).error = message
            self._progress(record.name).state = "failed"
            self.summary.errors.append(f"{record.name}: {message}")
            self.finished.add(record.name)
            log.error("cannot start function %s: %s", record.name, message)
            return
        if record.name not in self._dlq_baseline:
            self._dlq_baseline[record.name] = self._dead_letters(record.name)
        sup.waking = self.waker is not None or self.workers_wait
        sup.start()
        self.supervisors[record.name] = sup
        progress = self._progress(record.name)
        progress.state = "running"
        progress.rate_mps = 0.0
        self._rate_window[record.name] = (time.monotonic(), 0)

    def _note_growth(self, name: str, sup: FunctionSupervisor) -> None:
        """Remember when the supervisor's handled count last grew (the end of its handling so far)."""
        if sup.handled != self._last_growth.get(name, (0, 0.0))[0]:
            self._last_growth[name] = (sup.handled, time.time())

    def _stop_function(self, name: str, run_over: bool = False) -> None:
        sup = self.supervisors.pop(name, None)
        if sup is None:
            return
        sup.stop()
        if self.packed.node_of(name) is not None:
            self.packed, step = self.packed.stop(name)  # its slot is free; an empty node is released
            save_packed_placement(self.store, self.packed)
            log.info("function %s unplaced: %s", name, step.describe())
        self.windows.function_stopped(sup)  # after the workers' last rows are on disk
        progress = self._progress(name)
        # A run that is done within its first report never reaches _report with this supervisor: keep its
        # start-up figure here too.
        if sup.first_handled_at and not progress.first_handled_at:
            progress.first_handled_at = sup.first_handled_at
        before = self._handled_before.get(name, 0)
        progress.handled = before + sup.handled
        self._handled_before[name] = progress.handled
        progress.backlog = sup.backlog
        self._note_growth(name, sup)
        _, last = self._last_growth.pop(name, (0, 0.0))
        busy = max(0.0, last - sup.first_handled_at) if sup.handled and sup.first_handled_at else 0.0
        busy_total = self._busy_before[name] = self._busy_before.get(name, 0.0) + busy
        # Paused or undeployed while the run goes on, it handles nothing now. At the end of the run: the
        # run's rate, which a run shorter than a second never measured over a whole second.
        progress.rate_mps = progress.handled / max(busy_total, 1e-3) if run_over and progress.handled else 0.0
        if progress.state == "running":
            progress.state = "stopped (checkpointed)"
        elapsed = time.monotonic() - sup.started_at
        # A stopped function handles nothing: its live throughput is 0 until it runs again; the rate of this
        # start while it was handling stays as last_run_mps.
        self.store.set_gauges(
            name,
            {
                "last_run_handled": sup.handled,
                "last_run_seconds": elapsed,
                "last_run_mps": sup.handled / max(busy, 1e-3) if sup.handled else 0.0,
                "last_run_busy_seconds": busy,
                "throughput_mps": 0.0,
            },
        )
        progress.dead_letters = self._run_dead_letters(name)
        progress.log_path = self.state.app_logs.where(name) or progress.log_path

    def _run_dead_letters(self, name: str) -> dict[str, int]:
        """Dead letters written since this run began, by reason: the one source of the progress lines and
        the summary (workers' letters and the window coordinator's `late` rows alike, across pauses)."""
        baseline = self._dlq_baseline.get(name)
        if baseline is None:
            return {}
        return {
            reason: n - baseline.get(reason, 0)
            for reason, n in self._dead_letters(name).items()
            if n > baseline.get(reason, 0)
        }

    def _dead_letters(self, name: str) -> dict[str, int]:
        try:
            counters = self.store.counters(name)
        except EventingError:
            return {}
        return {k[4:]: int(v) for k, v in counters.items() if k.startswith("dlq_") and v}

    def _fail(self, sup: FunctionSupervisor) -> None:
        message = f"{sup.name}: {sup.error}"
        log.error("function %s stopped: %s", sup.name, sup.error)
        self.summary.errors.append(message)
        self._progress(sup.name).error = str(sup.error)
        self._progress(sup.name).state = "failed"
        self._stop_function(sup.name)
        self.finished.add(sup.name)

    def _progress(self, name: str) -> FunctionProgress:
        return self.summary.functions.setdefault(name, FunctionProgress(name))

    def _report(self, elapsed: float, final: bool = False) -> None:
        now = time.monotonic()
        for name, sup in self.supervisors.items():
            p = self._progress(name)
            p.handled, p.backlog = self._handled_before.get(name, 0) + sup.handled, sup.backlog
            if sup.first_handled_at and not p.first_handled_at:
                p.first_handled_at = sup.first_handled_at
            self._note_growth(name, sup)
            t0, n0 = self._rate_window.get(name, (now, 0))
            if now - t0 >= 1.0:
                p.rate_mps = (sup.handled - n0) / (now - t0)
                self._rate_window[name] = (now, sup.handled)
        if now - self._last_dead_letters >= DEAD_LETTERS_EVERY_S or final:
            self._last_dead_letters = now
            for name, p in self.summary.functions.items():
                p.dead_letters = self._run_dead_letters(name)
        if now - self._last_gauges >= 2.0 or final:
            self._last_gauges = now
            for name, p in self.summary.functions.items():
                if name in self.supervisors:
                    self.store.set_gauges(name, {"throughput_mps": round(p.rate_mps, 1)})
        self.summary.seconds = elapsed
        if self.on_progress is not None:
            self.on_progress(self.summary)


__all__ = ["EventingService", "FunctionProgress", "RunSummary"]
