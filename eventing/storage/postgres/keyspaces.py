"""Scopes and collections of a PostgreSQL bucket (``Keyspaces``): the registry row's ``collections`` value,
the same JSON a bucket file keeps in its info table (eventing.storage.info_table), changed under a lock of
that row; dropping a collection deletes its documents in the same transaction (its log entries stay).
"""

from __future__ import annotations

import json

from eventing.core.keyspaces import COLLECTION_MARK
from eventing.errors import ConfigError, NotFoundError
from eventing.storage.info_table import FIRST_COLLECTION_ID
from eventing.storage.postgres.registry import BucketRef
from eventing.storage.postgres.writer import LogWriter, Written
from metadata.postgres.connection import Cursor


class Keyspaces:
    """The collections of one bucket."""

    def __init__(self, ref: BucketRef, writer: LogWriter):
        self.ref = ref
        self.writer = writer

    def _registry(self, cur: Cursor) -> dict:
        row = cur.execute(
            "SELECT collections FROM bucket_registry WHERE id = %s FOR UPDATE", (self.ref.id,)
        ).fetchone()
        if row is None:
            raise self.ref.gone()
        return json.loads(row[0])

    def _save(self, cur: Cursor, registry: dict) -> None:
        cur.execute(
            "UPDATE bucket_registry SET collections = %s WHERE id = %s", (json.dumps(registry), self.ref.id)
        )

    def collections(self) -> dict[tuple[str, str], int]:
        """(scope, collection) -> id, besides `_default._default` (id 0); ids are never reused."""
        rows = self.ref.db.read("SELECT collections FROM bucket_registry WHERE id = %s", (self.ref.id,))
        if not rows:
            raise self.ref.gone()
        registry = json.loads(rows[0][0])
        return {(scope, name): cid for scope, name, cid in registry.get("collections", [])}

    def mirrors(self) -> dict[int, str]:
        """The collections that mirror a table: id -> what they mirror (eventing.storage.info_table)."""
        rows = self.ref.db.read("SELECT collections FROM bucket_registry WHERE id = %s", (self.ref.id,))
        if not rows:
            raise self.ref.gone()
        return {int(cid): shown for cid, shown in json.loads(rows[0][0]).get("mirrors", {}).items()}

    def create_collection(self, scope: str, collection: str, mirror: str | None = None) -> int:
        """Add a collection (its scope comes with it); returns its id. ConfigError if it exists."""

        def body(cur: Cursor, written: Written) -> int:
            registry = self._registry(cur)
            known = registry.setdefault("collections", [])
            if any(s == scope and c == collection for s, c, _ in known):
                raise ConfigError(f"collection {self.ref.name}.{scope}.{collection} exists already")
            cid = int(registry.get("next_id", FIRST_COLLECTION_ID))
            known.append([scope, collection, cid])
            registry["next_id"] = cid + 1
            if mirror is not None:
                registry.setdefault("mirrors", {})[str(cid)] = mirror
            self._save(cur, registry)
            return cid

        return self.writer.run(body)

    def drop_collection(self, scope: str, collection: str) -> int:
        """Remove a collection and its documents; returns how many live documents went. NotFoundError if
        unknown."""

        def body(cur: Cursor, written: Written) -> int:
            registry = self._registry(cur)
            known = registry.get("collections", [])
            match = [entry for entry in known if entry[0] == scope and entry[1] == collection]
            if not match:
                raise NotFoundError(
                    f"collection {self.ref.name}.{scope}.{collection} does not exist; see "
                    f"`eventing collection list {self.ref.name}`"
                )
            registry["collections"] = [entry for entry in known if entry not in match]
            registry.get("mirrors", {}).pop(str(match[0][2]), None)
            self._save(cur, registry)
            prefix = f"{COLLECTION_MARK}{match[0][2]:x}{COLLECTION_MARK}"
            end = prefix[:-1] + chr(ord(COLLECTION_MARK) + 1)
            row = cur.execute(
                "WITH gone AS (DELETE FROM bucket_docs WHERE bucket = %s AND key >= %s AND key < %s "
                "RETURNING deleted) SELECT count(*) FILTER (WHERE NOT deleted) FROM gone",
                (self.ref.id, prefix, end),
            ).fetchone()
            return int(row[0]) if row else 0

        return self.writer.run(body)
