"""The eventing service: runs every deployed function and follows lifecycle changes made by other
processes (deploy, pause, resume, undeploy) through the metadata store."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from eventing.core.definition import FunctionDefinition
from eventing.errors import EventingError
from eventing.runtime.executor import Executor
from eventing.runtime.lifecycle import SERVICE_STALE_S, complete_transition
from eventing.runtime.nodes import Topology, function_assignment
from eventing.runtime.supervisor import FunctionSupervisor
from eventing.storage.metadata import open_metadata
from eventing.windows.runtime.host import WindowHost
from metadata import FunctionState
from sharding import VBucketPlan

log = logging.getLogger("eventing.runtime.service")

STATE_POLL_S = 0.5


@dataclass
class FunctionProgress:
    name: str
    handled: int = 0
    backlog: int = 0
    state: str = "starting"
    rate_mps: float = 0.0
    error: str | None = None


@dataclass
class RunSummary:
    functions: dict[str, FunctionProgress] = field(default_factory=dict)
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)


class EventingService:
    """Runs until stopped; with `until_caught_up`, stops once every function reached the high seqnos
    its source had when the function started, after a final checkpoint."""

    def __init__(
        self,
        data_dir: str,
        executor: Executor,
        *,
        until_caught_up: bool = False,
        functions: list[str] | None = None,
        on_progress: Callable[[RunSummary], None] | None = None,
    ):
        self.data_dir = data_dir
        self.executor = executor
        self.until_caught_up = until_caught_up
        self.only = set(functions) if functions else None
        self.on_progress = on_progress
        self.store = open_metadata(data_dir)
        self.store.verify_integrity()
        self.service_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.supervisors: dict[str, FunctionSupervisor] = {}
        self.finished: set[str] = set()  # caught up (until_caught_up mode)
        self.summary = RunSummary()
        self.windows = WindowHost(data_dir, errors=self.summary.errors)  # windowed functions' coordinators
        self.stop_event = threading.Event()
        self._last_state_poll = 0.0
        self._last_gauges = 0.0
        self._rate_window: dict[str, tuple[float, int]] = {}

    def run(self) -> RunSummary:
        others = [sid for sid in self.store.live_services(SERVICE_STALE_S) if _alive(sid)]
        if others:
            self.store.close()
            raise EventingError(
                f"another eventing service ({others[0]}) is running on this data directory; "
                "stop it first (Ctrl-C), or run commands against it instead of starting a second one"
            )
        start = time.monotonic()
        self.store.heartbeat(self.service_id, json.dumps({"pid": os.getpid(), "executor": self.executor.name}))
        serve = getattr(self.executor, "serve", None)
        if serve is not None:
            try:
                self.executor.check_placements(Topology(self.store).placements())  # type: ignore[attr-defined]
            except EventingError:
                self.store.remove_service(self.service_id)
                self.store.close()
                raise
            serve(self.data_dir)  # the data service, for workers on nodes without the data directory
        try:
            self._sync_states()
            while not self.stop_event.is_set():
                now = time.monotonic()
                if now - self._last_state_poll >= STATE_POLL_S:
                    self._sync_states()
                for sup in list(self.supervisors.values()):
                    sup.pump(timeout=0.05 / max(1, len(self.supervisors)))
                    if sup.error is not None:
                        self._fail(sup)
                    elif sup.done:
                        self._stop_function(sup.name)
                        self.finished.add(sup.name)
                        self.summary.functions[sup.name].state = "caught up"
                self.windows.poll(self.supervisors)
                self._report(now - start)
                if self.until_caught_up and not self.supervisors and self._nothing_left():
                    break
                if not self.supervisors:
                    self.stop_event.wait(0.1)
        finally:
            for name in list(self.supervisors):
                self._stop_function(name)
            self.windows.close()
            close = getattr(self.executor, "close", None)
            if close is not None:
                close()
            self._report(time.monotonic() - start, final=True)
            self.store.remove_service(self.service_id)
            self.store.close()
        self.summary.seconds = time.monotonic() - start
        return self.summary

    def stop(self) -> None:
        self.stop_event.set()

    # -- following the metadata store -------------------------------------------------------------------

    def _sync_states(self) -> None:
        self._last_state_poll = time.monotonic()
        self.store.heartbeat(self.service_id, json.dumps({"pid": os.getpid(), "executor": self.executor.name}))
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

    # -- rebalance ----------------------------------------------------------------------------------

    def _follow_rebalance(self) -> None:
        """Start a requested rebalance on every running function; record the new plan once all are done."""
        topology = Topology(self.store)
        request = topology.pending_request()
        if request is None:
            return
        live = [sid for sid in self.store.live_services(SERVICE_STALE_S) if _alive(sid)]
        if request["status"] == "running" and request.get("service") not in live:
            # The service that ran it stopped midway: carry it on from where the checkpoints' owners stand.
            request = topology.update_request(request, status="requested", restarted=request.get("restarted", 0) + 1)
        if request["status"] == "requested":
            owners, nodes = tuple(request["owners"]), request["nodes"]
            topology.placements()  # make sure joining nodes are known before workers start there
            for sup in self.supervisors.values():
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
        topology.update_request(
            request,
            status="done",
            finished_at=time.time(),
            seconds=round(elapsed, 3),
            longest_unowned_ms=round(max((h.longest_unowned_s() for h in handoffs), default=0.0) * 1000, 1),
            worker_moves={s.name: s.last_handoff.moves for s in self.supervisors.values() if s.last_handoff},
        )

    def _nothing_left(self) -> bool:
        for record in self.store.list_functions():
            if self.only is not None and record.name not in self.only:
                continue
            if record.state in (FunctionState.DEPLOYED, FunctionState.DEPLOYING) and record.name not in self.finished:
                return False
        return True

    def _start_function(self, record) -> None:
        try:
            topology = Topology(self.store)
            worker_count = FunctionDefinition.from_dict(record.definition).worker_count
            pending = topology.pending_request()
            plan = VBucketPlan(tuple(pending["owners"])) if pending else topology.node_plan()
            assignment = function_assignment(self.store, record.name, worker_count, plan)
            sup = FunctionSupervisor(
                self.data_dir, record, self.executor, assignment,
                until_caught_up=self.until_caught_up, placements=topology.placements(),
            )
        except EventingError as exc:
            self._progress(record.name).error = str(exc)
            self.summary.errors.append(f"{record.name}: {exc}")
            self.finished.add(record.name)
            log.error("cannot start function %s: %s", record.name, exc)
            return
        sup.start()
        self.supervisors[record.name] = sup
        progress = self._progress(record.name)
        progress.state = "running"
        self._rate_window[record.name] = (time.monotonic(), 0)

    def _stop_function(self, name: str) -> None:
        sup = self.supervisors.pop(name, None)
        if sup is None:
            return
        sup.stop()
        self.windows.function_stopped(sup)  # after the workers' last rows are on disk
        progress = self._progress(name)
        progress.handled = sup.handled
        progress.backlog = sup.backlog
        if progress.state == "running":
            progress.state = "stopped (checkpointed)"
        elapsed = time.monotonic() - sup.started_at
        self.store.set_gauges(name, {"last_run_handled": sup.handled, "last_run_seconds": elapsed})

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
            p.handled, p.backlog = sup.handled, sup.backlog
            t0, n0 = self._rate_window.get(name, (now, 0))
            if now - t0 >= 1.0:
                p.rate_mps = (sup.handled - n0) / (now - t0)
                self._rate_window[name] = (now, sup.handled)
        if now - self._last_gauges >= 2.0 or final:
            self._last_gauges = now
            for name, p in self.summary.functions.items():
                if name in self.supervisors:
                    self.store.set_gauges(name, {"throughput_mps": round(p.rate_mps, 1)})
        self.summary.seconds = elapsed
        if self.on_progress is not None:
            self.on_progress(self.summary)


def _alive(service_id: str) -> bool:
    """A service on this host whose process is gone is not alive, whatever its last heartbeat says."""
    host, _, rest = service_id.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


__all__ = ["EventingService", "FunctionProgress", "RunSummary"]
