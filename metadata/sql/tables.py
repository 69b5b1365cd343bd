"""The metadata store's tables and their columns, in order, as every SQL backend stores them.

The store's statements rely on this order (`SELECT *` into the model's values, `INSERT INTO t VALUES(...)`),
so each backend's schema (metadata/sqlite/schema.py, metadata/postgres/schema.py) declares exactly these;
tests/unit/test_metadata_contract.py compares both with this table, and the PostgreSQL store's integrity
check reads it.
"""

from __future__ import annotations

TABLES: dict[str, tuple[str, ...]] = {
    "functions": ("name", "definition", "source", "state", "generation", "updated_at", "deployed_by"),
    "checkpoints": ("function", "vb", "seqno", "epoch", "owner", "bucket_uuid", "updated_at", "leased"),
    "checkpoint_starts": ("function", "vb", "seqno"),
    "checkpoint_regressions": ("function", "vb", "epoch", "from_seqno", "to_seqno", "how", "at"),
    "counters": ("function", "name", "value"),
    "dlq": (
        "function",
        "vb",
        "seqno",
        "key",
        "reason",
        "error",
        "traceback",
        "attempts",
        "first_failed_at",
        "last_failed_at",
        "mutation",
        "replayed_at",
        "generation",
    ),
    "services": ("id", "info", "heartbeat_at"),
    "kv": ("key", "value"),
    "nodes": ("name", "state", "ray_node_id", "added_at"),
    "leases": ("name", "holder", "expires_at", "acquired_at", "term", "info"),
    "timers": ("function", "callback", "reference", "vb", "due_ms", "context", "created_at", "fire_seq"),
    "timer_seqs": ("function", "vb", "seq"),
    "deaths": ("function", "vb", "seqno", "count"),
    "users": ("name", "hash", "roles", "created_at"),
    "window_state": ("function", "fence", "state", "updated_at"),
}
