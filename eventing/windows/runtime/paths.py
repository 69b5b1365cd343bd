"""Where a windowed function keeps its files under the data directory, and the reset a new deployment does."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WINDOWS_DIR = "windows"


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
        return self.root / "incoming"

    @property
    def accepted(self) -> Path:
        return self.root / "accepted"

    @property
    def staging(self) -> Path:
        return self.root / "staging"

    @property
    def held(self) -> Path:
        """Rows read but not yet judged by the arrival-time policies (substreams wait for earlier arrivals)."""
        return self.root / "held"

    @property
    def adjusted(self) -> Path:
        """One Parquet file per poll of the rows the arrival-time policies windowed at another time."""
        return self.root / "adjusted"

    def sink_location(self, kind: str, path: str | None) -> Path:
        """The sink's directory (parquet) or file (sqlite); a relative ``path`` is under the data directory."""
        if path is not None:
            given = Path(path).expanduser()
            return given if given.is_absolute() else self.data_dir / given
        return self.root / ("results.sqlite3" if kind == "sqlite" else "results")


def reset_windows(state: Any, store: Any, function: str) -> None:
    """Start a deployment's windows afresh: drop the coordinator state (fencing any coordinator still
    running for the previous deployment) and the row files it had not aggregated yet. Results stay."""

    store.window_states().reset(function)
    if state.directory is None:
        return
    paths = WindowPaths.of(state.directory, function)
    for folder in (paths.incoming, paths.accepted, paths.staging, paths.held, paths.adjusted):
        shutil.rmtree(folder, ignore_errors=True)
