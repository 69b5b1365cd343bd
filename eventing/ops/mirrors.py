"""Mirrors of PostgreSQL tables (eventing.storage.mirror): creating one (every check on the source first,
then the publication, the collection and the definition, undone together on failure), dropping one (its
follower stopped, its slot and own publication dropped, then the collection), taking a new snapshot
(`collection resync`), and their health for `status`, `stats` and /metrics.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from eventing.core.keyspaces import Keyspace
from eventing.errors import ConfigError, EventingError
from eventing.storage import keyspace as keyspaces
from eventing.storage.mirror import definition as defs
from eventing.storage.mirror.definition import MirrorDefinition
from eventing.storage.mirror.source import Source, SourceError
from eventing.storage.state import StateLike, as_state

log = logging.getLogger("eventing.ops.mirrors")

RETAINED_WARN_ENV = "EVENTING_MIRROR_RETAINED_WARN_MB"
DEFAULT_RETAINED_WARN_MB = 1024.0  # `status` warns when a mirror's slot holds back more WAL than this
FOLLOWER_STOP_S = 15.0  # how long `collection drop` waits for the service to stop the mirror's follower


def retained_warn_bytes() -> int:
    try:
        return int(float(os.environ.get(RETAINED_WARN_ENV, DEFAULT_RETAINED_WARN_MB)) * 1024 * 1024)
    except ValueError:
        return int(DEFAULT_RETAINED_WARN_MB * 1024 * 1024)


def create_mirror(
    state: StateLike,
    keyspace: str | Keyspace,
    *,
    source: str,
    table: str,
    publication: str | None = None,
    slot: str | None = None,
) -> dict[str, Any]:
    """A collection that mirrors ``table`` of the database at ``source`` (see the module docstring)."""
    state = as_state(state)
    ks = keyspaces.parse_keyspace(state, keyspace)
    if ks.is_default:
        raise ConfigError(
            f"'{ks}' is a bucket's default collection; a mirror is a collection of its own: name "
            "BUCKET.SCOPE.COLLECTION"
        )
    ks.check()
    name = str(ks)
    store = state.metadata
    if defs.load(store, name) is not None:
        raise ConfigError(
            f"keyspace '{name}' mirrors a table already; drop it first (`eventing collection drop {name}`)"
        )
    qualified, publication_name, slot_name = defs.check_names(name, table, publication, slot)
    with state.open_bucket(ks.bucket) as bucket:
        if (ks.scope, ks.collection) in bucket.collections():
            raise ConfigError(
                f"collection {name} exists already; a mirror makes a collection of its own: name a new "
                "one (or drop that one first)"
            )
        parts = getattr(bucket, "parts", None)
        if parts is not None and len(parts) > 1:
            raise ConfigError(
                f"bucket '{ks.bucket}' has {len(parts)} partitions; a mirror applies each source "
                "transaction in one bucket transaction, which needs a bucket of one partition: put "
                "the mirror in a bucket created without --partitions"
            )
        src = Source(source)
        found = src.check(qualified, publication_name, slot_name, given_publication=publication is not None)
        own = publication is None
        if own:
            src.create_publication(publication_name, found)
        definition = MirrorDefinition(name, source, qualified, publication_name, slot_name, own)
        try:
            definition.cid = bucket.create_collection(ks.scope, ks.collection, mirror=definition.describe())
            defs.save(store, definition)
        except BaseException:
            if definition.cid:
                try:
                    bucket.drop_collection(ks.scope, ks.collection)
                except EventingError:
                    pass
            if own:
                try:
                    src.drop_publication(publication_name)
                except EventingError:
                    pass
            raise
    return {
        "keyspace": name,
        "bucket": ks.bucket,
        "scope": ks.scope,
        "collection": ks.collection,
        "id": definition.cid,
        "mirror": definition.view(),
    }


def mirror_of(state: StateLike, keyspace: str) -> MirrorDefinition | None:
    """The mirror of a keyspace, None when it is none (or nothing was ever stored there)."""
    state = as_state(state)
    if not state.exists():
        return None
    return defs.load(state.metadata, keyspace)


def list_mirrors(state: StateLike) -> list[dict[str, Any]]:
    """Every mirror's definition as shown (no password) with what its follower last reported."""
    state = as_state(state)
    store = state.metadata
    return [{**d.view(), "status": defs.status(store, d.keyspace)} for d in defs.load_all(store)]


def drop_collection(state: StateLike, keyspace: str, *, force: bool = False) -> dict[str, Any]:
    """Drop a collection (`eventing collection drop`): a mirror with its slot and publication first
    (drop_mirror), any other as eventing.ops.buckets.drop_collection does."""
    from eventing.ops import buckets

    state = as_state(state)
    ks = keyspaces.parse_keyspace(state, keyspace)
    if not ks.is_default:
        mirror = mirror_of(state, str(ks))
        if mirror is not None and not mirror.dropping:
            return drop_mirror(state, str(ks), force=force)
    return buckets.drop_collection(state, ks)


def drop_mirror(state: StateLike, keyspace: str, *, force: bool = False) -> dict[str, Any]:
    """Stop the mirror's follower, drop its slot and the publication it made, then the collection. With
    the source unreachable: one line naming what to drop by hand, unless ``force``."""
    from eventing.ops import buckets

    state = as_state(state)
    store = state.metadata
    definition = defs.require(store, keyspace)
    definition.dropping = True
    defs.save(store, definition)
    _wait_follower_stopped(store, keyspace)
    src = Source(definition.source)
    kept: list[str] = []
    try:
        src.drop_slot(definition.slot)
        if definition.own_publication:
            src.drop_publication(definition.publication)
    except SourceError as exc:
        if not force:
            definition.dropping = False
            defs.save(store, definition)
            raise SourceError(
                f"{exc}; mirror {keyspace} is kept: its slot {definition.slot} would hold WAL on the source "
                "until dropped; start the source and drop again, or drop the slot by hand (SELECT "
                f"pg_drop_replication_slot('{definition.slot}')) and run `eventing collection drop "
                f"{keyspace} --force`"
            ) from None
        kept.append(definition.slot)
    result = buckets.drop_collection(state, keyspace)
    try:
        with state.open_bucket(Keyspace.parse(keyspace).bucket) as bucket:
            bucket.drop_effect_marks(defs.marks_name(definition.cid))
    except EventingError:
        pass
    defs.forget(store, keyspace)
    result["mirror"] = {**definition.view(), "slot_kept": kept}
    return result


def _wait_follower_stopped(store: Any, keyspace: str) -> None:
    deadline = time.monotonic() + FOLLOWER_STOP_S
    while time.monotonic() < deadline:
        found = defs.status(store, keyspace)
        pid = found.get("pid")
        if not pid or found.get("state") in ("stopped", "failed") or not _alive(int(pid)):
            return
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return True


def resync_mirror(state: StateLike, keyspace: str) -> dict[str, Any]:
    """Owe the mirror a new snapshot (a new slot; documents made equal to the rows): after its slot was
    dropped by hand, or to start over. The running service's follower takes it."""
    state = as_state(state)
    store = state.metadata
    definition = defs.require(store, keyspace)
    definition.generation += 1
    defs.save(store, definition)
    return {"keyspace": keyspace, "generation": definition.generation, "mirror": definition.view()}


def _recent(status: dict[str, Any], now_ms: int) -> bool:
    return now_ms - int(status.get("updated_ms", 0)) < 5_000


def mirror_health(state: StateLike, *, query_source: bool = True) -> list[dict[str, Any]]:
    """Per mirror: state, lag (bytes of WAL, seconds), the WAL its slot holds back, and warnings. With
    ``query_source``, the slot's figures are read from the source now (the follower's report may be old,
    or there may be no follower: a slot nobody reads is the one that fills a disk)."""
    state = as_state(state)
    store = state.metadata
    rows = []
    now_ms = int(time.time() * 1000)
    for definition in defs.load_all(store):
        status = defs.status(store, definition.keyspace)
        fresh = bool(status) and _recent(status, now_ms) and status.get("state") == "following"
        row: dict[str, Any] = {
            "keyspace": definition.keyspace,
            "table": definition.table,
            "source": definition.shown_source,
            "slot": definition.slot,
            "publication": definition.publication,
            # A failure is shown while its report is fresh, or for good when it is permanent (the table or
            # slot gone); a follower that failed for a passing reason and is not running now is "not running".
            "state": status.get("state", "not started")
            if fresh
            or status.get("state") == "snapshot"
            or (status.get("state") == "failed" and (status.get("permanent") or _recent(status, now_ms)))
            else "not running",
            "error": status.get("error"),
            "lag_bytes": status.get("lag_bytes"),
            "lag_s": status.get("lag_s"),
            "retained_bytes": status.get("retained_bytes"),
            "applied_changes": status.get("applied_changes", 0),
            "snapshot_rows": status.get("snapshot_rows", 0),
            "warnings": [],
        }
        if query_source:
            try:
                src = Source(definition.source)
                found = src.query(
                    "SELECT pg_current_wal_lsn() - restart_lsn, pg_current_wal_lsn() - confirmed_flush_lsn "
                    "FROM pg_replication_slots WHERE slot_name = %s",
                    (definition.slot,),
                )
                if found:
                    row["retained_bytes"] = int(found[0][0] or 0)
                    if not fresh:
                        row["lag_bytes"] = int(found[0][1] or 0)
                elif status.get("generation"):
                    row["warnings"].append(
                        f"slot {definition.slot} is gone; run `eventing collection resync "
                        f"{definition.keyspace}`"
                    )
            except EventingError as exc:
                row["warnings"].append(str(exc))
        limit = retained_warn_bytes()
        if row["retained_bytes"] is not None and row["retained_bytes"] > limit:
            row["warnings"].append(
                f"slot {definition.slot} holds back {row['retained_bytes'] / 1048576:,.0f} MB of WAL on "
                f"{definition.shown_source} (more than ${RETAINED_WARN_ENV}={limit / 1048576:,.0f}); run "
                "`eventing run` to follow it, or drop the mirror (`eventing collection drop "
                f"{definition.keyspace}`) before the server's disk fills"
            )
        if row["state"] == "failed" and row["error"]:
            row["warnings"].append(str(row["error"]))
        rows.append(row)
    return rows
