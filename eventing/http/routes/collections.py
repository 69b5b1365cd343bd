"""The endpoints of a bucket's collections: list them, and create or drop one (admin only), by calling
eventing.ops.buckets as `eventing collection` does.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse, Response

from eventing.http.routes.request import EndpointRequest


def _collection_keyspace(c: EndpointRequest) -> Any:
    from eventing.core.keyspaces import Keyspace

    return Keyspace(c.params["bucket"], c.params["scope"], c.params["collection"]).check()


def _admin_only(c: EndpointRequest, action: str) -> Response | None:
    if c.role == "admin":
        return None
    return JSONResponse(
        {
            "error": f"{action} needs the admin role; the caller is not an admin",
            "fix": "send the admin token or an admin user's credentials",
        },
        status_code=403,
    )


def list_collections(c: EndpointRequest) -> list[dict[str, Any]]:
    from eventing.ops import buckets

    return buckets.list_collections(c.state, c.params["bucket"])


def create_collection(c: EndpointRequest) -> dict[str, Any] | Response:
    """A collection; with a JSON body {"mirror": URL, "table": "schema.table"} (and optionally "publication",
    "slot"), one that mirrors that PostgreSQL table (eventing.ops.mirrors)."""
    from eventing.errors import ConfigError
    from eventing.ops import buckets, mirrors

    refused = _admin_only(c, "creating a collection")
    if refused is not None:
        return refused
    body = c.json_object() if c.body.strip() else {}
    if not body.get("mirror"):
        return buckets.create_collection(c.state, _collection_keyspace(c))
    if not isinstance(body.get("table"), str):
        raise ConfigError('a mirror needs "table": "schema.table" beside "mirror" in the request body')
    return mirrors.create_mirror(
        c.state,
        _collection_keyspace(c),
        source=str(body["mirror"]),
        table=body["table"],
        publication=body.get("publication"),
        slot=body.get("slot"),
    )


def resync_collection(c: EndpointRequest) -> dict[str, Any] | Response:
    from eventing.ops import mirrors

    return _admin_only(c, "taking a new snapshot of a mirror") or mirrors.resync_mirror(
        c.state, str(_collection_keyspace(c))
    )


def drop_collection(c: EndpointRequest) -> dict[str, Any] | Response:
    from eventing.ops import mirrors

    return _admin_only(c, "dropping a collection") or mirrors.drop_collection(
        c.state, str(_collection_keyspace(c))
    )
