"""The state of a deployment on a PostgreSQL server (``--store postgresql://...``): the metadata store,
the buckets, the windows' files and the application logs are tables of one database (or of one schema of
it: ``?schema=NAME``), so no machine holds data and any number of machines run `eventing` on it. The
server's own replication and backups protect it."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from metadata.postgres.connection import PostgresDatabase
from metadata.postgres.location import parse_postgres_url

if TYPE_CHECKING:
    from eventing.storage.file_area import FileArea
    from eventing.storage.protocol import FileBucket
    from eventing.storage.state import AppLogs
    from metadata import MetadataStore


class PostgresState:
    """``State`` (eventing.storage.state) on a PostgreSQL server."""

    def __init__(self, url: str, *, reached_before: bool = False):
        self._url = url
        self.target = parse_postgres_url(url)
        self.db = PostgresDatabase.open(url)
        if reached_before:  # a worker of a running deployment (eventing.storage.state.open_state)
            self.db.reached_before()
        self._metadata: MetadataStore | None = None
        self._lock = threading.Lock()

    @property
    def location(self) -> str:
        return self._url

    @property
    def shown(self) -> str:
        return self.target.shown

    @property
    def directory(self) -> None:
        return None

    @property
    def metadata(self) -> MetadataStore:
        if self._metadata is None:
            with self._lock:
                if self._metadata is None:
                    self._metadata = self.open_metadata()
        return self._metadata

    def exists(self) -> bool:
        from metadata.postgres.store import PostgresMetadataStore

        return PostgresMetadataStore.exists_in(self.db)

    def open_metadata(self) -> MetadataStore:
        from metadata.postgres.store import PostgresMetadataStore

        return PostgresMetadataStore(self.db)  # a pool: safe from any thread

    def open_bucket(self, name: str) -> FileBucket:
        from eventing.storage import postgres

        return postgres.open_bucket(self.db, name)

    def create_bucket(self, name: str, *, exist_ok: bool = False, partitions: int = 1) -> FileBucket:
        from eventing.storage import postgres

        return postgres.create_bucket(self.db, name, exist_ok=exist_ok, partitions=partitions)

    def drop_bucket(self, name: str) -> str:
        from eventing.storage import postgres

        postgres.drop_bucket(self.db, name)
        return f"bucket {name} of {self.shown}"

    def bucket_names(self) -> list[str]:
        from eventing.storage import postgres

        return postgres.bucket_names(self.db)

    def has_bucket(self, name: str) -> bool:
        return name in self.bucket_names()

    def bucket_token(self, name: str) -> int:
        return 0  # a dropped bucket's own calls fail (NotFoundError): no look before each request

    def file_area(self, root: str) -> FileArea:
        from eventing.storage.postgres.file_area import PostgresArea

        return PostgresArea(self.db, root)

    @property
    def app_logs(self) -> AppLogs:
        from eventing.storage.postgres.app_log import PostgresAppLogs

        return PostgresAppLogs(self.db)

    def runtime_dir(self) -> Path:
        """Per machine and store: ~/.cache/eventing/<hash of the location> (sockets, the kept Ray
        instance)."""
        digest = hashlib.sha256(self.target.url.encode() + (self.target.schema or "").encode()).hexdigest()[
            :16
        ]
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eventing"
        return base / f"run-{digest}"

    def wake_listener(self) -> Any:
        from eventing.storage.postgres import PostgresWakeListener

        return PostgresWakeListener(self.db)

    def close(self) -> None:
        with self._lock:
            store, self._metadata = self._metadata, None
        if store is not None:
            store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PostgresState) and other._url == self._url

    def __hash__(self) -> int:
        return hash(("postgresql", self._url))

    def __repr__(self) -> str:
        return f"<state {self.shown}>"

    def __reduce__(self) -> tuple:
        return (PostgresState, (self._url,))
