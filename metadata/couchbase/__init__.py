"""Couchbase backend of the metadata store: JSON documents in one bucket, every change guarded by CAS.

Document layout (keys start with a prefix, ``eventing`` by default, in the bucket's default collection;
``<p>`` below):

    <p>::functions                   {"names": [...]}                 index of function names
    <p>::fn::<name>                  {definition, source, state, generation, updated_at, deployed_by}
    <p>::cp::<fn>::<vb>              {seqno, epoch, owner, bucket_uuid, updated_at, leased, start}
    <p>::cpreg::<fn>                 {"rows": [...]}                  checkpoint moves refused by commit,
                                                                      and rewinds
    <p>::ctr::<fn>                   {"values": {name: number}}       counters and gauges
    <p>::dlq::<fn>::<vb>::<seqno>    one dead letter (mutation base64), written with insert() only
    <p>::dlqix::<fn>::<vb>           {"seqnos": [...]}                index of that vBucket's dead letters
    <p>::deaths::<fn>                {"counts": {"vb:seqno": n}}      deaths of a worker per mutation
    <p>::services                    {"ids": [...]}                   index of service heartbeats
    <p>::svc::<id>                   {info, heartbeat_at}             expires SERVICE_TTL_S after its
                                                                      last beat
    <p>::nodes                       {"nodes": {name: {...}}}         eventing nodes
    <p>::lease::<name>               {holder, expires_at, acquired_at, term, info}   a lease (leadership)
    <p>::tmr::<fn>::<vb>             {"seq": n, "timers": {...}}      durable timers of one vBucket
    <p>::kv::<key>                   {"value": ...}
    <p>::win::<fn>                   {fence, state, updated_at}       window coordinator state (fenced)
    <p>::users                       {"names": [...]}                 index of user names
    <p>::user::<name>                {hash, roles, created_at}        a user of the APIs (salted scrypt hash)

Nothing needs N1QL: checkpoints have deterministic keys (vBuckets 0..1023, fetched with one multi-get),
functions, dead letters and services are listed through the index documents.

Atomicity is per document. Every read-modify-write is a CAS loop (read the document and its CAS, check,
replace with that CAS; on a CAS mismatch read again and re-check), so two writers never both win:
- a lifecycle transition is checked against the state it replaces, so an illegal move raises
  LifecycleError exactly as in SQLite even when another process moved the function in between;
- a checkpoint is written only while its document still holds the writer's epoch: a claim in between
  changes the CAS, the retry sees the new epoch and the write is fenced (the zombie learns it lost the
  vBucket); a checkpoint below the stored seqno raises OrderViolationError and is recorded.
What SQLite does in one transaction (a commit's dead letters, checkpoints and counters) happens here in
order, dead letters first, so a crash in between leaves at most work that is redone, never skipped.

Modules: documents.py (the key-value protocol the store needs), cas.py (CasDocuments: keys, reads, CAS
loops: the document access every part is given), store.py (CouchbaseMetadataStore: functions, checkpoints,
commits, counters, and a facade over its collaborators), dlq.py (DeadLetters: dead letters and deaths),
timers.py (Timers: durable timers), users.py (Users: users of the APIs), cluster.py (ClusterRecords:
services, leases, nodes, settings), window_state.py (CouchbaseWindowStateStore), adapter.py (that protocol
on the Couchbase Python SDK).
"""

from __future__ import annotations

from metadata.couchbase.adapter import SdkDocuments
from metadata.couchbase.documents import Doc, Documents
from metadata.couchbase.store import CouchbaseMetadataStore
from metadata.couchbase.window_state import CouchbaseWindowStateStore

__all__ = ["CouchbaseMetadataStore", "CouchbaseWindowStateStore", "Doc", "Documents", "SdkDocuments"]
