"""Users and roles: how a password is kept and checked, what a user name may be, Couchbase's roles over
keyspaces and the permissions each grants, and the users of a deployment's metadata store.

A user's password is kept as a salted scrypt hash (`hash_password`, checked by `verify_password`; the
parameters are kept with the hash), followed by the SCRAM keys the KV port's SASL checks (`scram_secrets`:
they cannot be derived from the scrypt hash, so they are kept beside it, one `;`-separated part a
mechanism, as Couchbase keeps its own). A user whose password was set before those keys were kept has none:
it signs in over PLAIN or by HTTP, and over SCRAM once its password is set again.

Roles are Couchbase's, scoped to keyspaces (`*` for any part):

    admin                                   everything
    ro_admin                                read everything but secrets; change nothing
    eventing_manage_functions[bucket:scope] read and manage the functions whose source is in bucket.scope
    data_reader[bucket.scope.collection]    read documents of those keyspaces (Data API, KV port)
    data_writer[bucket.scope.collection]    write documents of those keyspaces (Data API, KV port)

A role grants permissions (PERMISSIONS); a `Grant` is one role over its keyspace. Who is calling and how a
request is checked is the HTTP layer's (eventing.http.auth); `eventing user` (eventing.cli.users) adds,
lists and removes users.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from eventing.core.keyspaces import WILDCARD, Keyspace
from eventing.errors import ConfigError
from eventing.storage.state import State
from metadata.model import UserRecord

log = logging.getLogger(__name__)

# -- passwords: salted scrypt, parameters kept with the hash -----------------------------------------------

SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1  # ~50 ms a verification: slow for a guesser, once per client
SALT_BYTES = 16
MIN_PASSWORD_CHARS = 8
_USER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@%+-]{0,127}$")


def hash_password(password: str) -> str:
    """`scrypt$N$r$p$salt$hash` (base64), with a fresh random 16-byte salt, then the SCRAM keys the KV port's
    SASL needs (`;scram-sha512$...`: scram_secrets)."""
    salt = os.urandom(SALT_BYTES)
    digest = _scrypt(password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    b64 = base64.b64encode
    return (
        f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${b64(salt).decode()}${b64(digest).decode()}"
        + scram_secrets(password)
    )


def verify_password(password: str, encoded: str) -> bool:
    """Whether `password` matches a stored `hash_password` value (constant-time comparison). A password with
    a NUL never does: scrypt's HMAC pads a short key with zero bytes, so `password\0` would hash as
    `password` (no password may hold one, see check_password)."""
    if "\0" in password:
        return False
    try:
        scheme, n, r, p, salt, digest = encoded.split(";")[0].split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(digest)
        got = _scrypt(password, base64.b64decode(salt), int(n), int(r), int(p), len(expected))
    except (ValueError, binascii.Error):
        return False
    return hmac.compare_digest(got, expected)


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int, length: int = 32) -> bytes:
    return hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=n, r=r, p=p, maxmem=256 * n * r, dklen=length
    )


def check_user_name(name: str) -> str:
    if not isinstance(name, str) or not _USER_NAME.match(name):
        raise ConfigError(
            f"user name {name!r} is not valid; use 1-128 letters, digits, '_', '.', '@', '%', '+' "
            "or '-', starting with a letter or digit"
        )
    return name


def check_password(password: str) -> str:
    if "\0" in password:
        raise ConfigError("the password holds a NUL character; use printable characters")
    if len(password) < MIN_PASSWORD_CHARS:
        raise ConfigError(f"the password is {len(password)} characters; use at least {MIN_PASSWORD_CHARS}")
    return password


# -- SCRAM keys kept with the password (RFC 5802), for the KV port's SASL (eventing.kv.sasl) -----------------

SCRAM_ITERATIONS = 15_000  # Couchbase's default


@dataclass(frozen=True)
class ScramKeys:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def derive_keys(password: str, digest: str, salt: bytes, iterations: int | None = None) -> ScramKeys:
    iterations = SCRAM_ITERATIONS if iterations is None else iterations
    salted = hashlib.pbkdf2_hmac(digest, password.encode("utf-8"), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    server_key = hmac.new(salted, b"Server Key", digest).digest()
    return ScramKeys(salt, iterations, hashlib.new(digest, client_key).digest(), server_key)


def scram_secrets(password: str) -> str:
    """The SCRAM keys of a password for every mechanism: `;scram-sha512$ITER$SALT$STOREDKEY$SERVERKEY;...`."""
    parts = []
    for digest in ("sha512", "sha256", "sha1"):
        keys = derive_keys(password, digest, os.urandom(16))
        b64 = base64.b64encode
        parts.append(
            f"scram-{digest}${keys.iterations}${b64(keys.salt).decode()}${b64(keys.stored_key).decode()}"
            f"${b64(keys.server_key).decode()}"
        )
    return "".join(";" + p for p in parts)


def stored_scram_keys(password_hash: str, digest: str) -> ScramKeys | None:
    """The keys of one mechanism kept in a user's stored hash, or None (a password set before they were
    kept)."""
    for part in password_hash.split(";")[1:]:
        try:
            name, iterations, salt, stored, server = part.split("$")
            if name == f"scram-{digest}":
                return ScramKeys(
                    base64.b64decode(salt),
                    int(iterations),
                    base64.b64decode(stored),
                    base64.b64decode(server),
                )
        except (ValueError, binascii.Error):
            continue
    return None


# -- roles and permissions ------------------------------------------------------------------------------

ADMIN, RO_ADMIN = "admin", "ro_admin"
MANAGE_FUNCTIONS, DATA_READER, DATA_WRITER = "eventing_manage_functions", "data_reader", "data_writer"
SCOPED_ROLES = {MANAGE_FUNCTIONS: 2, DATA_READER: 3, DATA_WRITER: 3}  # role -> parts of its keyspace

# What an endpoint asks for. A keyspace-scoped permission is checked against the keyspace it acts on: the
# function's source (bucket.scope) for the functions permissions, the documents' keyspace for data.
CLUSTER_READ = "cluster.read"  # nodes, rebalance, status of every function, metrics
CLUSTER_MANAGE = "cluster.manage"  # add or remove nodes, rebalance
FUNCTIONS_READ = "functions.read"  # a function's definition (secrets masked), stats, logs, dead letters
FUNCTIONS_MANAGE = "functions.manage"  # create, change, deploy, pause, resume, undeploy, delete; replay
SECRETS_READ = "secrets.read"  # URL binding secrets in clear
DATA_READ = "data.read"  # read documents
DATA_WRITE = "data.write"  # write documents
PERMISSIONS: dict[str, frozenset[str]] = {
    ADMIN: frozenset(
        {CLUSTER_READ, CLUSTER_MANAGE, FUNCTIONS_READ, FUNCTIONS_MANAGE, SECRETS_READ, DATA_READ, DATA_WRITE}
    ),
    RO_ADMIN: frozenset({CLUSTER_READ, FUNCTIONS_READ, DATA_READ}),
    MANAGE_FUNCTIONS: frozenset({FUNCTIONS_READ, FUNCTIONS_MANAGE}),
    DATA_READER: frozenset({DATA_READ}),
    DATA_WRITER: frozenset({DATA_WRITE}),
}


@dataclass(frozen=True)
class Grant:
    """One role, over `bucket.scope.collection` (each part a name or `*`); admin and ro_admin cover all."""

    role: str
    bucket: str = WILDCARD
    scope: str = WILDCARD
    collection: str = WILDCARD

    @classmethod
    def parse(cls, text: str) -> Grant:
        """`admin`, `ro_admin`, `eventing_manage_functions[bucket:scope]`,
        `data_reader[bucket.scope.collection]` (parts separated by `:` as Couchbase writes them, or by `.`;
        missing trailing parts are `*`)."""
        raw = text.strip() if isinstance(text, str) else ""
        match = re.fullmatch(r"([a-z_]+)(?:\[([^\]]*)\])?", raw)
        known = (
            f"{ADMIN}, {RO_ADMIN}, {MANAGE_FUNCTIONS}[bucket:scope], {DATA_READER}[bucket.scope.collection], "
            f"{DATA_WRITER}[bucket.scope.collection]"
        )
        if not match or match.group(1) not in PERMISSIONS:
            raise ConfigError(f"role {text!r} is not known; use one of {known} (`*` for any part)")
        role, target = match.groups()
        if role not in SCOPED_ROLES:
            if target is not None:
                raise ConfigError(f"role {role} covers everything and takes no keyspace; write it as {role}")
            return cls(role)
        if not target:
            raise ConfigError(
                f"role {role} needs a keyspace, e.g. "
                f"{role}[{'shop:sales' if role == MANAGE_FUNCTIONS else 'shop.sales.*'}] (`*` for any part)"
            )
        parts = target.split(":") if ":" in target else target.split(".")
        if len(parts) > SCOPED_ROLES[role] or not all(parts):
            raise ConfigError(
                f"role {text!r} names {target!r}; give at most {SCOPED_ROLES[role]} non-empty parts "
                f"({'bucket:scope' if role == MANAGE_FUNCTIONS else 'bucket.scope.collection'}, `*` for any "
                "part)"
            )
        parts += [WILDCARD] * (3 - len(parts))
        return cls(role, *parts)

    def __str__(self) -> str:
        if self.role not in SCOPED_ROLES:
            return self.role
        if self.role == MANAGE_FUNCTIONS:
            return f"{self.role}[{self.bucket}:{self.scope}]"
        return f"{self.role}[{self.bucket}.{self.scope}.{self.collection}]"

    def covers(self, keyspace: Keyspace | None) -> bool:
        """Whether this grant's keyspace holds `keyspace` (None: "some keyspace", true for any grant)."""
        if keyspace is None or self.role not in SCOPED_ROLES:
            return True
        wanted = (keyspace.bucket, keyspace.scope, keyspace.collection)
        mine = (self.bucket, self.scope, self.collection)
        return all(m == WILDCARD or m == w for m, w in zip(mine, wanted, strict=True))

    def allows(self, permission: str, keyspace: Keyspace | None) -> bool:
        return permission in PERMISSIONS[self.role] and self.covers(keyspace)


def parse_roles(roles: Sequence[str]) -> tuple[Grant, ...]:
    if not roles:
        raise ConfigError("a user needs at least one role; give --role, e.g. --role ro_admin")
    return tuple(Grant.parse(r) for r in roles)


def grants_of(record: UserRecord) -> tuple[Grant, ...]:
    """The Grants of a stored user's roles (a role not known is logged and grants nothing)."""
    grants = []
    for role in record.roles:
        try:
            grants.append(Grant.parse(role))
        except ConfigError:
            log.warning("user %r has an unknown role %r; it grants nothing", record.name, role)
    return tuple(grants)


# -- the users of a deployment's metadata store -------------------------------------------------------


def stored_users(state: State) -> list[UserRecord]:
    if not state.exists():
        return []
    return state.metadata.list_users()


def store_had_users(state: State) -> bool:
    """Whether the store ever had a user (metadata.model.USERS_MARK), deleted since or not."""
    from metadata import USERS_MARK

    if not state.exists():
        return False
    return state.metadata.get_kv(USERS_MARK) is not None


def has_admin_user(state: State) -> bool:
    try:
        return any(any(r == ADMIN for r in u.roles) for u in stored_users(state))
    except Exception:  # an unreadable store is no credential; the bind is refused with the usual message
        return False
