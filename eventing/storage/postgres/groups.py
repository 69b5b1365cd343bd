"""Group commit of a PostgreSQL bucket's writes (``WriteGroups``): ``write`` calls that threads of one process
make to one bucket while a transaction of theirs is running share the next transaction, rather than each
running its own.

A call that finds no transaction of the bucket running runs one at once (alone: nothing waits for a
group to fill). Calls made meanwhile queue; when that transaction has committed, the first of them runs the
next one with every call queued by then, in the order they came, and answers them all. Each call returns
only once the transaction holding its writes has committed (or raises that transaction's error: none of its
writes was then committed, or with ``StoreUnavailableError(ambiguous=True)`` all of them are in doubt
together), so an acknowledged write is durable as before; the group's writes get their seqnos in the order
of the calls, so a vBucket's order is that of the calls, as if they had run one after the other.

Every write transaction costs the client and the server about the same whatever its size (its statements,
its commit and its notification; docs/benchmarks.md, "The PostgreSQL store against the data directory"):
eight threads writing one document each at 1,000 writes/s ran 1,000 transactions a second, and now run
about one per transaction time.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from metadata.postgres.connection import PostgresDatabase

Item = tuple  # eventing.storage.postgres.writer.Item
Placed = list[Any]  # what a transaction answers, one entry per item


class _Call:
    __slots__ = ("items", "out", "error", "lead", "done")

    def __init__(self, items: Sequence[Item]):
        self.items = items
        self.out: Placed | None = None
        self.error: BaseException | None = None
        self.lead = False  # this call runs the next transaction (for itself and those queued)
        self.done = threading.Event()


class WriteGroups:
    """The queue of one bucket's ``write`` calls in this process (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queued: list[_Call] = []
        self._running = False

    def run(self, items: Sequence[Item], commit: Callable[[list[Item]], Placed]) -> Placed:
        """``commit(items)`` in one transaction, which may also hold the items of other calls (``commit``
        answers one entry per item, in order); this call's entries."""
        call = _Call(items)
        with self._lock:
            if self._running:
                self._queued.append(call)
            else:
                self._running = True
                call.lead = True
        if not call.lead:
            call.done.wait()
            if not call.lead:  # answered by the call that ran the transaction
                if call.error is not None:
                    raise call.error
                assert call.out is not None
                return call.out
        with self._lock:
            group = [call, *self._queued]
            self._queued.clear()
        try:
            self._commit(group, commit)
        finally:
            with self._lock:
                if self._queued:  # the first call queued meanwhile runs the next transaction
                    following = self._queued.pop(0)
                    following.lead = True
                    following.done.set()
                else:
                    self._running = False
        if call.error is not None:
            raise call.error
        assert call.out is not None
        return call.out

    @staticmethod
    def _commit(group: list[_Call], commit: Callable[[list[Item]], Placed]) -> None:
        items: list[Item] = [item for call in group for item in call.items]
        # The XATTRs ride as a seventh element where a call gives some (eventing.storage.writes._items): a
        # group mixing both gives every item one, None (keep the document's) where it had none.
        if any(len(item) > 6 for item in items) and any(len(item) == 6 for item in items):
            items = [item if len(item) > 6 else (*item, None) for item in items]
        try:
            placed = commit(items)
        except BaseException as exc:
            for each in group:
                each.error = exc
        else:
            start = 0
            for each in group:
                each.out = placed[start : start + len(each.items)]
                start += len(each.items)
        finally:
            for each in group:
                if not each.lead:
                    each.done.set()


_groups: dict[tuple[str, str, int, str | None, int], WriteGroups] = {}
_groups_lock = threading.Lock()


def groups_for(db: PostgresDatabase, bucket_id: int, origin: str | None) -> WriteGroups:
    """This process's queue for a bucket's writes of one origin (a forked child makes its own)."""
    key = (db.target.url, db.target.schema or "", bucket_id, origin, os.getpid())
    with _groups_lock:
        found = _groups.get(key)
        if found is None:
            found = _groups[key] = WriteGroups()
        return found
