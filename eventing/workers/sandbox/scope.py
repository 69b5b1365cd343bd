"""What a sandboxed worker may ask of the host: `ScopedService` answers each data request of the child
for one function from its table of calls, passing on only the calls a worker makes for its own function
(the bucket calls allowed by name in READ_CALLS, KEY_CALLS, LIST_CALLS and EFFECT_CALLS, the metadata calls
the data service serves a worker, META_CALLS), reads only in the collections
its source and bindings name, effects only in its read-write bindings under its own name, its own
application log and window row files; log rows of other collections reach the child redacted. The
function's definition reaches the child with its URL bindings' secrets masked: a request of a binding with
credentials is made here (`curl`, eventing.execution.curl.HostCurl), only to that binding's URL.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from eventing.storage import remote

READ_CALLS = frozenset(
    {
        "high_seqnos",
        "read_vb_packed",
        "max_doc_bytes",
        "get_raw",
        "get",
        "get_meta",
        "get_doc",
        "previous_doc",
        "ensure_key_index",
        "keys",
        "scan",
        "count",
        "collection_list",
        "mirror_list",
    }
)
KEY_CALLS = frozenset(
    {"get_raw", "get", "get_meta", "get_doc", "previous_doc"}
)  # first argument: a stored key
LIST_CALLS = frozenset({"keys", "scan", "count"})  # first argument: a stored-key prefix
# A window row batch as a worker names it (eventing.windows.runtime.row_writer: generation, worker,
# incarnation, counter), and the most a sandboxed worker may hand over in one (a checkpoint's rows).
_ROW_BATCH_NAME = re.compile(r"g\d+-[A-Za-z0-9_.=]+-[0-9a-f]+-\d{9,}\.arrow")
ROW_BATCH_MAX = 1 << 30  # as large as a file the child may write itself (RLIMIT_FSIZE)
EFFECT_CALLS = frozenset({"apply_effects", "effect_marks", "partition_marks", "fence"})
# What a worker asks of the metadata store, each with the function's name as first argument: the calls the
# data service serves a worker (WorkerMetadata, metadata.protocol).
META_CALLS = frozenset(remote.META_CALLS)


class ScopedService:
    """Answers a sandboxed worker of `function`: `backend` is a DataService over the files or a line to
    the cluster's data service; anything beyond the function's own data is refused.

    Scoped by collection: a document is read only in a collection the function's source or one of its
    bindings names (by its stored-key prefix, eventing.core.keyspaces), written only in a read-write
    binding's collection; log rows of the source bucket's other collections reach the worker without
    their key's user part, document or origin (it passes them over, as it would anyway)."""

    def __init__(self, function: str, defn: Any, backend: Any, *, limit_share: float = 1.0):
        self.function = function
        self.backend = backend
        self.limit_share = (
            limit_share  # of the URL bindings' limits on this machine (eventing.execution.limits)
        )
        self.defn = defn  # as stored, with its URL bindings' secrets: they stay in this process (host_curl)
        self._curl: Any = None
        self.readable = {defn.source_bucket} | {b.bucket for b in defn.bindings}
        self.writable = {b.bucket for b in defn.bindings if b.access == "rw"}
        self.read_keyspaces: dict[str, list[Any]] = {}
        for keyspace in [defn.source_keyspace, *(b.keyspace for b in defn.bindings)]:
            self.read_keyspaces.setdefault(keyspace.bucket, []).append(keyspace)
        self.write_keyspaces: dict[str, list[Any]] = {}
        for b in defn.bindings:
            if b.access == "rw":
                self.write_keyspaces.setdefault(b.bucket, []).append(b.keyspace)
        self._registry: dict[str, dict[int, tuple[str, str]]] = {}
        self._verdicts: dict[tuple[str, int, bool], bool] = {}  # (bucket, collection id, write): allowed
        # The calls a sandboxed worker may make, by name, and what answers each (check says which of their
        # arguments are the function's own): nothing else is served.
        self.calls: dict[str, Callable[..., Any]] = {
            "ping": lambda: self.backend.call("ping"),
            "bucket_info": lambda name: self.backend.call("bucket_info", name),
            "read_vb": self._read_vb,
            "read_many": self._read_many,
            "read_changed": self._read_changed,
            "bucket": self._bucket,
            "meta": self._meta,
            "app_log": lambda *args: self.backend.call("app_log", *args),
            "put_file": lambda *args: self.backend.call("put_file", *args),
            "curl": lambda *request: self.host_curl().exchange(*request),
        }

    def call(self, method: str, *args: Any) -> Any:
        self.check(method, args)  # refuses a call not in the table, and any beyond the function's own data
        return self.calls[method](*args)

    def _read_vb(self, name: str, *args: Any) -> Any:
        return self._redact_blob(name, self.backend.call("read_vb", name, *args))

    def _read_many(self, name: str, runs: list, *args: Any) -> Any:
        return self._redact_many(name, runs, self.backend.call("read_many", name, runs, *args))

    def _read_changed(self, name: str, *args: Any) -> Any:
        blob, highs, runs = self.backend.call("read_changed", name, *args)
        return (*self._redact_many(name, runs, (blob, highs)), runs)

    def _bucket(self, name: str, call: str, call_args: tuple, kwargs: dict) -> Any:
        answer = self.backend.call("bucket", name, call, call_args, kwargs)
        if call == "read_vb_packed" and answer is not None and not self._plain_default(name, answer.keys):
            return None  # the worker reads these rows with read_vb, redacted there
        if call in ("keys", "scan"):
            return [item for item in answer if self._allowed(name, item if call == "keys" else item[0])]
        return answer

    def _meta(self, method: str, call_args: tuple, kwargs: dict) -> Any:
        answer = self.backend.call("meta", method, call_args, kwargs)
        return _without_secrets(answer) if method == "get_function" else answer

    def host_curl(self) -> Any:
        """The requests of the function's URL bindings with credentials, made here: the sandboxed process
        has no secret (its definition comes masked) and asks for them by alias (eventing.execution.curl)."""
        if self._curl is None:
            from eventing.execution.curl import HostCurl
            from eventing.execution.limits import Limits

            limits = None
            if any(u.get("rate_limit") or u.get("max_in_flight") for u in self.defn.url_bindings):
                uuid = self.backend.call("bucket_info", self.defn.source_bucket)[1]
                limits = Limits(self.function, uuid, self.limit_share)
            self._curl = HostCurl(
                self.defn.url_bindings,
                self.defn.curl_max_response_bytes,
                self.defn.execution_timeout.total_seconds(),
                limits,
            )
        return self._curl

    # -- collections ------------------------------------------------------------------------------------

    def _collection(self, bucket: str, cid: int) -> tuple[str, str] | None:
        from eventing.core.keyspaces import DEFAULT

        if cid == 0:
            return DEFAULT, DEFAULT
        known = self._registry.get(bucket)
        if known is None or cid not in known:  # created since the last look (ids are never reused)
            listed = self.backend.call("bucket", bucket, "collection_list", (), {})
            known = self._list(bucket, listed)
        return known.get(cid)

    def _list(self, bucket: str, listed: list) -> dict[int, tuple[str, str]]:
        """Take a bucket's collection registry as listed now; the verdicts judged on the last one go."""
        self._verdicts.clear()
        known = self._registry[bucket] = {c: (s, n) for s, n, c in listed}
        return known

    def _allowed(self, bucket: str, key: Any, *, write: bool = False) -> bool:
        from eventing.core.keyspaces import split_stored_key

        if not isinstance(key, str):
            return False
        cid = split_stored_key(key)[0]
        verdict = self._verdicts.get((bucket, cid, write))  # judged once a collection, not once a key
        if verdict is not None:
            return verdict
        named = self._collection(bucket, cid)
        if named is None:
            return False
        from eventing.core.keyspaces import Keyspace

        scope, collection = named
        keyspaces = (self.write_keyspaces if write else self.read_keyspaces).get(bucket, [])
        verdict = any(
            k.covers(Keyspace(bucket, scope, collection)) for k in keyspaces
        )  # `scope.*`, `*.*` too
        self._verdicts[(bucket, cid, write)] = verdict
        return verdict

    def _prefix_allowed(self, bucket: str, prefix: Any) -> bool:
        from eventing.core.keyspaces import COLLECTION_MARK

        if not isinstance(prefix, str):
            return False
        if prefix.startswith(COLLECTION_MARK) and COLLECTION_MARK in prefix[1:]:
            return self._allowed(bucket, prefix)
        return self._allowed(bucket, "")  # the default collection's keys: others' are left out of the answer

    def _plain_default(self, bucket: str, keys: bytes) -> bool:
        """Whether log rows whose keys are `keys` (joined) are all of the default collection, which the
        function reads."""
        from eventing.core.keyspaces import COLLECTION_MARK

        return COLLECTION_MARK.encode() not in keys and self._allowed(bucket, "")

    def _redact(self, bucket: str, rows: Any) -> tuple[list, bool]:
        from eventing.core.keyspaces import key_prefix, split_stored_key

        out, changed = [], False
        for row in rows:
            if self._allowed(bucket, row[2]):
                out.append(row)
            else:
                changed = True
                out.append(
                    (
                        row[0],
                        row[1],
                        key_prefix(split_stored_key(row[2])[0]),
                        row[3],
                        0,
                        None,
                        None,
                        0,
                        0,
                        *row[9:10],
                        *[None for _ in row[10:11]],  # its extended attributes, redacted too
                    )
                )
        return out, changed

    def _redact_blob(self, bucket: str, blob: bytes) -> bytes:
        import msgpack

        rows, changed = self._redact(bucket, msgpack.unpackb(blob, raw=False))
        return msgpack.packb(rows, use_bin_type=True) if changed else blob

    def _redact_many(self, bucket: str, runs: list, answer: tuple) -> tuple:
        import msgpack

        from eventing.storage.rows_ahead import rows_of_columns

        blob, highs = answer
        answers, changed = msgpack.unpackb(blob, raw=False), False
        for i, ((vb, after, _), run) in enumerate(zip(runs, answers, strict=True)):
            if run[0] == 1:
                if self._plain_default(bucket, run[4]):
                    continue
                rows = rows_of_columns(vb, after, tuple(run[1:]))
                if rows is None:
                    raise EOFError("a log read cannot be scoped to the function's collections")
            else:
                rows = run[1]
            redacted, redacted_any = self._redact(bucket, rows)
            if redacted_any:  # else the run goes as it came (the blob is packed again only if one changed)
                answers[i], changed = (0, redacted), True
        return (msgpack.packb(answers, use_bin_type=True), highs) if changed else answer

    # -- what may be asked ------------------------------------------------------------------------------

    def check(self, method: str, args: tuple) -> None:
        from eventing.errors import ConfigError

        fn = self.function
        if method == "ping":
            return
        if (
            method in ("bucket_info", "read_vb", "read_many", "read_changed")
            and args
            and args[0] in self.readable
        ):
            return
        if method == "bucket" and len(args) == 4 and args[0] in self.readable:
            name, call, call_args, kwargs = args
            if call in KEY_CALLS and call_args and self._allowed(name, call_args[0]):
                return
            prefix = call_args[0] if call_args else ""
            if call in LIST_CALLS and self._prefix_allowed(name, prefix):
                if call != "count" or str(prefix).startswith("\x01") or not self._others(name):
                    return
            if call in READ_CALLS and call not in KEY_CALLS and call not in LIST_CALLS:
                return
            if (
                call in EFFECT_CALLS
                and name in self.writable
                and call_args
                and call_args[0] == fn
                and isinstance(kwargs, dict)
                and _origin_function(kwargs.get("origin")) in (None, fn)
                and (call != "apply_effects" or self._effects_allowed(name, call_args))
            ):
                return
        if method == "meta" and len(args) == 3 and args[0] in META_CALLS and args[1] and args[1][0] == fn:
            return
        if method == "app_log" and args and args[0] == fn:
            return
        if method == "curl" and len(args) == 6 and any(_hosted(u, args[0]) for u in self.defn.url_bindings):
            return
        if method == "put_file" and self._row_batch(args):
            return
        raise ConfigError(
            f"function '{fn}' runs sandboxed and may not call {method} {str(args[:2])[:120]}: "
            "it reaches only its own source, bindings, timers and log"
        )

    def _row_batch(self, args: tuple) -> bool:
        """Whether a put_file is one of this function's window row batches (a windowed function's, named as
        eventing.windows.runtime.row_writer names them, in its own incoming folder, of a bounded size):
        nothing else may be written into the data directory's file area."""
        if self.defn.window is None or len(args) != 2 or not isinstance(args[0], str):
            return False
        if not isinstance(args[1], bytes | bytearray | memoryview) or len(args[1]) > ROW_BATCH_MAX:
            return False
        parts = args[0].split("/")
        return (
            len(parts) == 4
            and parts[:3] == ["windows", self.defn.name, "incoming"]
            and _ROW_BATCH_NAME.fullmatch(parts[3]) is not None
        )

    def _others(self, bucket: str) -> bool:
        """Whether the bucket has named collections the function does not read (a count of the default
        collection's prefix "" would include their documents)."""
        self._list(bucket, self.backend.call("bucket", bucket, "collection_list", (), {}))
        return any(not self._allowed(bucket, f"\x01{cid:x}\x01") for cid in self._registry[bucket])

    def _effects_allowed(self, bucket: str, call_args: tuple) -> bool:
        """Whether every write of these effect groups is to a collection the function writes: judged once a
        collection (a key of the default one starts without the collection mark), not once a write."""
        from eventing.core.keyspaces import COLLECTION_MARK
        from eventing.storage.values import EffectGroup

        groups = call_args[1] if len(call_args) > 1 else ()
        judged: dict[str, bool] = {}
        for g in groups:
            if type(g) is not EffectGroup:
                return False
            for key in g.keys():  # from its columns as it crossed (no Write made: it is applied from them)
                if not isinstance(key, str):
                    return False
                prefix = ""
                if key.startswith(COLLECTION_MARK):
                    end = key.find(COLLECTION_MARK, 1)
                    if end < 0:
                        return False  # no collection id: not a key of any collection
                    prefix = key[: end + 1]
                verdict = judged.get(prefix)
                if verdict is None:
                    verdict = judged[prefix] = self._allowed(bucket, key, write=True)
                if not verdict:
                    return False
        return True


def _without_secrets(record: Any) -> Any:
    """A function's record as a sandboxed process gets it: its URL bindings' secrets masked."""
    from dataclasses import replace

    from eventing.core.secrets import mask_definition

    return replace(record, definition=mask_definition(record.definition)) if record is not None else None


def _origin_function(origin: Any) -> str | None:
    """The function an effect call's origin names (its deployment's writes, eventing.storage.origins); ""
    for a value that is no origin."""
    from eventing.storage.origins import origin_function

    return origin_function(origin) if origin is None or isinstance(origin, str) else ""


def _hosted(binding: dict, alias: str) -> bool:
    """Whether the host makes the requests of URL binding `alias` for the child: one with credentials (the
    child has none) or with limits shared by the function's processes (eventing.execution.curl)."""
    return binding.get("alias") == alias and (
        binding.get("auth", "none") != "none"
        or bool(binding.get("rate_limit"))
        or bool(binding.get("max_in_flight"))
    )
