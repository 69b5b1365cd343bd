"""The KV port: Couchbase's data-service protocol (memcached binary) for Couchbase's SDKs, beside the REST
API.

protocol.py (packets, opcodes, statuses), sasl.py (PLAIN and SCRAM-SHA), bootstrap.py (cluster map, manifest,
error map, the cluster manager's /pools documents), documents.py (the document operations, planned on the
Data API's bucket threads), subdoc.py (sub-document paths and operations), server.py (asyncio, connections).
"""
