"""The cluster manager's documents Couchbase's tools and SDKs read to find the services (`/pools`,
`/pools/default`, `/pools/default/buckets[/B]`, `/pools/default/b/B`, `/pools/default/nodeServices`): one
node, with the KV port (eventing.kv) and this REST API as its management and eventing ports. The documents
are made by eventing.kv.bootstrap; cluster.read (ro_admin or admin) reads them.
"""

from __future__ import annotations

import uuid
from typing import Any

from eventing.http.routes.request import EndpointRequest


def _node(c: EndpointRequest) -> Any:
    from eventing.kv.server import node_of

    return node_of(c.state.location)


def _cluster_uuid(c: EndpointRequest) -> str:
    where = str(c.state.directory.resolve()) if c.state.directory is not None else c.state.shown
    return uuid.uuid5(uuid.NAMESPACE_URL, "eventing:" + where).hex


def pools(c: EndpointRequest) -> dict[str, Any]:
    from eventing.kv import bootstrap

    return bootstrap.pools(_node(c), _cluster_uuid(c), c.role == "admin")


def pools_default(c: EndpointRequest) -> dict[str, Any]:
    from eventing.kv import bootstrap

    return bootstrap.pools_default(_node(c), c.state.bucket_names())


def node_services(c: EndpointRequest) -> dict[str, Any]:
    from eventing.kv import bootstrap

    return bootstrap.node_services(_node(c))


def _bucket(c: EndpointRequest, name: str) -> dict[str, Any]:
    from eventing.kv import bootstrap
    from eventing.storage.keyspace import list_collections

    with c.state.open_bucket(name) as bucket:
        collections = {(ks.scope, ks.collection): cid for ks, cid in list_collections(bucket) if cid}
        return bootstrap.bucket_info(_node(c), name, str(bucket.uuid), collections, bucket.count())


def buckets(c: EndpointRequest) -> list[dict[str, Any]]:
    return [_bucket(c, name) for name in c.state.bucket_names()]


def bucket(c: EndpointRequest) -> dict[str, Any]:
    return _bucket(c, c.params["bucket"])
