"""CouchbaseWindowStateStore: the window coordinator's fenced state in one Couchbase document per function."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from metadata.couchbase.cas import CasDocuments
from metadata.couchbase.dlq import DeadLetters
from metadata.couchbase.documents import Doc
from metadata.fencing import holds
from metadata.model import DlqRow


class CouchbaseWindowStateStore:
    """The window coordinator's fenced state (as metadata.sqlite.SqliteWindowStateStore keeps it in SQLite)
    in one document per function, ``<p>::win::<fn>`` = {fence, state, updated_at}.

    claim bumps the fence with a CAS loop; commit writes the state only while the document still holds
    the committer's fence (CAS), after the late rows' dead letters (insert-once) and before the counters.
    The store makes it (CouchbaseMetadataStore.window_states) with its documents, its dead letters and its
    counters.
    """

    def __init__(
        self,
        docs: CasDocuments,
        dead_letters: DeadLetters,
        add_counters: Callable[[str, Mapping[str, int | float]], None],
    ):
        self.docs = docs
        self.dead_letters = dead_letters
        self.add_counters = add_counters

    def _key(self, function: str) -> str:
        return self.docs.key("win", function)

    def claim(self, function: str) -> tuple[int, dict[str, Any] | None]:
        """Become the function's coordinator: returns the new fence and the last committed state (or None)."""

        def change(doc: Doc | None) -> Doc:
            doc = doc or {"fence": 0, "state": None}
            return dict(doc, fence=doc["fence"] + 1, updated_at=time.time())

        written = self.docs.mutate(self._key(function), change)
        assert written is not None
        return int(written["fence"]), written["state"]

    def commit(
        self,
        function: str,
        fence: int,
        state: Mapping[str, Any],
        dlq_rows: Iterable[DlqRow] = (),
        counters: Mapping[str, int | float] | None = None,
    ) -> bool:
        """Write state, DLQ rows and counters if ``fence`` is still current; False if fenced."""
        got = self.docs.get(self._key(function))
        if got is None or not holds(got[0]["fence"], fence):
            return False
        self.dead_letters.insert(list(dlq_rows))
        fenced = False

        def change(doc: Doc | None) -> Doc | None:
            nonlocal fenced
            if doc is None or not holds(doc["fence"], fence):
                fenced = True
                return None
            return dict(doc, state=dict(state), updated_at=time.time())

        self.docs.mutate(self._key(function), change)
        if fenced:
            return False
        self.add_counters(function, dict(counters or {}))
        return True

    def load(self, function: str) -> dict[str, Any] | None:
        """The last committed state, read-only (for inspection)."""
        got = self.docs.get(self._key(function))
        return got[0]["state"] if got else None

    def reset(self, function: str) -> None:
        """Forget the state (a new deployment starts its windows afresh) and fence its coordinator."""

        def change(doc: Doc | None) -> Doc | None:
            return (
                None if doc is None else dict(doc, fence=doc["fence"] + 1, state=None, updated_at=time.time())
            )

        self.docs.mutate(self._key(function), change)
