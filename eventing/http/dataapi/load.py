"""The streamed bulk load, `POST /api/v1/keyspaces/{keyspace}/load`: JSON lines read as they arrive and
committed in batches."""

from __future__ import annotations

import functools
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
from starlette.types import Receive, Scope, Send

from eventing.core.keyspaces import Keyspace
from eventing.core.mutation import MAX_DOCUMENT_BYTES
from eventing.errors import ConfigError, EventingError, InvalidKeyError, StoreError
from eventing.http.auth import IDENTITY_SCOPE_KEY, Identity, full_name, load_forbidden
from eventing.http.dataapi.errors import ApiError, retry_after
from eventing.http.dataapi.requests import respond_json
from eventing.http.dataapi.writer import Buckets
from eventing.ops.jsonl import rows_of_lines
from eventing.security.users import DATA_WRITE
from eventing.storage.keyspace import Collection, parse_keyspace
from eventing.storage.state import State

MAX_LINE_BYTES = 2 * MAX_DOCUMENT_BYTES  # one JSON line of the bulk load (a document and its key)
LOAD_BATCH_LINES = 20_000
LOAD_PREFIX = "/api/v1/keyspaces/"


async def serve_load(buckets: Buckets, state: State, scope: Scope, receive: Receive, send: Send) -> None:
    """POST /api/v1/keyspaces/{keyspace}/load (the guard has checked the token and the admin role)."""
    rest = scope["path"][len(LOAD_PREFIX) :]
    keyspace, _, tail = rest.rpartition("/")
    if tail != "load" or not keyspace or "/" in keyspace:
        await respond_json(
            send,
            404,
            {
                "error": f"no endpoint {scope['path']}",
                "fix": "POST JSON lines to /api/v1/keyspaces/KEYSPACE/load",
            },
        )
        return
    if scope["method"] != "POST":
        await respond_json(
            send,
            405,
            {
                "error": f"{scope['method']} is not allowed on {scope['path']}; it answers POST",
                "fix": "use POST",
            },
            {"Allow": "POST"},
        )
        return
    try:
        ks = parse_keyspace(state, keyspace)
        ks.check()
    except ConfigError as exc:
        await respond_json(send, 400, {"error": str(exc), "fix": None})
        return
    identity = scope.get(IDENTITY_SCOPE_KEY)  # set by the guard (eventing.http.app), which authenticated it
    if identity is None or not identity.can(DATA_WRITE, ks):  # the keyspace as the load resolved it
        refused = load_forbidden(identity or Identity("nobody", ()), full_name(ks))
        await respond_json(send, refused.status, refused.body())
        return
    loader = _Loader(buckets, ks)
    send_chunks, chunks = anyio.create_memory_object_stream[bytes | None](8)
    status, answer = 200, dict[str, Any]()
    async with anyio.create_task_group() as tg:

        async def feed() -> None:
            async with send_chunks:
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        loader.abandoned = True
                        break
                    if message.get("body"):
                        try:
                            await send_chunks.send(message["body"])
                        except anyio.BrokenResourceError:
                            break  # the loader stopped at a bad line: the rest is not read
                    if not message.get("more_body", False):
                        break

        tg.start_soon(feed)
        status, answer = await anyio.to_thread.run_sync(loader.run, chunks)
        tg.cancel_scope.cancel()
    await respond_json(send, status, answer, loader.headers)


class _Loader:
    """The bulk load's thread: splits the chunks into lines, parses them as `bucket load` does and commits
    batches, under the bucket's lock for each commit only."""

    def __init__(self, buckets: Buckets, ks: Keyspace):
        self.buckets, self.ks = buckets, ks
        self.lines = 0
        self.committed = 0
        self.written = 0
        self.abandoned = False
        self.error: str | None = None
        self.headers: dict[str, str] = {}  # of the answer: Retry-After when the store was away

    def _lines(self, chunks: Any) -> Any:
        partial = b""
        while True:
            chunk = anyio.from_thread.run(_receive_or_none, chunks)
            if chunk is None:
                break
            pieces = (partial + chunk).split(b"\n")
            partial = pieces.pop()
            for line in pieces:
                self.lines += 1
                yield line + b"\n"
            if len(partial) > MAX_LINE_BYTES:
                self.error = (
                    f"line {self.lines + 1}: longer than {MAX_LINE_BYTES:,} bytes; split the document"
                )
                return
        if partial.strip() and not self.abandoned:
            self.lines += 1
            yield partial

    def run(self, chunks: Any) -> tuple[int, dict[str, Any]]:
        rejected: list[str] = []
        try:
            with chunks:
                for rows in rows_of_lines(
                    self._lines(chunks), rejected, LOAD_BATCH_LINES, stop_at_bad_line=True
                ):
                    if self.abandoned:
                        break
                    self.written += self.buckets.run(
                        self.ks, functools.partial(Collection.load_rows, rows=rows)
                    )
                    self.committed += len(rows)
        except ApiError as exc:
            return exc.status, {"error": exc.message, "fix": None, "committed": self.committed}
        except (
            StoreError
        ) as exc:  # the bucket is busy, damaged or on a full disk: no line of the load is at fault
            message = str(exc)  # the CLI's line; `committed` says how many rows went in before it
            self.headers = retry_after(exc)
            return 503, {
                "error": message,
                "fix": message.rpartition("; ")[2] or None,
                "committed": self.committed,
            }
        except (EventingError, InvalidKeyError) as exc:
            rejected.append(f"{exc}")
        problem = rejected[0] if rejected else self.error
        answer: dict[str, Any] = {
            "keyspace": str(self.ks),
            "committed": self.committed,
            "written": self.written,
            "skipped": self.committed - self.written,
        }
        if problem:
            fix = "fix that line and send the lines from it on again"
            n = self.committed
            committed = (
                "nothing is committed"
                if n == 0
                else "the row before it is committed, none after"
                if n == 1
                else f"the {n:,} rows before it are committed, none after"
            )
            return 400, {"error": f"{problem}; {committed}", "fix": fix, **answer}
        return 200, answer


async def _receive_or_none(chunks: Any) -> bytes | None:
    try:
        item: bytes = await chunks.receive()
        return item
    except anyio.EndOfStream:
        return None
