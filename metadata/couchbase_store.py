"""The Couchbase backend moved to the metadata.couchbase package; these names stay importable from here."""

from metadata.couchbase import CouchbaseMetadataStore, CouchbaseWindowStateStore, Documents

__all__ = ["CouchbaseMetadataStore", "CouchbaseWindowStateStore", "Documents"]
