"""How a function runs on this machine (`isolation_of`): a function deployed by a full admin without an
`isolation` setting gets the machine's default, "none" (DEFAULT_ADMIN_ISOLATION) unless the service's
environment sets EVENTING_DEFAULT_ISOLATION=sandbox, which holds where the machine can sandbox (Landlock and
a seccomp filter, eventing.workers.sandbox.landlock; where it cannot, `eventing deploy` says so in one
line). A function deployed by a user who is not a full admin runs sandboxed whatever either says
(eventing.core.definition.effective_isolation). What a sandboxed one may write outside its own folder
(`granted_writes`) is decided here too.
"""

from __future__ import annotations

import os
from typing import Any

DEFAULT_ISOLATION_ENV = "EVENTING_DEFAULT_ISOLATION"


def default_isolation() -> str:
    """The isolation of a function deployed by a full admin without an `isolation` setting, here."""
    return "none" if unconfined_by_default() else "sandbox"


def unconfined_by_default() -> str | None:
    """Why a function deployed by a full admin without an `isolation` setting runs unconfined here (the
    default, or what keeps this machine from sandboxing when EVENTING_DEFAULT_ISOLATION asks for the
    sandbox), or None: it runs sandboxed."""
    from eventing.core.definition import DEFAULT_ADMIN_ISOLATION, ISOLATIONS
    from eventing.errors import ConfigError
    from eventing.workers.sandbox.landlock import sandbox_unavailable

    chosen = os.environ.get(DEFAULT_ISOLATION_ENV, "")
    if chosen and chosen not in ISOLATIONS:
        raise ConfigError(
            f"{DEFAULT_ISOLATION_ENV} is {chosen!r}; use one of {', '.join(map(repr, ISOLATIONS))}, or "
            "leave it unset (none)"
        )
    if (chosen or DEFAULT_ADMIN_ISOLATION) == "none":
        return f"none is the default ({DEFAULT_ISOLATION_ENV}=sandbox makes it sandbox)"
    why = sandbox_unavailable()
    return f"this machine cannot sandbox: {why}" if why else None


def isolation_of(defn: Any, deployed_by: dict | None) -> str:
    """How `defn` runs here: eventing.core.definition.effective_isolation with this machine's default."""
    from eventing.core.definition import effective_isolation

    return effective_isolation(defn, deployed_by, default_isolation())


def granted_writes(defn: Any, deployed_by: dict | None) -> tuple[str, ...]:
    """The folders outside its own a sandboxed function's handler may write (`sandbox_writable`): granted
    by a full admin, so honoured only while an admin (or the local CLI) deployed or resumed the function."""
    from eventing.core.definition import deployed_by_admin

    return tuple(defn.sandbox_writable) if deployed_by_admin(deployed_by) else ()
