"""The handler log of a run: every `log(...)` a deployed handler calls, one line per call, appended to
``<data-dir>/logs/<function>.log`` by every worker of the function.

A line is ``<time> <function> <vb>:<seqno> <key> <text>``: the time in ISO 8601 UTC with milliseconds,
the mutation being handled (``-:- -`` outside a handler call, e.g. at import), and the logged parts joined
by spaces as ``print`` would, with newlines written as ``\\n`` so that one call stays one line. Each line
is a single ``write`` to a file opened for appending, so lines of workers in other processes never mix.
(`eventing debug` shows the same lines in its trace instead.)
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

LOG_DIR = "logs"
_logger = logging.getLogger("eventing.handler")


def handler_log_path(data_dir: str | os.PathLike[str], function: str) -> Path:
    """Where the handler log of ``function`` is written."""
    return Path(data_dir) / LOG_DIR / f"{function}.log"


def format_line(at_s: float, function: str, vb: int | None, seqno: int | None, key: str | None, text: str) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at_s)) + f".{int(at_s * 1000) % 1000:03d}Z"
    where = f"{vb}:{seqno}" if vb is not None else "-:-"
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    return f"{stamp} {function} {where} {key if key is not None else '-'} {text}\n"


class HandlerLogFile:
    """``log`` as a worker's handler module sees it: ``current()`` gives the mutation being handled (an
    object with ``vb``, ``seqno`` and ``key``, or None). The file is opened at the first line."""

    def __init__(self, data_dir: str | os.PathLike[str], function: str, current: Callable[[], Any]):
        self.path = handler_log_path(data_dir, function)
        self.function = function
        self.current = current
        self.lines = 0
        self._fd: int | None = None

    def __call__(self, *parts: object) -> None:
        text = " ".join(str(p) for p in parts)
        m = self.current()
        line = format_line(
            time.time(), self.function, getattr(m, "vb", None), getattr(m, "seqno", None), getattr(m, "key", None), text
        )
        try:
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(self._fd, line.encode("utf-8", "backslashreplace"))
            self.lines += 1
        except OSError as exc:  # a full disk must not fail the handler: the line still reaches the logger
            _logger.warning("cannot write the handler log %s (%s): %s", self.path, exc.strerror, line.rstrip())
        _logger.info(line.rstrip())

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
