"""Who may call what: tokens, the bind rule, the body size limit and the origin check.

Two roles: an admin token for every state-changing request (POST, PUT, DELETE) and a read-only token for
the rest; the admin token reads too. Tokens come from flags or the environment, never from a URL, and
travel as `Authorization: Bearer TOKEN` (or HTTP Basic with the token as the password, so scripts
written for Couchbase's `curl -u user:password` port). Without tokens the server only binds a loopback
address and every local caller is trusted, as a local CLI user is.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import os
from dataclasses import dataclass, field
from typing import Literal

from eventing.errors import ConfigError

ADMIN_TOKEN_ENV = "EVENTING_ADMIN_TOKEN"
READ_TOKEN_ENV = "EVENTING_READ_TOKEN"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8096  # Couchbase Eventing's REST port
DEFAULT_MAX_BODY = 1024 * 1024  # a handler source or a definition; larger bodies get 413
MIN_TOKEN_CHARS = 16

Role = Literal["admin", "read"]
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclass(frozen=True)
class ServerConfig:
    data_dir: str
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    admin_token: str | None = None
    read_token: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY
    cors_origins: tuple[str, ...] = field(default_factory=tuple)  # closed unless listed

    @classmethod
    def from_env(cls, data_dir: str, **kwargs: object) -> ServerConfig:
        """Tokens not given as arguments come from $EVENTING_ADMIN_TOKEN / $EVENTING_READ_TOKEN."""
        admin = kwargs.pop("admin_token", None) or os.environ.get(ADMIN_TOKEN_ENV) or None
        read = kwargs.pop("read_token", None) or os.environ.get(READ_TOKEN_ENV) or None
        return cls(data_dir, admin_token=admin, read_token=read, **kwargs)  # type: ignore[arg-type]

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
        if not is_loopback(self.host) and not self.admin_token:
            raise ConfigError(
                f"refusing to bind {self.host} without credentials: anyone who can reach it could deploy code; "
                f"set --admin-token (or ${ADMIN_TOKEN_ENV}) and optionally --read-token, or bind {DEFAULT_HOST}"
            )
        if not 0 < self.max_body_bytes:
            raise ConfigError(f"--max-body {self.max_body_bytes} is not positive; give a size in bytes")


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
