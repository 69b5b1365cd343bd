"""SqlBackend: what a SQL backend of the metadata store supplies to the shared logic (metadata/sql/store.py
says what each part is for)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, Self, TypeVar

from metadata.sql.rows import SqlDb

T = TypeVar("T")


class SqlBackend:
    LOCK = ""  # appended to a SELECT whose rows the transaction writes after (PostgreSQL: " FOR UPDATE")
    LEAST = "MIN"  # the smaller of two values (PostgreSQL: LEAST)

    def _tx(self, body: Callable[[Any], T]) -> T:
        """body(db) in one transaction, retried whole where the backend's faults call for it."""
        raise NotImplementedError

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]:
        """One statement outside a transaction."""
        raise NotImplementedError

    def _in_vbs(self, vbs: Sequence[int]) -> tuple[str, tuple]:
        """What goes in `vb IN (...)` for these vBuckets, and its arguments."""
        raise NotImplementedError

    def _select_vbs(
        self, db: SqlDb, sql: str, function: str, vbs: list[int], *, lock: bool = False
    ) -> list[tuple]:
        """Run `sql`, whose last condition is `vb IN ({})`, for these vBuckets (`lock`: and lock the rows it
        reads, in vBucket order, until the transaction ends)."""
        raise NotImplementedError

    def _update_checkpoints(
        self, db: SqlDb, function: str, columns: Sequence[str], rows: list[tuple]
    ) -> None:
        """For each row (vb, value...): UPDATE checkpoints SET columns=values WHERE function AND vb."""
        raise NotImplementedError

    def _label_moves(self, db: SqlDb, how: str) -> Any:
        """Called before a rewind moves checkpoints back. The backend's trigger logs every backwards move
        as an 'applied' regression; with `_relabel_moves` after the moves, those it logs for the rewind
        read `how` instead. Returns what `_relabel_moves` needs."""
        raise NotImplementedError

    def _relabel_moves(self, db: SqlDb, mark: Any, how: str, now: float, function: str) -> None:
        raise NotImplementedError

    def window_states(self) -> Any:
        raise NotImplementedError

    def verify_integrity(self) -> None:
        raise NotImplementedError

    def backup(self, target: str | os.PathLike[str]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
