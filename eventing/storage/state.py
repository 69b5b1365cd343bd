"""The handle on a deployment's state: its metadata store and its buckets, opened once from a location and
passed to everything above the storage layers (ops, lifecycle, the service, the REST API, the CLI and the
Python API), as quix-streams' Application owns its state manager. Only this module knows which kinds of
location exist: a data directory (SQLite files, the embedded default) or a PostgreSQL server
(``postgresql://...``: nothing is read from or written to a directory).

    state = open_state(".eventing")                  # or "postgresql://user@host/db"
    state.metadata.list_functions()                  # one store for the process, safe from any thread
    with state.open_bucket("customers") as bucket:   # a bucket handle of the caller's own
        bucket.upsert("k", {"v": 1})
    state.close()

``State.location`` opens the same state again in another process (a worker, a sandboxed child); nothing
else about a state needs to travel.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Self, Union

from eventing.errors import ConfigError, NotFoundError

if TYPE_CHECKING:
    from eventing.storage.file_area import FileArea
    from eventing.storage.protocol import FileBucket
    from metadata import MetadataStore

STORE_ENV = "EVENTING_STORE"
DATA_DIR_ENV = "EVENTING_DATA_DIR"
DEFAULT_DATA_DIR = ".eventing"


class State(Protocol):
    """A deployment's state (see the module docstring)."""

    @property
    def location(self) -> str:
        """What `open_state` takes to open this state again (a directory path or a PostgreSQL URL)."""
        ...

    @property
    def shown(self) -> str:
        """The location for messages: never a password."""
        ...

    @property
    def directory(self) -> Path | None:
        """The data directory holding the files; None when a server holds everything."""
        ...

    @property
    def metadata(self) -> MetadataStore:
        """The metadata store, opened on first use and shared by the process's threads (each call runs
        in a transaction of its own); closed with the state."""
        ...

    def exists(self) -> bool:
        """Whether anything was ever stored here (a metadata store exists)."""
        ...

    def open_metadata(self) -> MetadataStore:
        """A metadata store of the caller's own (its own connection), which the caller closes."""
        ...

    def open_bucket(self, name: str) -> FileBucket:
        """A handle on bucket `name` (the caller closes it); NotFoundError naming the buckets there are."""
        ...

    def create_bucket(self, name: str, *, exist_ok: bool = False, partitions: int = 1) -> FileBucket: ...

    def drop_bucket(self, name: str) -> str:
        """Delete a bucket and everything in it; returns where it was, for messages."""
        ...

    def bucket_names(self) -> list[str]: ...

    def has_bucket(self, name: str) -> bool: ...

    def bucket_token(self, name: str) -> int:
        """A cheap token of bucket `name`'s identity for callers that keep a bucket open: it changes when
        the bucket is dropped and created again; -1 when there is none. A token that never changes (0)
        means the bucket's own calls fail once it is gone (a server store)."""
        ...

    @property
    def app_logs(self) -> AppLogs:
        """The functions' application logs (what handlers' log() wrote)."""
        ...

    def runtime_dir(self) -> Path:
        """A folder of this machine for what is not state (sockets, the kept Ray instance's address)."""
        ...

    def wake_listener(self) -> Any:
        """A listener for committed writes (`start`, `take`, `wait`, `interrupt`, `close`, `on_notify`): the
        running service wakes the caught-up workers owning the vBuckets written."""
        ...

    def file_area(self, root: str) -> FileArea:
        """Named binary files under ``root`` (``windows/<function>``: a windowed function's row files,
        partial aggregates and held rows), on the directory or the server that holds this state."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...


class AppLogWriter(Protocol):
    """Appends a function's application log lines (``write`` stamps one; ``write_lines`` takes stamped
    ones)."""

    def write(self, text: str) -> None: ...
    def write_lines(self, lines: list[str]) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class AppLogs(Protocol):
    """The application logs of a state: one log per function, rotated (bounded) by size."""

    def writer(self, function: str, max_size: int = ..., max_files: int = ...) -> AppLogWriter: ...
    def where(self, function: str) -> str | None: ...
    def tail(self, function: str, lines: int) -> list[str]: ...
    def tail_bytes(self, function: str, size: int) -> bytes | None: ...
    def follow(self, function: str, poll_s: float = 0.2, stop: float | None = None) -> Iterator[str]: ...


class _PerThreadStore:
    """A metadata store shared by the threads of a process: each thread uses a store of its own, opened
    when it first calls (a SQLite connection runs one transaction at a time)."""

    def __init__(self, opener: Callable[[], MetadataStore]):
        self._opener = opener
        self._local = threading.local()
        self._opened: list[MetadataStore] = []
        self._lock = threading.Lock()

    def _store(self) -> MetadataStore:
        store = getattr(self._local, "store", None)
        if store is None:
            store = self._opener()
            self._local.store = store
            with self._lock:
                self._opened.append(store)
        return store

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._store(), name)

    def __enter__(self) -> _PerThreadStore:
        return self

    def __exit__(self, *exc: object) -> None:
        pass  # the state closes it

    def close(self) -> None:
        pass  # the state closes it (a caller done with the shared store leaves it open for the others)

    def close_all(self) -> None:
        with self._lock:
            opened, self._opened = self._opened, []
        self._local = threading.local()
        for store in opened:
            store.close()


class DirectoryState:
    """A data directory: one SQLite file per bucket (or per partition) under ``buckets/``, the metadata
    store in ``metadata.sqlite3`` (or on Couchbase when $EVENTING_METADATA_URL names a cluster), window row
    files under ``windows/``, application logs under ``logs/``."""

    def __init__(self, directory: str | os.PathLike[str]):
        self._directory = Path(directory)
        self._shared: _PerThreadStore | None = None
        self._lock = threading.Lock()

    @property
    def location(self) -> str:
        return str(self._directory)

    @property
    def shown(self) -> str:
        return str(self._directory)

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def metadata(self) -> MetadataStore:
        if self._shared is None:
            with self._lock:
                if self._shared is None:
                    # The opener holds the directory, not this state: no reference cycle, so a state nobody
                    # holds any more closes its connections at once (a store file left open keeps its WAL).
                    self._shared = _PerThreadStore(functools.partial(_open_directory_store, self._directory))
        return self._shared  # type: ignore[return-value]

    def exists(self) -> bool:
        from metadata import METADATA_URL_ENV
        from metadata.factory import SQLITE_FILE

        return (self._directory / SQLITE_FILE).exists() or bool(os.environ.get(METADATA_URL_ENV, "").strip())

    def open_metadata(self) -> MetadataStore:
        return _open_directory_store(self._directory)

    def __del__(self) -> None:
        # A state opened for one call (as_state of a location) and dropped: its store closes now, not when
        # the cyclic collector finds it (an open connection keeps the store's WAL beside it).
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit, or a store already gone
            pass

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DirectoryState) and other._directory == self._directory

    def __hash__(self) -> int:
        return hash(("directory", self._directory))

    def open_bucket(self, name: str) -> FileBucket:
        from eventing.storage.factory import open_bucket

        return open_bucket(self._directory, name)

    def create_bucket(self, name: str, *, exist_ok: bool = False, partitions: int = 1) -> FileBucket:
        from eventing.storage.factory import create_bucket

        return create_bucket(self._directory, name, exist_ok=exist_ok, partitions=partitions)

    def drop_bucket(self, name: str) -> str:
        from eventing.storage.factory import drop_bucket

        return str(drop_bucket(self._directory, name))

    def bucket_names(self) -> list[str]:
        from eventing.storage.files import list_buckets

        return list_buckets(self._directory)

    def has_bucket(self, name: str) -> bool:
        return self.bucket_token(name) != -1

    def bucket_token(self, name: str) -> int:
        """The main file's inode: a dropped and re-created bucket is a new file (an open SQLite connection
        would go on writing into the unlinked one)."""
        from eventing.storage.files import bucket_path

        try:
            return os.stat(bucket_path(self._directory, name)).st_ino
        except (OSError, ValueError):
            return -1

    @property
    def app_logs(self) -> AppLogs:
        from eventing.storage.app_logs import DirectoryAppLogs

        return DirectoryAppLogs(self._directory)

    def runtime_dir(self) -> Path:
        return self._directory

    def wake_listener(self) -> Any:
        """What the running service listens on for committed writes (eventing.storage.wake)."""
        from eventing.storage.wake import WakeListener

        return WakeListener(self._directory)

    def file_area(self, root: str) -> FileArea:
        from eventing.storage.file_area import DirectoryArea, check_folder

        return DirectoryArea(self._directory / check_folder(root))

    def close(self) -> None:
        with self._lock:
            shared, self._shared = self._shared, None
        if shared is not None:
            shared.close_all()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<state {self.shown}>"

    def __reduce__(self) -> tuple:
        return (DirectoryState, (str(self._directory),))  # a copy in another process opens its own store


def _open_directory_store(directory: Path) -> MetadataStore:
    from metadata.factory import open_store

    return open_store(directory)


def is_server_location(location: str) -> bool:
    from metadata.postgres import is_postgres_url

    return is_postgres_url(location)


def open_state(location: str | os.PathLike[str], *, reached_before: bool = False) -> State:
    """The state at `location`: a data directory, or a ``postgresql://`` URL. `reached_before`: this process
    is part of a running deployment (a worker), whose service reached the store: a server that does not
    answer is an outage to wait out ($EVENTING_STORE_WAIT_S), not a mistake in the location to name at
    once."""
    text = os.fspath(location)
    if is_server_location(text):
        from eventing.storage.postgres.state import PostgresState

        return PostgresState(text, reached_before=reached_before)
    if "://" in text:  # a URL of a kind no store is: not a folder named "foo:" to create
        scheme = text.partition("://")[0]  # only the scheme: the rest may hold a password
        raise ConfigError(
            f"store location {scheme}://... is a URL of a kind no store has: --store (or $EVENTING_STORE) "
            "takes a data directory or a PostgreSQL URL, postgresql://user@host:5432/db (postgres:// too)"
        )
    return DirectoryState(text)


StateLike = Union["State", str, os.PathLike]  # a state, or a location to open one from


def as_state(state_or_location: StateLike) -> State:
    """A state given, or opened from a location (a convenience for scripts and tests: the faces open one
    state per process and pass it down)."""
    if isinstance(state_or_location, str | os.PathLike):
        return open_state(state_or_location)
    return state_or_location


def default_location(environ: dict[str, str] | None = None) -> str:
    """$EVENTING_STORE, else $EVENTING_DATA_DIR, else ./.eventing."""
    env = os.environ if environ is None else environ
    return env.get(STORE_ENV, "").strip() or env.get(DATA_DIR_ENV, "").strip() or DEFAULT_DATA_DIR


def require_existing(state: State) -> State:
    """The state, or NotFoundError when nothing was stored there yet (a command that only reads)."""
    if not state.exists():
        raise NotFoundError(
            f"no eventing metadata in {state.shown}; deploy a function first (`eventing deploy "
            "functions/fn_email.json`) or pass the right --store / --data-dir"
        )
    return state
