"""Where a windowed function keeps its files, and the reset a new deployment does.

Its files are in the state's file area ``windows/<fn>`` (``State.file_area``): under
``<data_dir>/windows/<fn>/`` on a data directory, in the store's files table on PostgreSQL. Names in that
area are ``<folder>/<file>``, the folders below; ``WindowPaths`` gives the same places as paths of a data
directory."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eventing.storage.file_area import FileArea
    from eventing.storage.state import State

WINDOWS_DIR = "windows"
INCOMING = "incoming"  # row batches from workers
ACCEPTED = "accepted"  # partial aggregates of the rows the coordinator kept
STAGING = "staging"  # copies (links) handed to one Spark job
HELD = "held"  # rows read but not yet judged by the arrival-time policies
ADJUSTED = "adjusted"  # rows the arrival-time policies windowed at another time
FOLDERS = (INCOMING, ACCEPTED, STAGING, HELD, ADJUSTED)


def window_root(function: str) -> str:
    """The function's file area in its state (``State.file_area``)."""
    return f"{WINDOWS_DIR}/{function}"


def window_area(state: State | str | os.PathLike[str], function: str) -> FileArea:
    """The file area of ``function``'s windows in ``state`` (a State, or a data directory's path)."""
    from eventing.storage.state import as_state

    return as_state(state).file_area(window_root(function))


@dataclass(frozen=True)
class WindowPaths:
    """``<data_dir>/windows/<fn>/``: ``incoming/`` (row batches from workers), ``accepted/`` (rows the
    coordinator kept), ``staging/`` (links handed to one Spark job), ``held/`` and ``adjusted/`` (arrival-time
    policies) and the default result sinks."""

    data_dir: Path
    function: str

    @classmethod
    def of(cls, data_dir: str | os.PathLike[str], function: str) -> WindowPaths:
        return cls(Path(data_dir), function)

    @property
    def root(self) -> Path:
        return self.data_dir / WINDOWS_DIR / self.function

    @property
    def incoming(self) -> Path:
        return self.root / INCOMING

    @property
    def accepted(self) -> Path:
        return self.root / ACCEPTED

    @property
    def staging(self) -> Path:
        return self.root / STAGING

    @property
    def held(self) -> Path:
        """Rows read but not yet judged by the arrival-time policies (substreams wait for earlier
        arrivals)."""
        return self.root / HELD

    @property
    def adjusted(self) -> Path:
        """One Parquet file per poll of the rows the arrival-time policies windowed at another time."""
        return self.root / ADJUSTED

    def sink_location(self, kind: str, path: str | None) -> Path:
        """The sink's directory (parquet) or file (sqlite); a relative ``path`` is under the data
        directory."""
        if path is not None:
            given = Path(path).expanduser()
            return given if given.is_absolute() else self.data_dir / given
        return self.root / ("results.sqlite3" if kind == "sqlite" else "results")


def reset_windows(state: State | str | os.PathLike[str], store: Any, function: str) -> None:
    """Start a deployment's windows afresh: drop the coordinator state (fencing any coordinator still
    running for the previous deployment) and the row files it had not aggregated yet. Results stay."""

    store.window_states().reset(function)
    area = window_area(state, function)
    for folder in FOLDERS:
        area.delete_folder(folder)
