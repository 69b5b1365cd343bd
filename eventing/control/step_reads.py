"""The service's reads for its remote workers' next steps (`StepReads`).

A worker behind the data service (a Ray node that cannot see the data directory) that has caught up asks,
as its step ends, for the rows to come. Sent to the data service, that read is answered at once, before
any new write, so the step the service calls when a write is notified finds nothing in it and reads again:
a round trip to the data service on every write's way to its handler. Instead the worker keeps the request
back and its step's report carries it here (eventing.storage.remote._RayClient.submit_ahead); the service,
which reads the files itself, makes the read as it calls the worker's next step (after the write that woke
the worker) and sends the answer with that call. A read that fails here is left to the worker, which then
sends it to the data service as before.
"""

from __future__ import annotations

import logging
from typing import Any

from eventing.storage.protocol import FileBucket
from eventing.storage.remote import read_changed
from eventing.storage.state import State
from sharding import vbucket_spans

log = logging.getLogger("eventing.control.step_reads")


class StepReads:
    """One function's reads ahead for its workers' next steps, on the service's own handles on the files."""

    def __init__(self, state: State):
        self.state = state
        self._buckets: dict[str, FileBucket] = {}
        self.answered = 0  # reads made here and sent with a step

    def answer(self, kept: tuple | None) -> tuple[int, Any] | None:
        """(ident, answer) of a worker's kept-back read, read now; None where there is none to make here."""
        if kept is None:
            return None
        ident, method, args = kept
        if method != "read_changed" or len(args) != 3 or self.state.directory is None:
            return None
        name, positions, limit = args
        try:
            bucket = self._buckets.get(name)
            if bucket is None:
                bucket = self._buckets[name] = self.state.open_bucket(name)
            spans = vbucket_spans([vb for vb, _ in positions])
            answer = read_changed(bucket, positions, limit, spans)
            self.answered += 1
            return ident, answer
        except Exception as exc:  # noqa: BLE001 - the worker makes the read itself through the data service
            log.debug("a step's read ahead of bucket %s was left to its worker: %s", name, exc)
            return None

    def close(self) -> None:
        for bucket in self._buckets.values():
            bucket.close()
        self._buckets.clear()


__all__ = ["StepReads"]
