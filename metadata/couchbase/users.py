"""The users of the APIs in the Couchbase store: one document per user and an index of their names."""

from __future__ import annotations

import time
from collections.abc import Sequence

from metadata.couchbase.cas import CasDocuments
from metadata.couchbase.documents import Doc
from metadata.errors import NotFoundError
from metadata.model import USERS_MARK, UserRecord


class UserDocuments(CasDocuments):
    """The users of the MetadataStore protocol."""

    # -- users of the APIs ----------------------------------------------------------------------------

    def put_user(self, name: str, password_hash: str, roles: Sequence[str]) -> UserRecord:
        """Create a user, or replace the hash and roles of an existing one (keeping when it was created)."""
        self._index_add(self._key("users"), "names", [name])
        self._docs.upsert(self._key("kv", USERS_MARK), {"value": "1"})  # kept when users are deleted

        def change(doc: Doc | None) -> Doc:
            created = doc["created_at"] if doc is not None else time.time()
            return {"hash": password_hash, "roles": list(roles), "created_at": created}

        written = self._mutate(self._key("user", name), change)
        assert written is not None
        return _user(name, written)

    def get_user(self, name: str) -> UserRecord:
        got = self._get(self._key("user", name))
        if got is None:
            raise NotFoundError(f"unknown user '{name}'; see `eventing user list`")
        return self._decode(self._key("user", name), _user, name, got[0])

    def list_users(self) -> list[UserRecord]:
        index = self._get(self._key("users"))
        names = index[0]["names"] if index else []
        docs = self._get_many([self._key("user", n) for n in names])
        return [
            self._decode(self._key("user", n), _user, n, docs[self._key("user", n)][0])
            for n in sorted(names)
            if self._key("user", n) in docs
        ]

    def delete_user(self, name: str) -> None:
        if not self._docs.remove(self._key("user", name)):
            raise NotFoundError(f"unknown user '{name}'; see `eventing user list`")
        self._index_remove(self._key("users"), "names", [name])


def _user(name: str, doc: Doc) -> UserRecord:
    return UserRecord(name, doc["hash"], tuple(doc["roles"]), doc["created_at"])
