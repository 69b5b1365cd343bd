"""The Data API's group-commit writer: the data directory's buckets opened once, and one request thread a
bucket that answers the requests queued since its last turn and makes their writes in one transaction.

On a state on a server (PostgreSQL) a bucket may have SERVER_LANES request threads, each for the keys that
hash to it: their transactions run at once, and the requests of one key still go through one thread in the
order they came. One is best there too: a transaction costs the serving process and PostgreSQL about the
same CPU whatever its size, so where the cores are the bound the largest groups give the most PUTs
(docs/benchmarks.md, "The PostgreSQL store against the data directory")."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from eventing.core.keyspaces import DEFAULT, Keyspace
from eventing.errors import ConfigError, NotFoundError, StoreLockedError, StoreUnavailableError
from eventing.http.dataapi.documents import Answer, Change, plan_op
from eventing.http.dataapi.errors import ApiError, api_error
from eventing.http.dataapi.requests import DocRequest
from eventing.storage.keyspace import Collection
from eventing.storage.protocol import DocumentChanges, FileBucket
from eventing.storage.state import State
from eventing.storage.values import Changed

MAX_GROUP = 256  # document requests of one bucket answered in one turn (their writes: one transaction)
# Request threads of a bucket on a server. A group commit waits for the server's disk flush (~2 ms on the
# development machine) and its round trips: when a transaction took five round trips, one thread's turns
# bounded PUTs to ~1,500/s there. Pipelined (two), one thread's groups grow with the load instead: 16 clients
# on two cores made ~4 PUTs a transaction and ~4,100 PUTs/s with one thread, 2,200-2,700/s with four.
SERVER_LANES = 1


class PlannedRequest(Protocol):
    """A request that plans itself on its bucket's thread (the KV port's: eventing.kv.documents.KvCall),
    taking its turns and group commits with the Data API's."""

    ks: Keyspace
    key: str

    def plan(self, coll: Collection) -> Answer | Change: ...


_SHARED: dict[str, Buckets] = {}
_SHARED_LOCK = threading.Lock()


def shared_buckets(state: State) -> Buckets:
    """The one Buckets of a state in this process: the Data API and the KV port share its open buckets and
    request threads, so their writes to one bucket take turns in one queue."""
    with _SHARED_LOCK:
        found = _SHARED.get(state.location)
        if found is None:
            found = _SHARED[state.location] = Buckets(state)
        return found


@dataclass
class _Open:
    bucket: FileBucket
    lock: threading.Lock
    inode: int


class Buckets:
    """The data directory's buckets, opened once and shared by the request threads (one lock a bucket: a
    SQLite connection runs one transaction at a time). A bucket dropped or re-created is opened again."""

    def __init__(self, state: State):
        self.state = state
        self._open: dict[str, _Open] = {}
        self._turns: dict[tuple[str, int], _Turns] = {}
        self._guard = threading.Lock()
        # A bucket file's connection runs one transaction at a time (its lock); a server's bucket takes many.
        self.lanes = SERVER_LANES if state.directory is None else 1

    def get(self, name: str) -> _Open:
        inode = self.state.bucket_token(name)
        with self._guard:
            found = self._open.get(name)
            if found is not None and found.inode == inode:
                return found
            if found is not None:
                self._open.pop(name)
                with found.lock:
                    found.bucket.close()
            if inode == -1:
                raise ApiError(
                    404,
                    "BucketNotFound",
                    f"Bucket '{name}' was not found; create it with `eventing bucket create {name}`",
                    f"/buckets/{name}",
                )
            try:
                bucket = self.state.open_bucket(name)
            except (NotFoundError, ConfigError):
                raise ApiError(
                    404,
                    "BucketNotFound",
                    f"Bucket '{name}' was not found; create it with `eventing bucket create {name}`",
                    f"/buckets/{name}",
                ) from None
            opened = _Open(bucket, threading.Lock(), inode)
            self._open[name] = opened
            return opened

    def collection(self, opened: _Open, ks: Keyspace) -> Collection:
        """The keyspace's collection (call under the bucket's lock): 404 naming the scope or collection."""
        if ks.is_default:
            return Collection(opened.bucket, ks, 0)
        registry = opened.bucket.collections()
        cid = registry.get((ks.scope, ks.collection))
        if cid is None:
            if ks.scope != DEFAULT and all(scope != ks.scope for scope, _ in registry):
                raise ApiError(
                    404,
                    "ScopeNotFound",
                    f"Scope '{ks.scope}' not found in '{ks.bucket}'; create a "
                    f"collection in it with `eventing collection create {ks.bucket}.{ks.scope}.COLLECTION`",
                    f"/buckets/{ks.bucket}/scopes/{ks.scope}",
                )
            raise ApiError(
                404,
                "CollectionNotFound",
                f"Collection '{ks.collection}' not found in '{ks.bucket}/{ks.scope}'; "
                f"create it with `eventing collection create {ks}`",
                f"/buckets/{ks.bucket}/scopes/{ks.scope}/collections/{ks.collection}",
            )
        return Collection(opened.bucket, ks, cid, mirror=opened.bucket.mirrors().get(cid))

    def run(self, ks: Keyspace, fn: Callable[[Collection], Any]) -> Any:
        """`fn(collection)` under the bucket's lock (in a request thread)."""
        opened = self.get(ks.bucket)
        with opened.lock:
            return fn(self.collection(opened, ks))

    def submit(self, req: DocRequest | PlannedRequest) -> asyncio.Future[Answer]:
        """Queue a document request for its bucket's thread; the future holds its answer (or the ApiError
        to answer), set once its write is committed."""
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        lane = (zlib.crc32(req.key.encode("utf-8", "surrogatepass")) % self.lanes) if self.lanes > 1 else 0
        with self._guard:
            turns = self._turns.get((req.ks.bucket, lane))
            if turns is None:
                turns = self._turns[(req.ks.bucket, lane)] = _Turns(self, req.ks.bucket, lane)
        turns.queue.put((req, future))
        return future

    def close(self) -> None:
        with self._guard:
            for turns in self._turns.values():
                turns.queue.put(None)
            self._turns.clear()
            for opened in self._open.values():
                with opened.lock:
                    opened.bucket.close()
            self._open.clear()


class _Turns:
    """One bucket's request thread: it takes every document request queued since its last turn (up to
    MAX_GROUP), answers the reads, and makes the writes in one transaction (a group commit: one commit
    for many concurrent writers, FileBucket.change_documents), each checked against the document as the
    writes before it left it; each request is answered only once that transaction has committed."""

    def __init__(self, buckets: Buckets, name: str, lane: int = 0):
        self.buckets, self.name = buckets, name
        self.queue: queue.SimpleQueue[tuple[DocRequest | PlannedRequest, asyncio.Future[Answer]] | None] = (
            queue.SimpleQueue()
        )
        threading.Thread(
            target=self._serve, name=f"dataapi-{name}" + (f"-{lane}" if lane else ""), daemon=True
        ).start()

    def _serve(self) -> None:
        while True:
            first = self.queue.get()
            if first is None:
                return
            group = [first]
            while len(group) < MAX_GROUP:
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self.queue.put(None)  # stop after this group
                    break
                group.append(item)
            try:
                answers = self._answer([req for req, _ in group])
            except Exception as exc:  # the bucket could not be opened, or the commit failed: all alike
                answers = [exc] * len(group)
            by_loop: dict[
                asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Answer], Answer | Exception]]
            ] = {}
            for (_, future), answer in zip(group, answers, strict=True):
                by_loop.setdefault(future.get_loop(), []).append((future, answer))
            for loop, settled in by_loop.items():
                try:
                    loop.call_soon_threadsafe(_settle, settled)
                except RuntimeError:
                    pass  # that event loop is closed: nobody waits for these answers

    def _answer(self, reqs: list[DocRequest | PlannedRequest]) -> list[Answer | Exception]:
        opened = self.buckets.get(self.name)
        # A server's bucket is used by its lanes at once (a pool of connections); a file's, by one at a time.
        with opened.lock if self.buckets.lanes == 1 else contextlib.nullcontext():
            collections: dict[Keyspace, Collection] = {}
            planned: list[Answer | Change | Exception] = []
            for req in reqs:
                try:
                    coll = collections.get(req.ks)
                    if coll is None:
                        coll = collections[req.ks] = self.buckets.collection(opened, req.ks)
                    # a KV port request plans itself (eventing.kv.documents)
                    step = plan_op(coll, req) if isinstance(req, DocRequest) else req.plan(coll)
                    if isinstance(step, Change):
                        coll.check_writable()  # a mirror's collection is read-only here
                    planned.append(step)
                except Exception as exc:
                    planned.append(api_error(exc))
            changes = [(p.key, p.change) for p in planned if isinstance(p, Change)]
            done: list[Changed | Exception] = []
            writer: DocumentChanges = opened.bucket  # the group commit: check-and-set writes
            if changes:
                try:
                    done = writer.change_documents(changes)
                except Exception as exc:
                    if len(changes) == 1 or isinstance(exc, StoreLockedError | StoreUnavailableError):
                        raise  # the store, not a write, failed: each on its own would wait as long again
                    # one write the store refused fails the transaction: make each on its own
                    done = []
                    for change in changes:
                        try:
                            done += writer.change_documents([change])
                        except Exception as one:
                            done.append(one)
        results = iter(done)
        answers: list[Answer | Exception] = []
        for p in planned:
            if isinstance(p, Change):
                result = next(results)
                try:
                    answers.append(p.answer(result) if isinstance(result, Changed) else api_error(result))
                except Exception as exc:
                    answers.append(api_error(exc))
            else:
                answers.append(p)
        return answers


def _settle(settled: list[tuple[asyncio.Future[Answer], Answer | Exception]]) -> None:
    for future, answer in settled:
        if future.done():
            continue  # the request was cancelled (its client went away); its write stands
        if isinstance(answer, Exception):
            future.set_exception(answer)
        else:
            future.set_result(answer)
