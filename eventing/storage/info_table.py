"""A local bucket's info table (``InfoTable``, a collaborator of ``LocalBucket``): what a bucket file records
about itself (its uuid, name, creation time and partitions, read with ``get``), and the registry of the
bucket's scopes and collections (eventing.core.keyspaces), kept there as one JSON value: creating a
collection under an id never used before, dropping one with its documents.
"""

from __future__ import annotations

import json

from eventing.core.keyspaces import COLLECTION_MARK
from eventing.errors import ConfigError, NotFoundError, StoreError, fix
from eventing.storage.bucket_file import BucketFile
from eventing.storage.file_health import maps_file_errors

FIRST_COLLECTION_ID = 8  # as Couchbase numbers the collections a user creates


class InfoTable:
    """The info table of one bucket file and its collections. A collaborator of LocalBucket
    (eventing.storage.bucket)."""

    def __init__(self, file: BucketFile):
        self.file = file

    @maps_file_errors
    def get(self, key: str) -> str:
        row = self.file.db.execute("SELECT value FROM info WHERE key=?", (key,)).fetchone()
        if row is None:
            raise StoreError(f"bucket file {self.file.path} has no {key}; it is not a bucket")
        return row[0]

    @maps_file_errors
    def get_or(self, key: str, default: str) -> str:
        row = self.file.db.execute("SELECT value FROM info WHERE key=?", (key,)).fetchone()
        return default if row is None else row[0]

    def collections(self) -> dict[tuple[str, str], int]:
        """The bucket's collections besides `_default._default` (id 0): (scope, collection) -> id. Ids are
        never reused, so a log entry of a dropped collection never reads as a later one's."""
        registry = json.loads(self.get_or("collections", "{}"))
        return {(scope, name): cid for scope, name, cid in registry.get("collections", [])}

    def mirrors(self) -> dict[int, str]:
        """The collections that mirror a table (eventing.storage.mirror): id -> what they mirror, for
        messages (never a password). Their documents are written by their mirror alone."""
        registry = json.loads(self.get_or("collections", "{}"))
        return {int(cid): shown for cid, shown in registry.get("mirrors", {}).items()}

    def create_collection(self, scope: str, collection: str, *, mirror: str | None = None) -> int:
        """Add a collection (its scope comes with it); returns its id. ConfigError if it exists. With
        `mirror` (what it mirrors, for messages), its documents belong to that mirror."""

        def body() -> int:
            registry = json.loads(self.get_or("collections", "{}"))
            known = registry.setdefault("collections", [])
            if any(s == scope and c == collection for s, c, _ in known):
                raise ConfigError(f"collection {self.file.name}.{scope}.{collection} exists already")
            cid = int(registry.get("next_id", FIRST_COLLECTION_ID))
            known.append([scope, collection, cid])
            registry["next_id"] = cid + 1
            if mirror is not None:
                registry.setdefault("mirrors", {})[str(cid)] = mirror
            self.file.db.execute(
                "INSERT OR REPLACE INTO info VALUES('collections', ?)", (json.dumps(registry),)
            )
            return cid

        return self.file.transaction(body)

    def drop_collection(self, scope: str, collection: str) -> int:
        """Remove a collection and its documents (their log entries stay, readable as history of a collection
        no function reads any more); returns how many live documents went. NotFoundError if unknown."""

        def body() -> int:
            registry = json.loads(self.get_or("collections", "{}"))
            known = registry.get("collections", [])
            match = [entry for entry in known if entry[0] == scope and entry[1] == collection]
            if not match:
                raise NotFoundError(
                    f"collection {self.file.name}.{scope}.{collection} does not exist; see {{fix}}",
                    fix=fix("collection_list", bucket=self.file.name),
                )
            registry["collections"] = [entry for entry in known if entry not in match]
            registry.get("mirrors", {}).pop(str(match[0][2]), None)
            self.file.db.execute(
                "INSERT OR REPLACE INTO info VALUES('collections', ?)", (json.dumps(registry),)
            )
            return self._drop_documents_of(match[0][2])

        return self.file.transaction(body)

    def drop_collection_documents(self, cid: int) -> int:
        """The documents of collection `cid` go (a partition's share of drop_collection)."""
        return self.file.transaction(lambda: self._drop_documents_of(cid))

    def _drop_documents_of(self, cid: int) -> int:
        prefix = f"{COLLECTION_MARK}{cid:x}{COLLECTION_MARK}"
        end = prefix[:-1] + chr(ord(COLLECTION_MARK) + 1)
        live = self.file.db.execute(
            "SELECT COUNT(*) FROM docs WHERE key >= ? AND key < ? AND deleted=0", (prefix, end)
        ).fetchone()[0]
        self.file.db.execute("DELETE FROM docs WHERE key >= ? AND key < ?", (prefix, end))
        return int(live)
