"""What Couchbase's SDKs and tools read to find their way: the cluster map a KV connection asks for
(GET_CLUSTER_CONFIG: one node, this system's 1,024 vBuckets all on it), a bucket's collections manifest, the
error map (GET_ERROR_MAP), and the cluster manager's documents served over HTTP (/pools, /pools/default,
/pools/default/buckets/B, /pools/default/nodeServices).

Ports are advertised under the address the servers listen on (127.0.0.1 by default), never a host name.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any

from eventing.core.keyspaces import DEFAULT, NUM_VBUCKETS
from eventing.kv import protocol as p

VERSION = "7.6.0-0000-enterprise"  # the Couchbase Server release whose interfaces this system answers
BUCKET_CAPABILITIES = [
    "collections",
    "durableWrite",
    "tombstonedUserXAttrs",
    "dcp",
    "cbhello",
    "touch",
    "cccp",
    "xattr",
    "nodesExt",
    "subdoc.DocumentMacroSupport",
    "preserve_expiry",
]


@dataclass(frozen=True)
class Node:
    """Where this node's services listen: the address, the KV port and the HTTP port (REST API, eventing)."""

    host: str
    kv_port: int
    http_port: int

    @property
    def advertised(self) -> str:
        return "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host

    def services(self) -> dict[str, int]:
        kv = {"kv": self.kv_port} if self.kv_port else {}  # no KV port: started with --kv-port 0
        return {**kv, "mgmt": self.http_port, "eventingAdminPort": self.http_port}

    def node_ext(self) -> dict[str, Any]:
        return {"services": self.services(), "thisNode": True, "hostname": self.advertised}


def manifest_uid(collections: dict[tuple[str, str], int]) -> int:
    """A bucket's manifest uid: 0 for the default collection alone, else changed by every create or drop."""
    if not collections:
        return 0
    return zlib.crc32(json.dumps(sorted((s, c, i) for (s, c), i in collections.items())).encode()) or 1


def scope_ids(collections: dict[tuple[str, str], int]) -> dict[str, int]:
    """Scope ids: 0 for `_default`, then 8 onwards in the order their first collection was made."""
    ids = {DEFAULT: 0}
    for (scope, _), _cid in sorted(collections.items(), key=lambda item: item[1]):
        if scope not in ids:
            ids[scope] = 8 + len(ids) - 1
    return ids


def manifest(collections: dict[tuple[str, str], int]) -> dict[str, Any]:
    sids = scope_ids(collections)
    scopes: dict[str, list[dict[str, Any]]] = {name: [] for name in sids}
    scopes[DEFAULT].append({"name": DEFAULT, "uid": "0"})
    for (scope, name), cid in sorted(collections.items(), key=lambda item: item[1]):
        scopes[scope].append({"name": name, "uid": f"{cid:x}", "maxTTL": 0})
    return {
        "uid": f"{manifest_uid(collections):x}",
        "scopes": [
            {"name": name, "uid": f"{sids[name]:x}", "collections": cols} for name, cols in scopes.items()
        ],
    }


def cluster_config(node: Node) -> dict[str, Any]:
    """The cluster map without a bucket (a connection that selected none)."""
    return {
        "rev": 1,
        "revEpoch": 1,
        "nodesExt": [node.node_ext()],
        "clusterCapabilitiesVer": [1, 0],
        "clusterCapabilities": {},
    }


def bucket_config(
    node: Node, bucket: str, uuid: str, collections: dict[tuple[str, str], int]
) -> dict[str, Any]:
    """A bucket's map: every vBucket on this one node, no replicas; the SDK hashes keys with CRC32 as
    sharding.vbucket does, so it sends each key to the vBucket this system keeps it in."""
    server = f"{node.advertised}:{node.kv_port}"
    return {
        "rev": 1,
        "revEpoch": 1,
        "name": bucket,
        "uuid": uuid,
        "nodeLocator": "vbucket",
        "bucketType": "membase",
        "uri": f"/pools/default/buckets/{bucket}?bucket_uuid={uuid}",
        "streamingUri": f"/pools/default/bucketsStreaming/{bucket}?bucket_uuid={uuid}",
        "collectionsManifestUid": f"{manifest_uid(collections):x}",
        "ddocs": {"uri": f"/pools/default/buckets/{bucket}/ddocs"},
        "bucketCapabilitiesVer": "",
        "bucketCapabilities": BUCKET_CAPABILITIES,
        "nodes": [
            {
                "couchApiBase": f"http://{node.advertised}:{node.http_port}/{bucket}",
                "hostname": f"{node.advertised}:{node.http_port}",
                "ports": {"direct": node.kv_port},
                "thisNode": True,
            }
        ],
        "nodesExt": [node.node_ext()],
        "vBucketServerMap": {
            "hashAlgorithm": "CRC",
            "numReplicas": 0,
            "serverList": [server],
            "vBucketMap": [[0]] * NUM_VBUCKETS,
        },
        "clusterCapabilitiesVer": [1, 0],
        "clusterCapabilities": {},
    }


_ERRORS: dict[int, tuple[str, str, list[str]]] = {
    p.SUCCESS: ("SUCCESS", "Success", ["success"]),
    p.KEY_ENOENT: ("KEY_ENOENT", "Not Found", ["item-only"]),
    p.KEY_EEXISTS: ("KEY_EEXISTS", "key already exists, or CAS mismatch", ["item-only"]),
    p.E2BIG: ("E2BIG", "Value is too big", ["invalid-input"]),
    p.EINVAL: ("EINVAL", "Invalid packet", ["internal", "invalid-input"]),
    p.NOT_STORED: ("NOT_STORED", "Not Stored", ["item-only"]),
    p.DELTA_BADVAL: ("DELTA_BADVAL", "Existing document not a number", ["invalid-input"]),
    p.NOT_MY_VBUCKET: (
        "NOT_MY_VBUCKET",
        "Server which received this command does not own the vBucket",
        ["fetch-config", "retry-now"],
    ),
    p.NO_BUCKET: ("NO_BUCKET", "Not connected to a bucket", ["conn-state-invalidated"]),
    p.AUTH_ERROR: ("AUTH_ERROR", "Authentication failed", ["auth", "conn-state-invalidated"]),
    p.AUTH_CONTINUE: ("AUTH_CONTINUE", "Authentication continue", ["auth", "special-handling"]),
    p.EACCESS: ("EACCESS", "No access", ["item-only", "auth"]),
    p.UNKNOWN_FRAME_INFO: ("UNKNOWN_FRAME_INFO", "Unknown frame info", ["support", "invalid-input"]),
    p.UNKNOWN_COMMAND: ("UNKNOWN_COMMAND", "Unknown command", ["support"]),
    p.NOT_SUPPORTED: ("NOT_SUPPORTED", "Not supported", ["support"]),
    p.EINTERNAL: ("EINTERNAL", "Internal error", ["internal"]),
    p.ETMPFAIL: ("ETMPFAIL", "Temporary failure", ["temp", "retry-later"]),
    p.UNKNOWN_COLLECTION: ("UNKNOWN_COLLECTION", "Unknown Collection", ["item-only", "fetch-config"]),
    p.UNKNOWN_SCOPE: ("UNKNOWN_SCOPE", "Unknown Scope", ["item-only", "fetch-config"]),
    p.DURABILITY_INVALID_LEVEL: ("DURABILITY_INVALID_LEVEL", "Invalid durability level", ["invalid-input"]),
    p.XATTR_EINVAL: ("XATTR_EINVAL", "Invalid XATTR key or value", ["invalid-input", "item-only"]),
}
for _code, _name in (
    (p.SUBDOC_PATH_ENOENT, "PATH_ENOENT"),
    (p.SUBDOC_PATH_MISMATCH, "PATH_MISMATCH"),
    (p.SUBDOC_PATH_EINVAL, "PATH_EINVAL"),
    (p.SUBDOC_DOC_NOT_JSON, "DOC_NOTJSON"),
    (p.SUBDOC_NUM_ERANGE, "NUM_ERANGE"),
    (p.SUBDOC_DELTA_EINVAL, "DELTA_EINVAL"),
    (p.SUBDOC_PATH_EEXISTS, "PATH_EEXISTS"),
    (p.SUBDOC_VALUE_CANTINSERT, "VALUE_CANTINSERT"),
    (p.SUBDOC_VALUE_ETOODEEP, "VALUE_ETOODEEP"),
    (p.SUBDOC_INVALID_COMBO, "INVALID_COMBO"),
    (p.SUBDOC_MULTI_PATH_FAILURE, "MULTI_PATH_FAILURE"),
    (p.SUBDOC_XATTR_UNKNOWN_VATTR, "XATTR_UNKNOWN_VATTR"),
    (p.SUBDOC_XATTR_CANT_MODIFY_VATTR, "XATTR_CANT_MODIFY_VATTR"),
    (p.SUBDOC_XATTR_INVALID_FLAG_COMBO, "XATTR_INVALID_FLAG_COMBO"),
    (p.SUBDOC_XATTR_UNKNOWN_MACRO, "XATTR_UNKNOWN_MACRO"),
    (p.SUBDOC_INVALID_XATTR_ORDER, "INVALID_XATTR_ORDER"),
    (p.SUBDOC_XATTR_UNKNOWN_VATTR_MACRO, "XATTR_UNKNOWN_VATTR_MACRO"),
):
    _ERRORS[_code] = (
        f"SUBDOC_{_name}",
        f"Sub-document: {_name.lower().replace('_', ' ')}",
        ["subdoc", "item-only"],
    )


def error_map() -> dict[str, Any]:
    return {
        "version": 2,
        "revision": 1,
        "errors": {
            f"{code:x}": {"name": name, "desc": desc, "attrs": attrs}
            for code, (name, desc, attrs) in _ERRORS.items()
        },
    }


# -- the cluster manager's documents (HTTP) --------------------------------------------------------------


def pools(node: Node, cluster_uuid: str, admin: bool) -> dict[str, Any]:
    return {
        "isAdminCreds": admin,
        "isROAdminCreds": not admin,
        "isEnterprise": True,
        "allowedServices": ["kv", "eventing"],
        "isDeveloperPreview": False,
        "packageVariant": "",
        "implementationVersion": VERSION,
        "componentsVersion": {"ns_server": VERSION, "kv": VERSION},
        "uuid": cluster_uuid,
        "pools": [
            {
                "name": "default",
                "uri": f"/pools/default?uuid={cluster_uuid}",
                "streamingUri": f"/poolsStreaming/default?uuid={cluster_uuid}",
            }
        ],
    }


def _node_info(node: Node) -> dict[str, Any]:
    return {
        "hostname": f"{node.advertised}:{node.http_port}",
        "thisNode": True,
        "clusterMembership": "active",
        "status": "healthy",
        "services": ["eventing", "kv"],
        "version": VERSION,
        "ports": {"direct": node.kv_port},
        "otpNode": f"ns_1@{node.advertised}",
        "nodeUUID": f"{zlib.crc32(node.advertised.encode()):08x}",
    }


def pools_default(node: Node, buckets: list[str]) -> dict[str, Any]:
    return {
        "name": "default",
        "clusterName": "eventing",
        "nodes": [_node_info(node)],
        "buckets": {"uri": "/pools/default/buckets"},
        "nodeServicesUri": "/pools/default/nodeServices",
        "balanced": True,
        "rebalanceStatus": "none",
        "bucketNames": [{"bucketName": b} for b in buckets],
        "clusterCompatibility": 0x70006,
        "isBalanced": True,
    }


def node_services(node: Node) -> dict[str, Any]:
    return {
        "rev": 1,
        "nodesExt": [node.node_ext()],
        "clusterCapabilitiesVer": [1, 0],
        "clusterCapabilities": {},
    }


def bucket_info(
    node: Node, bucket: str, uuid: str, collections: dict[tuple[str, str], int], documents: int
) -> dict[str, Any]:
    config = bucket_config(node, bucket, uuid, collections)
    config["nodes"] = [
        {**_node_info(node), "couchApiBase": f"http://{node.advertised}:{node.http_port}/{bucket}"}
    ]
    config.update({"basicStats": {"itemCount": documents}, "replicaNumber": 0, "storageBackend": "sqlite"})
    return config
