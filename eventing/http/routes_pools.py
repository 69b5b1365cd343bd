"""The cluster manager's documents Couchbase's tools and SDKs read to find the services (`/pools`,
`/pools/default`, `/pools/default/buckets[/B]`, `/pools/default/b/B`, `/pools/default/nodeServices`): one
node, with the KV port (eventing.kv) and this REST API as its management and eventing ports. The documents
are made by eventing.kv.bootstrap; cluster.read (ro_admin or admin) reads them.
"""

from __future__ import annotations

import uuid
from typing import Any

from eventing.http.routes_request import EndpointRequest


def _node(c: EndpointRequest) -> Any:
    from eventing.kv.server import node_of

    return node_of(c.data_dir)


def _cluster_uuid(data_dir: str) -> str:
    import os

    return uuid.uuid5(uuid.NAMESPACE_URL, "eventing:" + os.path.abspath(data_dir)).hex


def pools(c: EndpointRequest) -> dict[str, Any]:
    from eventing.kv import bootstrap

    return bootstrap.pools(_node(c), _cluster_uuid(c.data_dir), c.role == "admin")


def pools_default(c: EndpointRequest) -> dict[str, Any]:
    from eventing.kv import bootstrap
    from eventing.storage.files import list_buckets

    return bootstrap.pools_default(_node(c), list_buckets(c.data_dir))


def node_services(c: EndpointRequest) -> dict[str, Any]:
    from eventing.kv import bootstrap

    return bootstrap.node_services(_node(c))


def _bucket(c: EndpointRequest, name: str) -> dict[str, Any]:
    from eventing.kv import bootstrap
    from eventing.storage.factory import open_bucket
    from eventing.storage.keyspace import list_collections

    with open_bucket(c.data_dir, name) as bucket:
        collections = {(ks.scope, ks.collection): cid for ks, cid in list_collections(bucket) if cid}
        return bootstrap.bucket_info(_node(c), name, str(bucket.uuid), collections, bucket.count())


def buckets(c: EndpointRequest) -> list[dict[str, Any]]:
    from eventing.storage.files import list_buckets

    return [_bucket(c, name) for name in list_buckets(c.data_dir)]


def bucket(c: EndpointRequest) -> dict[str, Any]:
    return _bucket(c, c.params["bucket"])
