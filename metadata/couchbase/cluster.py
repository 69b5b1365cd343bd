"""The cluster's shared records in the Couchbase store: service heartbeats, leases, eventing nodes and
small settings."""

from __future__ import annotations

import time

from metadata.couchbase.cas import CasDocuments
from metadata.couchbase.documents import Doc
from metadata.model import Lease, next_lease

# (seconds), so a live service never vanishes, while a crashed one's document is reclaimed by the server.
SERVICE_TTL_S = 24 * 3600


class ClusterRecords:
    """Service heartbeats, leases, eventing nodes and settings of the MetadataStore protocol. A
    collaborator of CouchbaseMetadataStore (metadata.couchbase.store), over its documents."""

    def __init__(self, docs: CasDocuments):
        self.docs = docs

    # -- services -------------------------------------------------------------------------------------

    def heartbeat(self, service_id: str, info: str) -> None:
        self.docs.raw.upsert(
            self.docs.key("svc", service_id),
            {"info": info, "heartbeat_at": time.time()},
            expiry_s=SERVICE_TTL_S,
        )
        index = self.docs.get(self.docs.key("services"))
        if index is None or service_id not in index[0]["ids"]:
            self.docs.index_add(self.docs.key("services"), "ids", [service_id])

    def remove_service(self, service_id: str) -> None:
        self.docs.raw.remove(self.docs.key("svc", service_id))
        self.docs.index_remove(self.docs.key("services"), "ids", [service_id])

    def live_services(self, max_age_s: float) -> list[str]:
        index = self.docs.get(self.docs.key("services"))
        ids = index[0]["ids"] if index else []
        docs = self.docs.get_many([self.docs.key("svc", i) for i in ids])
        since = time.time() - max_age_s
        return [
            i
            for i in ids
            if self.docs.key("svc", i) in docs and docs[self.docs.key("svc", i)][0]["heartbeat_at"] >= since
        ]

    # -- leases ---------------------------------------------------------------------------------------

    def acquire_lease(
        self, name: str, holder: str, ttl_s: float, *, info: str = "", take_from: str | None = None
    ) -> Lease | None:
        """Take or renew lease `name` (see SqliteMetadataStore.acquire_lease): a CAS loop on its document,
        so of two racing takers the second re-reads the first's lease and declines."""
        taken: list[Lease | None] = [None]

        def change(doc: Doc | None) -> Doc | None:
            new = next_lease(
                _lease(name, doc) if doc else None, name, holder, ttl_s, info, take_from, time.time()
            )
            taken[0] = new
            return None if new is None else _lease_doc(new)

        self.docs.mutate(self.docs.key("lease", name), change)
        return taken[0]

    def lease(self, name: str) -> Lease | None:
        got = self.docs.raw.get(self.docs.key("lease", name))
        return _lease(name, got[0]) if got else None

    def release_lease(self, name: str, holder: str) -> bool:
        released = [False]

        def change(doc: Doc | None) -> Doc | None:
            released[0] = doc is not None and doc["holder"] == holder and doc["expires_at"] > 0
            return {**doc, "expires_at": 0} if doc is not None and released[0] else None

        self.docs.mutate(self.docs.key("lease", name), change)
        return released[0]

    # -- eventing nodes -------------------------------------------------------------------------------

    def nodes(self) -> list[dict]:
        """Eventing nodes in the order they were added; state is active, joining or leaving."""
        got = self.docs.get(self.docs.key("nodes"))
        nodes = [dict(n, name=name) for name, n in (got[0]["nodes"] if got else {}).items()]
        return [
            {
                "name": n["name"],
                "state": n["state"],
                "ray_node_id": n["ray_node_id"],
                "added_at": n["added_at"],
            }
            for n in sorted(nodes, key=lambda n: (n["added_at"], n["name"]))
        ]

    def put_node(self, name: str, state: str, ray_node_id: str | None = None) -> None:
        def change(doc: Doc | None) -> Doc:
            nodes = (doc or {"nodes": {}})["nodes"]
            old = nodes.get(name)
            if old is None:
                nodes[name] = {"state": state, "ray_node_id": ray_node_id, "added_at": time.time()}
            else:
                old.update(
                    state=state, ray_node_id=ray_node_id if ray_node_id is not None else old["ray_node_id"]
                )
            return {"nodes": nodes}

        self.docs.mutate(self.docs.key("nodes"), change)

    def delete_node(self, name: str) -> None:
        def change(doc: Doc | None) -> Doc | None:
            if doc is None or name not in doc["nodes"]:
                return None
            del doc["nodes"][name]
            return doc

        self.docs.mutate(self.docs.key("nodes"), change)

    # -- small settings -------------------------------------------------------------------------------

    def get_kv(self, key: str) -> str | None:
        got = self.docs.get(self.docs.key("kv", key))
        return got[0]["value"] if got else None

    def set_kv(self, key: str, value: str) -> None:
        self.docs.raw.upsert(self.docs.key("kv", key), {"value": value})


def _lease(name: str, doc: Doc) -> Lease:
    return Lease(name, doc["holder"], doc["expires_at"], doc["acquired_at"], doc["term"], doc.get("info", ""))


def _lease_doc(lease: Lease) -> Doc:
    return {
        "holder": lease.holder,
        "expires_at": lease.expires_at,
        "acquired_at": lease.acquired_at,
        "term": lease.term,
        "info": lease.info,
    }
