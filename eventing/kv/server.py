"""The KV port (11210 by default, as Couchbase's data service): the memcached binary protocol Couchbase's SDKs
speak, served on asyncio (uvloop where installed) on a thread of `eventing serve` / `eventing run --serve`.

A connection negotiates features (HELLO), signs in (SASL: eventing.kv.sasl; the users and roles of the Data
API, eventing.security.users), selects a bucket and reads its map (eventing.kv.bootstrap). Its document
requests are planned and written on the bucket's request thread, shared with the Data API (eventing.http.
dataapi.writer), so an SDK write is a mutation like a Data API write: one group commit, the wake datagram,
functions handle it in order and exactly once. The requests of one connection run in the order sent
(document requests take their bucket's queue in that order) and are answered in that order, pipelined.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import threading
import time
from collections.abc import Awaitable
from typing import Any

from eventing.core.keyspaces import DEFAULT, WILDCARD, Keyspace
from eventing.errors import NotFoundError, StoreError
from eventing.http.auth import (
    LOCAL_IDENTITY,
    USERS_REFRESH_S,
    AuthError,
    Identity,
    ServerConfig,
    authenticator_for,
    presented_credentials,
)
from eventing.http.dataapi.errors import ApiError
from eventing.http.dataapi.writer import shared_buckets
from eventing.kv import bootstrap, sasl
from eventing.kv import protocol as p
from eventing.kv.documents import DOCUMENT_OPCODES, KvCall, KvError, MultiPathFailure
from eventing.security.users import (
    ADMIN,
    DATA_READ,
    DATA_READER,
    DATA_WRITE,
    DATA_WRITER,
    RO_ADMIN,
    SCRAM_ITERATIONS,
    ScramKeys,
    derive_keys,
    grants_of,
    stored_scram_keys,
)

log = logging.getLogger(__name__)

DEFAULT_KV_PORT = 11210
READS = frozenset({p.GET, p.GETQ, p.GETK, p.GETKQ, p.GET_META, p.SUBDOC_MULTI_LOOKUP})
READ_WRITES = frozenset({p.GAT})  # get-and-touch changes the expiry and returns the document: both roles
MAX_PENDING = 4096  # requests of one connection in flight before it stops reading
# Before it signs in, a connection sends small packets only (HELLO, SASL) and has this long to sign in: an
# unauthenticated client cannot make the server hold 21 MiB bodies on many idle connections.
PRE_AUTH_MAX_BODY = 64 << 10
PRE_AUTH_IDLE_S = 30.0
MAX_CONNECTIONS = 4096


class KvServer:
    """The KV port of one data directory; `start` binds and serves on a thread of its own."""

    def __init__(self, config: ServerConfig, kv_port: int = DEFAULT_KV_PORT):
        self.config = config
        self.node = bootstrap.Node(config.host, kv_port, config.port)
        self.buckets = shared_buckets(config.state)
        self.authenticator = authenticator_for(config)
        self._manifests: dict[str, dict[tuple[str, str], int]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None
        self._token_keys: dict[str, list[tuple[Identity, ScramKeys]]] = {}
        self._open = 0  # connections open now (MAX_CONNECTIONS)
        self._fake_salt = threading.local()

    # -- running ----------------------------------------------------------------------------------------

    def start(self) -> None:
        """Bind and serve on a daemon thread; returns once listening (OSError if the port cannot be bound)."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = _new_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(
                        self._connection, self.config.host, self.node.kv_port, limit=p.MAX_BODY, backlog=128
                    )
                )
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name="eventing-kv", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]

    def stop(self) -> None:
        loop, server = self._loop, self._server
        if loop is None or server is None:
            return

        def close() -> None:
            server.close()
            loop.stop()

        loop.call_soon_threadsafe(close)
        if self._thread is not None:
            self._thread.join(5)

    # -- one connection ---------------------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(self, writer)
        self._open += 1
        try:
            if self._open > MAX_CONNECTIONS:
                raise p.ProtocolError(f"more than {MAX_CONNECTIONS} connections are open")
            while True:
                signed_in = conn.identity is not None
                header = await asyncio.wait_for(
                    reader.readexactly(p.HEADER_SIZE), None if signed_in else PRE_AUTH_IDLE_S
                )
                total = int.from_bytes(header[8:12], "big")
                if total > (p.MAX_BODY if signed_in else PRE_AUTH_MAX_BODY):
                    raise p.ProtocolError(
                        f"a packet of {total:,} bytes is over the limit"
                        + ("" if signed_in else " of a connection not signed in")
                    )
                body = await reader.readexactly(total) if total else b""
                req = p.parse_request(header, body)
                if req.opcode in (p.QUIT, p.QUITQ):
                    break
                if signed_in and not await conn.still_allowed():
                    break  # the user was removed: its open connections end too
                await conn.handle(req)
                if len(conn.pending) > MAX_PENDING or writer.transport.get_write_buffer_size() > 4 << 20:
                    await conn.drain()
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass
        except p.ProtocolError as exc:
            log.warning("KV connection from %s closed: %s", writer.get_extra_info("peername"), exc)
        finally:
            self._open -= 1
            await conn.drain(final=True)
            writer.close()

    # -- what connections share -------------------------------------------------------------------------

    async def collections(self, bucket: str, refresh: bool = False) -> dict[tuple[str, str], int]:
        known = self._manifests.get(bucket)
        if known is not None and not refresh:
            return known
        found: dict[tuple[str, str], int] = await asyncio.to_thread(
            self.buckets.run, Keyspace(bucket), lambda c: dict(c.bucket.collections())
        )
        self._manifests[bucket] = found
        return found

    async def bucket_uuid(self, bucket: str) -> str:
        return str(await asyncio.to_thread(self.buckets.run, Keyspace(bucket), lambda c: c.bucket.uuid))

    def token_keys(self, digest: str) -> list[tuple[Identity, ScramKeys]]:
        """The SCRAM keys of the admin and read-only tokens (any user name signs in with a token)."""
        found = self._token_keys.get(digest)
        if found is None:
            from eventing.http.auth import ADMIN_TOKEN_IDENTITY, READ_TOKEN_IDENTITY

            salt = self._token_salt()
            found = [
                (identity, derive_keys(token, digest, salt))
                for identity, token in (
                    (ADMIN_TOKEN_IDENTITY, self.config.admin_token),
                    (READ_TOKEN_IDENTITY, self.config.read_token),
                )
                if token
            ]
            self._token_keys[digest] = found
        return found

    def _token_salt(self) -> bytes:
        salt = getattr(self, "_salt", None)
        if salt is None:
            import os

            salt = self._salt = os.urandom(16)
        return salt


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # uvloop is not built for every platform
        return asyncio.new_event_loop()


def may_use_bucket(identity: Identity, bucket: str) -> bool:
    """Whether some role of the caller reads or writes documents of the bucket (SELECT_BUCKET)."""
    return any(
        g.role in (ADMIN, RO_ADMIN)
        or (g.role in (DATA_READER, DATA_WRITER) and g.bucket in (WILDCARD, bucket))
        for g in identity.grants
    )


def _refuse_if_locked(authenticator: Any, keys: list[str]) -> None:
    wait = authenticator.throttle.retry_after(keys)
    if wait is not None:
        raise AuthError(
            429,
            f"too many failed logins from this client or for this user; wait {int(wait) + 1} s",
            "wait, then check the user name and password",
        )


class _Connection:
    def __init__(self, server: KvServer, writer: asyncio.StreamWriter):
        self.server = server
        self.writer = writer
        self.features: set[int] = set()
        self.identity: Identity | None = None
        self.bucket: str | None = None
        self.scram: sasl.ScramExchange | None = None
        self.scram_candidates: list[tuple[Identity, ScramKeys]] = []
        # requests in the order received: (request, answer) where the answer is the packet, or a future
        self.pending: collections.deque[tuple[p.Request, bytes | asyncio.Future[Any]]] = collections.deque()
        peer = writer.get_extra_info("peername")
        self.client = str(peer[0]) if isinstance(peer, tuple) else "unix"
        self.checked_at = 0.0  # when the signed-in user's record was last read (`still_allowed`)

    async def still_allowed(self) -> bool:
        """Whether the signed-in user still exists, its roles as they are now (read at most every
        USERS_REFRESH_S): a user removed loses its open connections, one whose roles changed has them."""
        identity = self.identity
        now = time.monotonic()
        if identity is None or identity.kind != "user" or now - self.checked_at < USERS_REFRESH_S:
            return True
        if not self.checked_at:  # just signed in: its record was read then
            self.checked_at = now
            return True
        self.checked_at = now
        try:
            users = await asyncio.to_thread(self.server.authenticator.users)
        except StoreError:  # the store is away: the connection keeps its roles until it can be read again
            return True
        record = users.get(identity.user)
        if record is None:
            log.warning("KV connection of user %r from %s closed: it was removed", identity.user, self.client)
            self.identity = None
            return False
        self.identity = Identity(record.name, grants_of(record), "user")
        return True

    # -- answers in order -------------------------------------------------------------------------------

    def answer(self, req: p.Request, item: bytes | asyncio.Future[Any]) -> None:
        self.pending.append((req, item))
        if isinstance(item, asyncio.Future) and not item.done():
            item.add_done_callback(lambda _: self.flush())
        self.flush()

    def flush(self) -> None:
        out = []
        while self.pending:
            req, item = self.pending[0]
            if isinstance(item, asyncio.Future):
                if not item.done():
                    break
                out.append(self.result(req, item))
            else:
                out.append(item)
            self.pending.popleft()
        data = b"".join(out)
        if data and not self.writer.is_closing():
            self.writer.write(data)

    def result(self, req: p.Request, future: asyncio.Future[Any]) -> bytes:
        if future.cancelled():
            return self.error(req, p.ETMPFAIL, "the request was cancelled")
        exc = future.exception()
        if exc is None:
            return future.result()[2]
        if isinstance(exc, KvError):
            return self.error(req, exc.status, exc.message)
        if isinstance(exc, MultiPathFailure):
            return p.response(
                req.opcode,
                req.opaque,
                p.SUBDOC_MULTI_PATH_FAILURE,
                value=bytes([exc.index]) + exc.status.to_bytes(2, "big"),
            )
        if isinstance(exc, ApiError):
            if exc.code in ("CollectionNotFound", "ScopeNotFound"):
                return self.error(req, p.UNKNOWN_COLLECTION, exc.message)
            if exc.code == "BucketNotFound":
                return self.error(req, p.NO_BUCKET, exc.message)
            if exc.code == "WriteRefused":  # a collection that mirrors a PostgreSQL table
                return self.error(req, p.EACCESS, exc.message)
            status = p.E2BIG if "limit" in exc.message or "larger" in exc.message else p.EINVAL
            return self.error(req, status if exc.status < 500 else p.ETMPFAIL, exc.message)
        if isinstance(exc, StoreError):  # the store's server away or failing over, a file locked, a full disk
            return self.error(req, p.ETMPFAIL, f"{exc}")
        log.error("KV request 0x%02x failed", req.opcode, exc_info=exc)
        return self.error(
            req, p.EINTERNAL, f"internal error ({type(exc).__name__}); the server log has the details"
        )

    def error(self, req: p.Request, status: int, message: str, **more: Any) -> bytes:
        if p.FEATURE_XERROR in self.features:
            body = json.dumps({"error": {"context": message}, **more}).encode() if (message or more) else b""
            return p.response(
                req.opcode, req.opaque, status, value=body, datatype=p.DATATYPE_JSON if body else 0
            )
        return p.response(req.opcode, req.opaque, status)

    async def drain(self, final: bool = False) -> None:
        while self.pending:
            req, item = self.pending[0]
            if isinstance(item, asyncio.Future) and not item.done():
                try:
                    await asyncio.wait_for(asyncio.shield(item), 30 if final else None)
                except Exception:  # its answer (an error) is written by flush
                    pass
            self.flush()
            if isinstance(item, asyncio.Future) and not item.done():
                break
        if not final and not self.writer.is_closing():
            await self.writer.drain()

    # -- requests ---------------------------------------------------------------------------------------

    async def handle(self, req: p.Request) -> None:
        try:
            await self._handle(req)
        except StoreError as exc:  # the users or the collections could not be read: the store is away or busy
            self.answer(req, self.error(req, p.ETMPFAIL, f"{exc}"))

    async def _handle(self, req: p.Request) -> None:
        op = req.opcode
        ok = lambda **fields: p.response(op, req.opaque, **fields)  # noqa: E731
        if op == p.HELLO:
            asked = {int.from_bytes(req.value[i : i + 2], "big") for i in range(0, len(req.value) - 1, 2)}
            agreed = [f for f in sorted(asked) if f in p.SUPPORTED_FEATURES]
            if p.FEATURE_ALT_REQUEST not in agreed:
                agreed = [f for f in agreed if f != p.FEATURE_SYNC_REPLICATION]
            self.features = set(agreed)
            self.answer(req, ok(value=b"".join(f.to_bytes(2, "big") for f in agreed)))
        elif op == p.NOOP:
            self.answer(req, ok())
        elif op == p.VERSION:
            self.answer(req, ok(value=bootstrap.VERSION.encode()))
        elif op == p.GET_ERROR_MAP:
            self.answer(req, ok(value=json.dumps(bootstrap.error_map()).encode(), datatype=p.DATATYPE_JSON))
        elif op == p.SASL_LIST_MECHS:
            self.answer(req, ok(value=" ".join(sasl.MECHANISMS).encode()))
        elif op in (p.SASL_AUTH, p.SASL_STEP):
            self.answer(req, await self.authenticate(req))
        elif self.identity is None:
            self.answer(req, self.error(req, p.EACCESS, "sign in first (SASL): a user's name and password"))
        elif op == p.SELECT_BUCKET:
            self.answer(req, await self.select_bucket(req))
        elif op == p.GET_CLUSTER_CONFIG:
            self.answer(req, await self.cluster_config(req))
        elif op in (p.GET_COLLECTIONS_MANIFEST, p.GET_COLLECTION_ID, p.GET_SCOPE_ID):
            self.answer(req, await self.collections(req))
        elif op in DOCUMENT_OPCODES:
            self.answer(req, await self.document(req))
        else:
            self.answer(
                req, self.error(req, p.UNKNOWN_COMMAND, f"opcode 0x{op:02x} is not served by this server")
            )

    async def authenticate(self, req: p.Request) -> bytes:
        mechanism = req.key.decode("latin-1")
        server = self.server
        try:
            if req.opcode == p.SASL_AUTH and mechanism == "PLAIN":
                plain = sasl.parse_plain(req.value)
                if plain is None:
                    return self.error(req, p.AUTH_ERROR, "the PLAIN message is malformed")
                header = "Basic " + __import__("base64").b64encode(f"{plain[0]}:{plain[1]}".encode()).decode()
                self.identity = await server.authenticator.authenticate_async(header, self.client)
                return p.response(req.opcode, req.opaque)
            if mechanism not in sasl.SCRAM_MECHANISMS:
                return self.error(
                    req,
                    p.AUTH_ERROR,
                    f"mechanism {mechanism[:40]!r} is not supported; use one of {', '.join(sasl.MECHANISMS)}",
                )
            if req.opcode == p.SASL_AUTH:
                return await self.scram_first(req, mechanism)
            return self.scram_final(req)
        except AuthError as refused:
            self.identity = None
            return self.error(req, p.AUTH_ERROR, f"{refused.message}; {refused.fix}")
        except (ValueError, UnicodeDecodeError) as exc:
            return self.error(req, p.AUTH_ERROR, f"the SASL message is malformed ({exc})")

    async def scram_first(self, req: p.Request, mechanism: str) -> bytes:
        server = self.server
        exchange = self.scram = sasl.ScramExchange(mechanism)
        digest = sasl.SCRAM_MECHANISMS[mechanism]
        users = await asyncio.to_thread(server.authenticator.users)
        # the user's name is read from the message before the salt is chosen: start with a placeholder
        probe = sasl.ScramExchange(mechanism)
        user, _ = probe.start(req.value, b"", 0)
        _refuse_if_locked(server.authenticator, [f"user:{user}"])  # a client lock holds back its guesses only
        record = users.get(user)
        candidates: list[tuple[Identity, ScramKeys]] = []
        if record is not None:
            keys = stored_scram_keys(record.password_hash, digest)
            if keys is not None:
                candidates.append((Identity(record.name, grants_of(record), "user"), keys))
        if not candidates:
            candidates = server.token_keys(digest)
        salt, iterations = (
            (candidates[0][1].salt, candidates[0][1].iterations)
            if candidates
            else (
                __import__("hashlib").sha256(user.encode() + server._token_salt()).digest()[:16],
                SCRAM_ITERATIONS,
            )
        )
        self.scram_candidates = [c for c in candidates if c[1].salt == salt]
        _, server_first = exchange.start(req.value, salt, iterations)
        return p.response(req.opcode, req.opaque, p.AUTH_CONTINUE, value=server_first)

    def scram_final(self, req: p.Request) -> bytes:
        exchange = self.scram
        if exchange is None:
            return self.error(req, p.AUTH_ERROR, "SASL step without a SASL auth before it")
        self.scram = None
        authenticator = self.server.authenticator
        if not authenticator.secured():
            self.identity = LOCAL_IDENTITY  # no credentials configured: local callers are trusted
            return p.response(req.opcode, req.opaque, value=exchange.unverified_final())
        # Checked again here, before the proof: connections that each began a sign-in before the user was
        # locked would otherwise each get a guess checked.
        _refuse_if_locked(authenticator, [f"user:{exchange.user}"])
        found = exchange.final(req.value, [keys for _, keys in self.scram_candidates])
        keys = [f"client:{self.client}", f"user:{exchange.user}"]
        if found is None:
            authenticator.throttle.failed(keys, __import__("hashlib").sha256(req.value).digest())
            _refuse_if_locked(authenticator, keys)  # a locked client's wrong proof: told to wait
            log.warning("failed KV login of user %r from %s", exchange.user, self.client)
            users = authenticator.users()
            record = users.get(exchange.user)
            hint = (
                (
                    "its password was set before SCRAM keys were kept: set it again with `eventing user add "
                    f"{exchange.user} --replace`, or sign in with PLAIN"
                )
                if record is not None and stored_scram_keys(record.password_hash, exchange.digest) is None
                else "check the user name and password (`eventing user list`)"
            )
            return self.error(req, p.AUTH_ERROR, f"authentication of '{exchange.user}' failed; {hint}")
        authenticator.throttle.succeeded(f"user:{exchange.user}")
        self.identity = self.scram_candidates[found[0]][0]
        return p.response(req.opcode, req.opaque, value=found[1])

    async def select_bucket(self, req: p.Request) -> bytes:
        name = req.key.decode("utf-8", "replace")
        assert self.identity is not None
        if not may_use_bucket(self.identity, name):
            return self.error(req, p.EACCESS, f"{self.identity.user} has no role on bucket '{name}'")
        try:
            await self.server.collections(name, refresh=True)
        except ApiError:
            return self.error(
                req,
                p.EACCESS,
                f"bucket '{name}' does not exist; create it with `eventing bucket create {name}`",
            )
        self.bucket = name
        return p.response(req.opcode, req.opaque)

    async def cluster_config(self, req: p.Request) -> bytes:
        node = self.server.node
        if self.bucket is None:
            config = bootstrap.cluster_config(node)
        else:
            try:
                collections = await self.server.collections(self.bucket)
                uuid = await self.server.bucket_uuid(self.bucket)
            except ApiError as exc:
                return self.error(req, p.NO_BUCKET, exc.message)
            config = bootstrap.bucket_config(node, self.bucket, uuid, collections)
        return p.response(req.opcode, req.opaque, value=json.dumps(config).encode(), datatype=p.DATATYPE_JSON)

    async def collections(self, req: p.Request) -> bytes:
        if self.bucket is None:
            return self.error(req, p.NO_BUCKET, "select a bucket first")
        try:
            found = await self.server.collections(self.bucket, refresh=True)
        except ApiError as exc:
            return self.error(req, p.NO_BUCKET, exc.message)
        uid = bootstrap.manifest_uid(found)
        if req.opcode == p.GET_COLLECTIONS_MANIFEST:
            return p.response(
                req.opcode,
                req.opaque,
                value=json.dumps(bootstrap.manifest(found)).encode(),
                datatype=p.DATATYPE_JSON,
            )
        path = (req.value or req.key).decode("utf-8", "replace")
        scope, _, name = path.partition(".")
        scope = scope or DEFAULT
        sids = bootstrap.scope_ids(found)
        if scope not in sids:
            return self.error(
                req,
                p.UNKNOWN_SCOPE,
                f"scope '{scope}' not found in bucket '{self.bucket}'",
                manifest_uid=f"{uid:x}",
            )
        if req.opcode == p.GET_SCOPE_ID:
            return p.response(
                req.opcode, req.opaque, extras=uid.to_bytes(8, "big") + sids[scope].to_bytes(4, "big")
            )
        name = name or DEFAULT
        cid = 0 if (scope, name) == (DEFAULT, DEFAULT) else found.get((scope, name))
        if cid is None:
            return self.error(
                req,
                p.UNKNOWN_COLLECTION,
                f"collection '{name}' not found in scope '{scope}' of bucket '{self.bucket}'",
                manifest_uid=f"{uid:x}",
            )
        return p.response(req.opcode, req.opaque, extras=uid.to_bytes(8, "big") + cid.to_bytes(4, "big"))

    async def document(self, req: p.Request) -> bytes | asyncio.Future[Any]:
        if self.bucket is None:
            return self.error(req, p.NO_BUCKET, "select a bucket first (open one with cluster.bucket(NAME))")
        cid, key = p.split_collection(req.key, p.FEATURE_COLLECTIONS in self.features)
        ks = await self.keyspace(cid)
        if ks is None:
            uid = bootstrap.manifest_uid(self.server._manifests.get(self.bucket, {}))
            return self.error(
                req,
                p.UNKNOWN_COLLECTION,
                f"no collection with id {cid:#x} in bucket '{self.bucket}'",
                manifest_uid=f"{uid:x}",
            )
        try:
            text = key.decode("utf-8")
        except UnicodeDecodeError:
            return self.error(req, p.EINVAL, "a document key is UTF-8 text")
        if not 1 <= len(key) <= 250:
            return self.error(req, p.EINVAL, "a document key is 1 to 250 bytes")
        opcode = p.QUIET.get(req.opcode, req.opcode)
        permission = DATA_READ if opcode in READS else DATA_WRITE
        assert self.identity is not None
        if opcode in READ_WRITES and not self.identity.can(DATA_READ, ks):
            permission = DATA_READ  # refused below as a read: it returns the document
        if not self.identity.can(permission, ks):
            verb = "read documents of" if permission == DATA_READ else "write documents into"
            need = "data_reader, ro_admin or admin" if permission == DATA_READ else "data_writer or admin"
            return self.error(
                req, p.EACCESS, f"{self.identity.user} may not {verb} '{ks}'; this needs {need}"
            )
        call = KvCall(
            ks,
            text,
            req,
            req.opcode,
            p.FEATURE_MUTATION_SEQNO in self.features,
            p.FEATURE_JSON in self.features,
        )
        future: Awaitable[Any] = self.server.buckets.submit(call)
        assert isinstance(future, asyncio.Future)
        return future

    async def keyspace(self, cid: int) -> Keyspace | None:
        assert self.bucket is not None
        if cid == 0:
            return Keyspace(self.bucket)
        for refresh in (False, True):
            try:
                found = await self.server.collections(self.bucket, refresh=refresh)
            except (ApiError, NotFoundError):
                return None
            for (scope, name), known in found.items():
                if known == cid:
                    return Keyspace(self.bucket, scope, name)
        return None


_NODES: dict[str, bootstrap.Node] = {}


def register_node(config: ServerConfig, kv_port: int | None) -> None:
    """What the /pools documents of this data directory advertise: this process's HTTP and KV ports (None:
    keep the KV port already registered for that HTTP server, if any)."""
    known = _NODES.get(config.state.location)
    if kv_port is None and known is not None and known.http_port == config.port:
        kv_port = known.kv_port
    _NODES[config.state.location] = bootstrap.Node(config.host, kv_port or 0, config.port)


def node_of(location: str) -> bootstrap.Node:
    from eventing.http.auth import DEFAULT_HOST, DEFAULT_PORT

    return _NODES.get(location) or bootstrap.Node(DEFAULT_HOST, 0, DEFAULT_PORT)


def start_kv_server(config: ServerConfig, kv_port: int = DEFAULT_KV_PORT) -> KvServer:
    server = KvServer(config, kv_port)
    server.start()
    register_node(config, server.node.kv_port)
    return server


__all__ = [
    "DEFAULT_KV_PORT",
    "KvServer",
    "may_use_bucket",
    "node_of",
    "presented_credentials",
    "register_node",
    "start_kv_server",
]
