"""A function's name and its namespace (Couchbase's function scope).

A function lives in the global namespace (Couchbase's `*`/`*`: every function created with this project's
CLI, Python API or format, and every function made before namespaces existed) under its plain name (`audit`),
or in the namespace of a bucket and scope under its full name `BUCKET.SCOPE.NAME` (`shop._default.audit`).
The full name is the function's key everywhere (metadata store, checkpoints, logs, workers), so two functions
of one plain name in different namespaces never meet; a plain name has no dot, so no full name is ever a plain
one. Couchbase's shapes show the plain name (`appname`) beside `function_scope`.
"""

from __future__ import annotations

import re

from eventing.errors import ConfigError

PLAIN_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,99}$")
NAMESPACE_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.%-]{0,99}$")
NAMESPACE_SCOPE = re.compile(r"^[A-Za-z0-9_%][A-Za-z0-9_%-]{0,250}$")
GLOBAL = ("*", "*")  # Couchbase's function scope of a collection-unaware (global) function


def split_name(name: str) -> tuple[str, str, str] | None:
    """`(bucket, scope, plain)` of a full name; None for a plain (global) name."""
    parts = name.rsplit(".", 2)
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else None


def plain_name(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def function_scope(name: str) -> tuple[str, str]:
    """The namespace (bucket, scope) of a function; `("*", "*")` for a global one."""
    parts = split_name(name)
    return (parts[0], parts[1]) if parts else GLOBAL


def full_name(plain: str, bucket: str, scope: str) -> str:
    """The function `plain` in namespace (bucket, scope); the plain name itself for `*`/`*`."""
    if (bucket, scope) == GLOBAL:
        return plain
    if bucket == "*" or scope == "*":
        raise ConfigError(
            f"function scope {bucket}.{scope} is not valid; give a bucket and a scope, or */* "
            "for the global namespace"
        )
    check_function_name(plain)
    if not NAMESPACE_BUCKET.match(bucket) or not NAMESPACE_SCOPE.match(scope):
        raise ConfigError(
            f"function scope {bucket!r}.{scope!r} is not valid; give a bucket name and a scope name "
            "(letters, digits, '_', '-', '%'; a bucket may also have '.')"
        )
    return f"{bucket}.{scope}.{plain}"


def check_function_name(name: object) -> None:
    """The one rule for function names (they become file names and URL path segments): a plain name, or a
    full name `BUCKET.SCOPE.NAME`."""
    if isinstance(name, str):
        parts = split_name(name)
        if parts is None and PLAIN_NAME.match(name):
            return
        if (
            parts is not None
            and PLAIN_NAME.match(parts[2])
            and NAMESPACE_SCOPE.match(parts[1])
            and NAMESPACE_BUCKET.match(parts[0])
        ):
            return
    raise ConfigError(
        f"function name {name!r} is not valid; use a letter then letters, digits, '_' or '-' (max 100), "
        "or BUCKET.SCOPE.NAME for a function in the namespace of a bucket and scope"
    )
