"""Who may call what over HTTP: tokens, the caller's Identity, request authentication, the bind rule, the
body size limit and the origin check.

Callers authenticate with a token (`Authorization: Bearer TOKEN`, or HTTP Basic with the token as the
password, so scripts written for Couchbase's `curl -u user:password` port) or as a user (HTTP Basic
`name:password`, as Capella's Data API does; users live in the metadata store as salted scrypt hashes,
see `eventing user add`). Without tokens and users the server only binds a loopback address and every
local caller is trusted, as a local CLI user is.

Users, passwords, Couchbase's roles and the permissions each grants are eventing.security.users'. The admin
token is `admin`, the read-only token `ro_admin`; an Identity holds the Grants of its roles, and
`authorize(request, permission, keyspace)` is the check every endpoint makes. Failed logins are limited
per user name and per client address (eventing.http.logins says what a lock holds back: never a valid
token, nor a user's right password for another's failures); a verified name and password is remembered for a
short while (by an HMAC of both under a per-process key), so a keep-alive client does not pay scrypt's
cost (~50 ms by design) on every request.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import ipaddress
import logging
import math
import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio.to_thread

from eventing.core.keyspaces import Keyspace
from eventing.errors import ConfigError, StoreLockedError
from eventing.http.logins import BASE_LOCK_S, MAX_FAILURES, LoginThrottle  # noqa: F401 - read by callers as auth.*
from eventing.security.users import (
    ADMIN,
    CLUSTER_MANAGE,
    CLUSTER_READ,
    DATA_READ,
    DATA_READER,
    DATA_WRITE,
    DATA_WRITER,
    FUNCTIONS_MANAGE,
    FUNCTIONS_READ,
    MANAGE_FUNCTIONS,
    PERMISSIONS,
    RO_ADMIN,
    SECRETS_READ,
    Grant,
    grants_of,
    has_admin_user,
    store_had_users,
    stored_users,
    verify_password,
)
from eventing.storage.state import State, as_state
from metadata.model import UserRecord

log = logging.getLogger(__name__)

ADMIN_TOKEN_ENV = "EVENTING_ADMIN_TOKEN"
READ_TOKEN_ENV = "EVENTING_READ_TOKEN"
ADMIN_TOKEN_FILE_ENV = "EVENTING_ADMIN_TOKEN_FILE"
READ_TOKEN_FILE_ENV = "EVENTING_READ_TOKEN_FILE"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8096  # Couchbase Eventing's REST port
DEFAULT_MAX_BODY = 1024 * 1024  # a handler source or a definition; larger bodies get 413
MIN_TOKEN_CHARS = 16

Role = Literal["admin", "read"]
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclass(frozen=True)
class ServerConfig:
    state: State  # the deployment's (eventing.storage.state), opened once by the command that serves
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    admin_token: str | None = None
    read_token: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY
    cors_origins: tuple[str, ...] = field(default_factory=tuple)  # closed unless listed
    # How long the Data API keeps the answer of a write sent with an Idempotency-Key
    # (eventing.http.dataapi.idempotency).
    idempotency_retention_s: float = 24 * 3600.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", as_state(self.state))  # a location given is opened here

    @classmethod
    def from_env(
        cls,
        state: State,
        *,
        admin_token_file: str | None = None,
        read_token_file: str | None = None,
        **kwargs: object,
    ) -> ServerConfig:
        """Each token not given as an argument comes from a file (`admin_token_file`, else the file named by
        $EVENTING_ADMIN_TOKEN_FILE), else from $EVENTING_ADMIN_TOKEN (the read-only token likewise). The
        token variables are then removed from this process's environment (forget_token_environment)."""
        admin = _token(
            kwargs.pop("admin_token", None), admin_token_file, ADMIN_TOKEN_FILE_ENV, ADMIN_TOKEN_ENV, "admin"
        )
        read = _token(
            kwargs.pop("read_token", None), read_token_file, READ_TOKEN_FILE_ENV, READ_TOKEN_ENV, "read-only"
        )
        forget_token_environment()
        return cls(state, admin_token=admin, read_token=read, **kwargs)  # type: ignore[arg-type]

    @property
    def secured(self) -> bool:
        return bool(self.admin_token or self.read_token)

    def check(self) -> None:
        """Refuse a configuration that would expose the API: a non-loopback bind without credentials,
        short tokens, or the same token for both roles."""
        for label, token in (("admin", self.admin_token), ("read-only", self.read_token)):
            if token is not None and len(token) < MIN_TOKEN_CHARS:
                raise ConfigError(
                    f"the {label} token is {len(token)} characters; use at least {MIN_TOKEN_CHARS} "
                    "(for example `python -c 'import secrets; print(secrets.token_urlsafe(24))'`)"
                )
        if self.admin_token and self.read_token and hmac.compare_digest(self.admin_token, self.read_token):
            raise ConfigError("the admin and read-only tokens are the same; give each role its own token")
        if not is_loopback(self.host) and not self.admin_token and not has_admin_user(self.state):
            raise ConfigError(
                f"refusing to bind {self.host} without credentials: anyone who can reach it could deploy "
                f"code; set --admin-token (or ${ADMIN_TOKEN_ENV}) and optionally --read-token, add an admin "
                f"user (`eventing user add NAME --role admin`), or bind {DEFAULT_HOST}"
            )
        if not 0 < self.max_body_bytes:
            raise ConfigError(f"--max-body {self.max_body_bytes} is not positive; give a size in bytes")


def forget_token_environment() -> None:
    """Remove $EVENTING_ADMIN_TOKEN and $EVENTING_READ_TOKEN from this process's environment (`serve` and
    `run` call it once the tokens are read), so no process it starts (Ray's workers, sandboxed handlers,
    subprocesses) inherits them and no handler reads them from `os.environ`. The kernel still shows the
    environment a process started with in /proc/<pid>/environ (to its own user and root); a token file
    (--admin-token-file, $EVENTING_ADMIN_TOKEN_FILE) keeps the token out of it."""
    for name in (ADMIN_TOKEN_ENV, READ_TOKEN_ENV):
        os.environ.pop(name, None)


def _token(given: object, path: str | None, file_env: str, env: str, label: str) -> str | None:
    """A token: as given, else read from `path` or the file $`file_env` names, else from $`env`."""
    if given:
        if path:
            raise ConfigError(f"the {label} token is given both as a flag and as a file ({path}); give one")
        return str(given)
    path = path or os.environ.get(file_env) or None
    if path is None:
        return os.environ.get(env) or None
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as exc:
        raise ConfigError(
            f"the {label} token file {path} cannot be read ({exc.strerror}); give a file holding "
            "the token (chmod 600)"
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(
            f"the {label} token file {path} is not UTF-8 text; write the token as text"
        ) from None
    if not token or "\n" in token:
        raise ConfigError(
            f"the {label} token file {path} holds {'nothing' if not token else 'several lines'}; "
            "write the token alone on one line"
        )
    return token


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def presented_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer T` or `Basic base64(user:T)` header (user name ignored)."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    scheme = scheme.lower()
    if scheme == "bearer":
        return value.strip() or None
    if scheme == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return decoded.partition(":")[2] or None
    return None


def role_of(config: ServerConfig, token: str | None) -> Role | None:
    """The role a token grants, compared in constant time against both tokens (no early exit)."""
    if not config.secured:
        return "admin"  # loopback without credentials: trusted like the local CLI
    if token is None:
        return None
    given = token.encode()
    is_admin = bool(config.admin_token) and hmac.compare_digest(given, (config.admin_token or "").encode())
    is_read = bool(config.read_token) and hmac.compare_digest(given, (config.read_token or "").encode())
    if is_admin:
        return "admin"
    if is_read:
        return "read"
    return None


def needs_admin(method: str) -> bool:
    return method.upper() in WRITE_METHODS


@dataclass(frozen=True)
class Identity:
    """Who is calling: a user, a token (`@admin-token`, `@read-token`) or a trusted local caller
    (`@local`)."""

    user: str
    grants: tuple[Grant, ...]
    kind: Literal["user", "token", "local"] = "user"

    @property
    def is_admin(self) -> bool:
        return any(g.role == ADMIN for g in self.grants)

    def can(self, permission: str, keyspace: Keyspace | str | None = None) -> bool:
        """Whether some grant allows `permission` on `keyspace` (None: on some keyspace)."""
        if isinstance(keyspace, str):
            keyspace = Keyspace.parse(keyspace)
        return any(g.allows(permission, keyspace) for g in self.grants)

    @property
    def role_header(self) -> str:
        """X-Eventing-Role: `admin`, `manage` (some functions), or `read` (the console hides changes)."""
        if self.is_admin:
            return "admin"
        return "manage" if self.can(FUNCTIONS_MANAGE) else "read"

    @property
    def changes_anything(self) -> bool:
        return any(PERMISSIONS[g.role] & {CLUSTER_MANAGE, FUNCTIONS_MANAGE, DATA_WRITE} for g in self.grants)

    def to_dict(self) -> dict[str, Any]:
        return {"user": self.user, "kind": self.kind, "roles": [str(g) for g in self.grants]}

    def check_manages(self, name: str, keyspace: Keyspace) -> None:
        """Raise AuthError(403) unless this caller manages functions whose source is `keyspace`: checked
        for the source a save gives function `name` and for the one it had, so no change takes a function
        out of another scope or moves one there."""
        if self.is_admin or self.can(FUNCTIONS_MANAGE, keyspace):
            return
        raise forbidden(self, FUNCTIONS_MANAGE, f"manage function '{name}' (source {full_name(keyspace)})")

    def check_bindings(self, definition: Any) -> None:
        """A function reads and writes through its bucket bindings whoever deploys it, so whoever saves,
        deploys or resumes it needs, for each binding's keyspace, data_reader (a read-only binding) or
        data_reader and data_writer (a read-write one, which reads too), unless the keyspace lies in a scope
        the caller manages functions of (eventing_manage_functions[bucket:scope]). Raises AuthError(403)
        naming the first binding it may not make (`definition`: a FunctionDefinition)."""
        if self.is_admin:
            return
        for b in definition.bindings:
            keyspace = b.keyspace
            if self.can(FUNCTIONS_MANAGE, keyspace):
                continue
            needed = [DATA_READ] + ([DATA_WRITE] if b.access == "rw" else [])
            if all(self.can(p, keyspace) for p in needed):
                continue
            name = full_name(keyspace)
            access = "read-write" if b.access == "rw" else "read-only"
            roles = f"{DATA_READER}[{name}]" + (f" and {DATA_WRITER}[{name}]" if b.access == "rw" else "")
            raise forbidden(
                self,
                FUNCTIONS_MANAGE,
                f"bind {name} {access} as '{b.alias}' in function '{definition.name}'",
                f"{roles}, or {MANAGE_FUNCTIONS}[{keyspace.bucket}:{keyspace.scope}]; or bind a keyspace "
                "its roles cover",
            )


ADMIN_TOKEN_IDENTITY = Identity("@admin-token", (Grant(ADMIN),), "token")
READ_TOKEN_IDENTITY = Identity("@read-token", (Grant(RO_ADMIN),), "token")
LOCAL_IDENTITY = Identity("@local", (Grant(ADMIN),), "local")


class AuthError(Exception):
    """A refused request: 401 (who?), 403 (not allowed) or 429 (too many failed logins). `body()` is the
    REST API's error shape; other endpoint families format `message`, `fix` and `headers` their way."""

    def __init__(self, status: int, message: str, fix: str, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.fix = fix
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": self.message, "fix": self.fix}


def forbidden(identity: Identity, permission: str, what: str, need: str | None = None) -> AuthError:
    roles = ", ".join(str(g) for g in identity.grants) or "none"
    need = (
        need
        or {
            CLUSTER_READ: "ro_admin or admin",
            CLUSTER_MANAGE: "admin",
            SECRETS_READ: "admin",
            FUNCTIONS_READ: f"ro_admin, admin or {MANAGE_FUNCTIONS}[bucket:scope] of its source",
            FUNCTIONS_MANAGE: f"admin or {MANAGE_FUNCTIONS}[bucket:scope] of its source",
            DATA_READ: f"{DATA_READER}[keyspace], ro_admin or admin",
            DATA_WRITE: f"{DATA_WRITER}[keyspace] or admin",
        }[permission]
    )
    return AuthError(
        403,
        f"{identity.user} may not {what} (roles: {roles})",
        f"ask an admin for a role that allows it: {need}",
    )


def full_name(keyspace: Keyspace) -> str:
    """`bucket.scope.collection`, every part written out (a 403 names exactly what a role must cover)."""
    return f"{keyspace.bucket}.{keyspace.scope}.{keyspace.collection}"


IDENTITY_SCOPE_KEY = "eventing.identity"  # where the guard leaves the caller's Identity in the ASGI scope
AUTH_ERROR_SCOPE_KEY = "eventing.auth_error"  # or, on a Data API path, the AuthError of a failed login


def caller_identity(request: Any) -> Identity:
    """The authenticated caller of a request the guard let through (for `/v1/callerIdentity`)."""
    refused = request.scope.get(AUTH_ERROR_SCOPE_KEY)
    if refused is not None:  # the Data API answers a failed login in its own error shape
        raise refused
    identity = request.scope.get(IDENTITY_SCOPE_KEY)
    if identity is None:  # only paths the guard does not protect get here
        raise AuthError(
            401,
            "this endpoint needs credentials and none were checked",
            "send `Authorization: Basic base64(user:password)` or `Authorization: Bearer TOKEN`",
        )
    return identity


def authorize(request: Any, permission: str, keyspace: Keyspace | str | None = None) -> Identity:
    """The caller's Identity when it has `permission` on `keyspace` (`bucket.scope.collection`, a Keyspace,
    or None for permissions not tied to one); raises AuthError (401 or 403) otherwise."""
    identity = caller_identity(request)
    if isinstance(keyspace, str):
        keyspace = Keyspace.parse(keyspace)
    if not identity.can(permission, keyspace):
        action = {DATA_READ: "read", DATA_WRITE: "write"}.get(permission, permission)
        raise forbidden(identity, permission, f"{action} {full_name(keyspace)}" if keyspace else action)
    return identity


LOAD_PREFIX = "/api/v1/keyspaces/"  # POST /api/v1/keyspaces/{keyspace}/load: a bulk load (data_writer)


# -- authentication ----------------------------------------------------------------------------------------

USERS_REFRESH_S = 2.0  # a user added, changed or removed counts within this long
VERIFIED_TTL_S = 60.0  # a verified name and password is not checked with scrypt again for this long
MAX_VERIFIED = 10_000
REJECTED_TTL_S = 5.0


_AUTHENTICATORS: dict[ServerConfig, Authenticator] = {}
_AUTHENTICATORS_LOCK = threading.Lock()


def authenticator_for(config: ServerConfig) -> Authenticator:
    """The one Authenticator of a server configuration (its user snapshot, remembered logins, throttle)."""
    with _AUTHENTICATORS_LOCK:
        found = _AUTHENTICATORS.get(config)
        if found is None:
            found = _AUTHENTICATORS[config] = Authenticator(config)
        return found


def presented_credentials(authorization: str | None) -> tuple[str | None, str | None]:
    """(user name, secret) of `Basic base64(user:secret)`, (None, token) of `Bearer token`, else (None,
    None)."""
    if not authorization:
        return None, None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() == "bearer":
        return None, value.strip() or None
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None, None
        user, _, secret = decoded.partition(":")
        return user or None, secret or None
    return None, None


class Authenticator:
    """Turns a request's Authorization header into an Identity, or raises AuthError (401 or 429)."""

    def __init__(
        self,
        config: ServerConfig,
        clock: Callable[[], float] = time.monotonic,
        load_users: Callable[[], list[UserRecord]] | None = None,
        users_marked: Callable[[], bool] | None = None,
    ):
        self.config = config
        self.clock = clock
        self.throttle = LoginThrottle(lambda: self.clock())
        self._load_users = load_users or (lambda: stored_users(config.state))
        # Whether the store ever had users (metadata.model.USERS_MARK): then it never goes back to taking
        # callers without credentials, not when its users are deleted, nor after this server saw users.
        self._users_marked = users_marked or (lambda: store_had_users(config.state))
        self.had_users = False
        self._users: dict[str, UserRecord] | None = None
        self._users_at = -math.inf
        self._verified: dict[bytes, float] = {}
        self._rejected: dict[bytes, float] = {}
        # A user's password checks run one at a time (a lock per user name's hash): requests sent at once
        # would otherwise each get a guess checked before the first failures lock the name.
        self._checking = [threading.Lock() for _ in range(64)]
        self._cache_key = secrets.token_bytes(32)  # per process: the cache holds no reusable password digest
        self.scrypt_runs = 0  # verifications that ran scrypt (the rest were remembered)

    def users(self) -> dict[str, UserRecord]:
        now = self.clock()
        if self._users is None or now - self._users_at >= USERS_REFRESH_S:
            try:
                self._users = {u.name: u for u in self._load_users()}
                self._users_at = now
                self.had_users = self.had_users or bool(self._users) or self._users_marked()
            except StoreLockedError:
                if self._users is None:
                    raise
        return self._users

    def secured(self) -> bool:
        return self.config.secured or bool(self.users()) or self.had_users

    def authenticate(
        self, authorization: str | None, client: str, verify: Callable[[str, str], bool] = verify_password
    ) -> Identity:
        """The caller's Identity. `verify` runs scrypt (authenticate_async runs it on a worker thread)."""
        users = self.users()
        if not (self.config.secured or users or self.had_users):
            return LOCAL_IDENTITY  # loopback without credentials: trusted like the local CLI
        user, secret = presented_credentials(authorization)
        if secret is None:
            raise AuthError(
                401,
                "this endpoint needs a token or a user's password and none was given",
                "send `Authorization: Bearer TOKEN` (the read-only token for reads, the admin token "
                "for changes), or a user's name and password by HTTP Basic (curl -u USER)",
                {"WWW-Authenticate": 'Basic realm="eventing"'},
            )
        token = _token_identity(self.config, secret)
        if token is not None:
            return token  # a valid token is never held back by others' failures (eventing.http.logins)
        keys = [f"client:{client}"] + ([f"user:{user}"] if user else [])
        if user:
            self._refuse_if_locked(
                [f"user:{user}"]
            )  # before the password is checked: no guessing past a lock
        record = users.get(user) if user else None
        checking = (
            self._checking[hash(user) % len(self._checking)]
            if record is not None and verify is not _not_here  # scrypt may run: on a worker thread
            else contextlib.nullcontext()
        )
        with checking:
            if record is not None and verify is not _not_here:
                self._refuse_if_locked([f"user:{user}"])  # again: a check just before may have locked it
            if record is not None and self._verified_now(record, secret, verify):
                self.throttle.succeeded(f"user:{user}")
                return Identity(record.name, grants_of(record), "user")
            locked = self.throttle.retry_after(keys) is not None
            guess = hmac.new(self._cache_key, f"{user}\0{secret}".encode(), hashlib.sha256).digest()
            self.throttle.failed(keys, guess)  # counted for the user name even while the client is locked
        log.warning("failed login%s from %s", f" of user {user!r}" if user else " with a token", client)
        if locked:
            self._refuse_if_locked(keys)  # a locked client's wrong credentials: 429 until its lock ends
        raise AuthError(
            401,
            "the credentials given are not accepted: neither the admin nor the read-only token, "
            "nor a user's name and password",
            "check the token (--admin-token / $EVENTING_ADMIN_TOKEN, "
            "--read-token / $EVENTING_READ_TOKEN), or the user name and password (`eventing user list`)",
            {"WWW-Authenticate": 'Basic realm="eventing"'},
        )

    def _refuse_if_locked(self, keys: list[str]) -> None:
        wait = self.throttle.retry_after(keys)
        if wait is not None:
            seconds = max(1, math.ceil(wait))
            raise AuthError(
                429,
                f"too many failed logins from this client or for this user; wait {seconds} s",
                "wait for Retry-After seconds, then check the user name and password",
                {"Retry-After": str(seconds)},
            )

    async def authenticate_async(self, authorization: str | None, client: str) -> Identity:
        """`authenticate` without blocking the event loop: a remembered login is checked here, one that needs
        scrypt on a worker thread."""
        try:
            return self.authenticate(authorization, client, _not_here)
        except _NeedsScrypt:
            return await anyio.to_thread.run_sync(self.authenticate, authorization, client)

    def _verified_now(self, record: UserRecord, password: str, verify: Callable[[str, str], bool]) -> bool:
        key = hmac.new(
            self._cache_key, "\0".join((record.name, password, record.password_hash)).encode(), hashlib.sha256
        ).digest()
        now = self.clock()
        until = self._verified.get(key)
        if until is not None and until > now:
            return True
        if self._rejected.get(key, -math.inf) > now:
            return False  # refused a moment ago (a retry, or the same request checked twice): no scrypt again
        matches = verify(password, record.password_hash)
        self.scrypt_runs += 1
        if not matches:
            if len(self._rejected) >= MAX_VERIFIED:
                self._rejected.clear()
            self._rejected[key] = now + REJECTED_TTL_S
            return False
        if len(self._verified) >= MAX_VERIFIED:
            self._verified = {k: t for k, t in self._verified.items() if t > now}
            if len(self._verified) >= MAX_VERIFIED:
                self._verified.clear()
        self._verified[key] = now + VERIFIED_TTL_S
        return True


class _NeedsScrypt(Exception):
    pass


def _not_here(password: str, encoded: str) -> bool:
    raise _NeedsScrypt


def check_guarded(identity: Identity, method: str, path: str) -> None:
    """The guard's check before the body is read: a state-changing request from a caller whose roles change
    nothing is refused, and a bulk load needs data_writer of its keyspace."""
    if identity.is_admin:
        return
    if method.upper() in WRITE_METHODS and not identity.changes_anything:
        if identity is READ_TOKEN_IDENTITY:
            raise AuthError(
                403,
                f"{method} {path} changes state and needs the admin token; the read-only token was given",
                "send the admin token (--admin-token / $EVENTING_ADMIN_TOKEN)",
            )
        if not path.startswith(LOAD_PREFIX):  # a bulk load's refusal names data_writer, below
            raise forbidden(identity, FUNCTIONS_MANAGE, f"{method} {path}: its roles change nothing")
    if path.startswith(LOAD_PREFIX):
        # The keyspace is checked where the load resolves it against the buckets that exist
        # (eventing.http.dataapi.load: `bucket.with.dots` is a bucket, not a keyspace); here, that the caller
        # may write documents at all.
        text = path[len(LOAD_PREFIX) :].rpartition("/")[0]
        if not identity.can(DATA_WRITE):
            raise load_forbidden(identity, text)


def load_forbidden(identity: Identity, where: str) -> AuthError:
    return forbidden(
        identity,
        DATA_WRITE,
        f"load documents into {where}",
        f"{DATA_WRITER}[{where}] or admin (a bulk load writes documents: no function role allows it)",
    )


def _token_identity(config: ServerConfig, secret: str) -> Identity | None:
    role = role_of(config, secret) if config.secured else None
    return {"admin": ADMIN_TOKEN_IDENTITY, "read": READ_TOKEN_IDENTITY}.get(role or "")
