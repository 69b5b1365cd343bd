"""The users of the APIs in the Couchbase store: one document per user and an index of their names."""

from __future__ import annotations

import time
from collections.abc import Sequence

from metadata.couchbase.cas import CasDocuments
from metadata.couchbase.documents import Doc
from metadata.errors import NotFoundError
from metadata.model import USERS_MARK, UserRecord


class Users:
    """The users of the MetadataStore protocol. A collaborator of CouchbaseMetadataStore
    (metadata.couchbase.store), over its documents."""

    def __init__(self, docs: CasDocuments):
        self.docs = docs

    # -- users of the APIs ----------------------------------------------------------------------------

    def put_user(self, name: str, password_hash: str, roles: Sequence[str]) -> UserRecord:
        """Create a user, or replace the hash and roles of an existing one (keeping when it was created)."""
        self.docs.index_add(self.docs.key("users"), "names", [name])
        self.docs.raw.upsert(self.docs.key("kv", USERS_MARK), {"value": "1"})  # kept when users are deleted

        def change(doc: Doc | None) -> Doc:
            created = doc["created_at"] if doc is not None else time.time()
            return {"hash": password_hash, "roles": list(roles), "created_at": created}

        written = self.docs.mutate(self.docs.key("user", name), change)
        assert written is not None
        return _user(name, written)

    def get_user(self, name: str) -> UserRecord:
        got = self.docs.get(self.docs.key("user", name))
        if got is None:
            raise NotFoundError(f"unknown user '{name}'; see `eventing user list`")
        return self.docs.decode(self.docs.key("user", name), _user, name, got[0])

    def list_users(self) -> list[UserRecord]:
        index = self.docs.get(self.docs.key("users"))
        names = index[0]["names"] if index else []
        docs = self.docs.get_many([self.docs.key("user", n) for n in names])
        return [
            self.docs.decode(self.docs.key("user", n), _user, n, docs[self.docs.key("user", n)][0])
            for n in sorted(names)
            if self.docs.key("user", n) in docs
        ]

    def delete_user(self, name: str) -> None:
        if not self.docs.raw.remove(self.docs.key("user", name)):
            raise NotFoundError(f"unknown user '{name}'; see `eventing user list`")
        self.docs.index_remove(self.docs.key("users"), "names", [name])


def _user(name: str, doc: Doc) -> UserRecord:
    return UserRecord(name, doc["hash"], tuple(doc["roles"]), doc["created_at"])
