"""Who may do what to functions over the REST API, on top of the roles of eventing.security.users: each
endpoint's check against the keyspace of the function it acts on (`authorize_endpoint`), the listings cut
to the functions a caller covers, and what a function's bindings ask of whoever saves, deploys or resumes
it (`check_bindings`), with the deployer recorded on the function (`deploying_as`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from eventing.core.function_names import full_name
from eventing.core.keyspaces import Keyspace
from eventing.errors import EventingError, NotFoundError
from eventing.http.auth import WRITE_METHODS, Identity, forbidden
from eventing.security.users import (
    CLUSTER_MANAGE,
    CLUSTER_READ,
    FUNCTIONS_MANAGE,
    FUNCTIONS_READ,
    SECRETS_READ,
)
from eventing.storage.state import State
from metadata.model import FunctionRecord

# -- endpoints of the REST API ---------------------------------------------------------------------------

LISTINGS = frozenset(
    {
        "/api/v1/functions",
        "/api/v1/status",
        "/api/v1/stats",
        "/api/v1/export",
        "/api/v1/list/functions",
        "/api/v1/list/functions/query",
        "/getDeployedApps",
        "/getRunningApps",
    }
)
CLUSTER_PREFIXES = (
    "/api/v1/nodes",
    "/api/v1/rebalance",
    "/api/v1/buckets",
    "/metrics",
    "/api/v1/config",
    "/pools",
)
CREATES = frozenset({"/api/v1/import", "/api/v1/functions"})  # a POST body of functions, one or a list
# DELETE /api/v1/functions deletes only what its caller manages (eventing.http.routes.couchbase_stats).


SOURCE_FIELDS = ("source_bucket", "source_scope", "source_collection")
# Writes whose body changes a function's definition (its source among it): checked for the source they give.
CHANGES = frozenset(
    {"/api/v1/functions/{name}", "/api/v1/functions/{name}/settings", "/api/v1/functions/{name}/config"}
)


def _named(params: Mapping[str, str], query: Mapping[str, str], state: State) -> list[str]:
    """Every function a request names (the path's, and each of the query's `name` and `appName`: an
    endpoint may read either), a query's resolved in its namespace; [""] when it names none."""
    if params.get("name"):
        return [params["name"]]
    names: list[str] = []
    for given in (query.get("name"), query.get("appName")):
        if not given:
            continue
        from eventing.http.routes.request import resolve_name

        try:
            given = resolve_name(state, given, dict(query))
        except EventingError:
            pass  # the endpoint answers the bad parameter
        if given not in names:
            names.append(given)
    return names or [""]


def function_keyspace(definition: Mapping[str, Any]) -> Keyspace:
    """The keyspace of a function's source (`source_bucket`, with `source_scope`/`source_collection` when
    given, or `source_bucket` written as `bucket.scope.collection`)."""
    bucket = str(definition.get("source_bucket") or "")
    if definition.get("source_scope") or definition.get("source_collection"):
        return Keyspace.of(bucket, definition.get("source_scope"), definition.get("source_collection"))
    return Keyspace.parse(bucket) if bucket else Keyspace("")


def authorize_endpoint(
    identity: Identity,
    method: str,
    path: str,
    params: Mapping[str, str],
    query: Mapping[str, str],
    body: Any,
    state: State,
) -> None:
    """Raise AuthError(403) unless `identity` may call REST endpoint `method path` (its template) with
    these parameters; a function's permissions are checked against its stored source and, for a change,
    the source the request would give it. Reads the metadata store (call it off the event loop)."""
    if identity.is_admin or path == "/api/v1/openapi.json":
        return
    write = method.upper() in WRITE_METHODS
    if path == "/api/v1/export" and query.get("secrets", "").strip().lower() in ("1", "true", "yes"):
        raise forbidden(identity, SECRETS_READ, "read URL binding secrets in clear (secrets=true)")
    if (
        path.startswith(CLUSTER_PREFIXES)
        or path in LISTINGS
        and not write
        and not (path == "/api/v1/export" and query.get("name"))
    ):
        if path in LISTINGS and identity.can(FUNCTIONS_READ):
            return  # the listing shows only the functions this caller covers (visible_functions)
        permission = CLUSTER_MANAGE if write else CLUSTER_READ
        if not identity.can(permission):
            raise forbidden(identity, permission, f"{method} {path}")
        return
    permission = FUNCTIONS_MANAGE if write else FUNCTIONS_READ
    if not identity.can(permission):
        raise forbidden(identity, permission, f"{method} {path}")
    targets: list[tuple[str, dict | None]]
    from eventing.core.couchbase_format import keyspace_fields

    if path in CREATES and method.upper() == "POST":
        items = body if isinstance(body, list) else [body]
        targets = [
            (str(keyspace_fields(d).get("name", "")), keyspace_fields(d))
            for d in items
            if isinstance(d, dict)
        ]
    else:
        names = _named(params, query, state)
        new = None
        if write and isinstance(body, dict) and path in CHANGES:
            if path.endswith("/config"):  # the body is a depcfg: the source it would give the function
                new = {k: body[k] for k in SOURCE_FIELDS if k in body}
            else:
                fields = keyspace_fields({**body, "appname": names[0]} if "appname" in body else body)
                named = str(fields.get("name") or "")
                if named and named not in names:  # a body whose namespace names another function
                    names.append(named)
                new = {k: v for k, v in fields.items() if k != "name"}
        targets = [(name, new) for name in names]
    store = state.metadata if state.exists() else None
    for name, new in targets:
        try:
            stored = store.get_function(name).definition if store is not None and name else None
        except NotFoundError:
            stored = None
        for definition in (stored, {**(stored or {}), **new} if new is not None else None):
            if definition is not None and not identity.can(permission, function_keyspace(definition)):
                verb = "manage" if write else "read"
                raise forbidden(
                    identity, permission, f"{verb} function '{name}' (source {function_keyspace(definition)})"
                )


def visible_functions(identity: Identity, state: State) -> set[str] | None:
    """The functions a listing shows this caller: None for every one (ro_admin, admin), else those whose
    source its eventing_manage_functions roles cover."""
    if identity.can(CLUSTER_READ):
        return None
    if not state.exists():
        return set()
    store = state.metadata
    return {
        r.name
        for r in store.list_functions()
        if identity.can(FUNCTIONS_READ, function_keyspace(r.definition))
    }


def filter_listing(result: Any, visible: set[str] | None) -> Any:
    """A listing endpoint's result (a list of functions, or `{"apps": [...]}`) cut to the visible
    functions."""
    if visible is None:
        return result

    def shown(item: Any) -> bool:
        if not isinstance(item, dict):
            return False
        name = str(item.get("name") or item.get("function_name") or item.get("appname") or "")
        scope = item.get("function_scope")
        if (
            isinstance(scope, dict) and "." not in name
        ):  # Couchbase's shapes: the plain name beside its namespace
            name = full_name(name, str(scope.get("bucket")), str(scope.get("scope")))
        return name in visible

    if isinstance(result, dict) and isinstance(result.get("functions"), list):  # /api/v1/list/functions
        return {**result, "functions": [n for n in result["functions"] if n in visible]}
    if isinstance(result, dict) and all(
        isinstance(v, str) for v in result.values()
    ):  # getDeployedApps: name -> ""
        return {k: v for k, v in result.items() if k in visible}
    if isinstance(result, list):
        return [item for item in result if shown(item)]
    if isinstance(result, dict) and isinstance(result.get("apps"), list):
        return {**result, "apps": [a for a in result["apps"] if shown(a)]}
    if isinstance(result, dict) and isinstance(
        result.get("app"), dict
    ):  # /api/v1/status/NAME: checked already
        return result
    return result


# -- bindings and deployers ------------------------------------------------------------------------------


def check_bindings(identity: Identity, definition: Any) -> None:
    """Whoever saves, deploys or resumes a function needs a role for each bucket binding
    (Identity.check_bindings)."""
    identity.check_bindings(definition)


def deployed_by_admin(record: FunctionRecord) -> bool:
    """Whether a function was last deployed or resumed by a full admin (or only through the local CLI,
    trusted as one); a function a non-admin deployed runs sandboxed."""
    from eventing.core.definition import deployed_by_admin as admin_deployed

    return admin_deployed(record.deployed_by)


@contextmanager
def deploying_as(state: State, name: str, identity: Identity) -> Iterator[None]:
    """Record `identity` as the deployer of function `name` before its code starts (so a non-admin's code
    never runs recorded as an admin's), and put the previous record back if the deploy or resume fails.
    A caller whose roles do not cover every bucket binding of the function is refused first (403)."""
    from eventing.core.definition import FunctionDefinition

    with state.metadata as store:
        record = store.get_function(name)
        previous = record.deployed_by
        if not identity.is_admin:
            check_bindings(identity, FunctionDefinition.from_dict(record.definition))
        store.set_deployed_by(name, {"user": identity.user, "admin": identity.is_admin, "at": time.time()})
        try:
            yield
        except BaseException:
            store.set_deployed_by(name, previous)
            raise
