"""The application log as handlers write it (eventing.storage.app_logs holds it, below the execution layer,
so that every kind of state can keep one); its names as the execution layer has always imported them."""

from __future__ import annotations

from eventing.storage.app_logs import (  # noqa: F401 - re-exported
    DEFAULT_MAX_FILES,
    DEFAULT_MAX_SIZE,
    REMOTE_BATCH_BYTES,
    REMOTE_BATCH_LINES,
    REMOTE_FLUSH_S,
    AppLogWriter,
    RemoteAppLog,
    files_oldest_first,
    follow,
    log_path,
    stamped,
    tail,
)
