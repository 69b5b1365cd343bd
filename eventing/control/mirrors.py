"""Runs the mirrors' followers for the leader service: one process per mirror
(``python -m eventing.storage.mirror.follower KEYSPACE``, eventing.storage.mirror.follower), started when
the mirror is defined, restarted with a growing delay when it dies (kill -9 included: it resumes from the
marks in its collection), stopped when the mirror is dropped and when the service stops. A follower whose
failure needs the user (the table dropped, the slot gone) is not restarted until its mirror changes
(`collection resync`). The source's URL never travels on a command line: the follower reads it from the
metadata store, and the state's location goes in its environment.

The service calls ``poll()`` from its loop and ``close()`` at the end.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from eventing.errors import EventingError
from eventing.storage.mirror import definition as defs
from eventing.storage.state import STORE_ENV

log = logging.getLogger("eventing.control.mirrors")

POLL_S = 0.5
RESTART_S = (0.5, 30.0)  # the first and the longest delay before a dead follower is started again
STOP_WAIT_S = 10.0


@dataclass
class _Running:
    process: subprocess.Popen
    generation: int
    started: float


class MirrorHost:
    def __init__(self, state: Any, *, errors: list[str] | None = None):
        self.state = state
        self.errors = errors if errors is not None else []
        self.running: dict[str, _Running] = {}
        self._delay: dict[str, float] = {}
        self._not_before: dict[str, float] = {}
        self._given_up: dict[str, int] = {}  # keyspace -> generation whose follower failed for good
        self._last_poll = 0.0
        self.restarts = 0

    def poll(self) -> None:
        now = time.monotonic()
        if now - self._last_poll < POLL_S:
            return
        self._last_poll = now
        try:
            wanted = {d.keyspace: d for d in defs.load_all(self.state.metadata) if not d.dropping}
        except EventingError as exc:
            log.warning("cannot read the mirrors (%s)", exc)
            return
        for keyspace in list(self.running):
            if keyspace not in wanted or wanted[keyspace].generation != self.running[keyspace].generation:
                self._stop(keyspace)
        for keyspace, definition in wanted.items():
            found = self.running.get(keyspace)
            if found is not None:
                code = found.process.poll()
                if code is None:
                    if now - found.started > 60:
                        self._delay.pop(keyspace, None)  # it ran a while: a later death starts over quickly
                    continue
                self.running.pop(keyspace)
                self._died(keyspace, definition, code)
            if self._given_up.get(keyspace) == definition.generation or now < self._not_before.get(
                keyspace, 0.0
            ):
                continue
            self._start(keyspace, definition.generation)

    def _died(self, keyspace: str, definition: Any, code: int) -> None:
        status = defs.status(self.state.metadata, keyspace)
        if code == 3 and status.get("permanent"):
            self._given_up[keyspace] = definition.generation
            message = f"mirror {keyspace}: {status.get('error') or 'stopped'}"
            self.errors.append(message)
            log.error("%s", message)
            return
        delay = self._delay[keyspace] = min(self._delay.get(keyspace, RESTART_S[0] / 2) * 2, RESTART_S[1])
        self._not_before[keyspace] = time.monotonic() + delay
        self.restarts += 1
        log.warning(
            "mirror %s: its follower ended (exit %s%s); starting it again in %.1fs",
            keyspace,
            code,
            f": {status['error']}" if status.get("error") else "",
            delay,
        )

    def _start(self, keyspace: str, generation: int) -> None:
        env = dict(os.environ)
        env[STORE_ENV] = self.state.location
        process = subprocess.Popen(
            [sys.executable, "-m", "eventing.storage.mirror.follower", keyspace],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        self.running[keyspace] = _Running(process, generation, time.monotonic())
        log.info("mirror %s: follower started (pid %d)", keyspace, process.pid)

    def _stop(self, keyspace: str) -> None:
        found = self.running.pop(keyspace, None)
        if found is None:
            return
        process = found.process
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def pids(self) -> dict[str, int]:
        return {ks: r.process.pid for ks, r in self.running.items() if r.process.poll() is None}

    def close(self) -> None:
        for keyspace in list(self.running):
            self._stop(keyspace)
