"""What `ps` shows of an eventing command: a password in a PostgreSQL URL on the command line
(`--store postgresql://user:PASSWORD@host/db`) is overwritten with `*` in the process's own arguments as the
command starts, so `ps`, /proc/PID/cmdline and what Ray records of its driver show `user:********@host`.

Linux keeps a process's arguments in its own memory and shows them from there (/proc/self/stat gives where);
the command rewrites its copy in place, keeping its length. Python's `sys.argv` is a copy made at start-up and
keeps the password for the command itself. For the moments between the start of the process and this rewrite
the password is visible: $PGPASSWORD, ~/.pgpass or $EVENTING_STORE keep it off the command line altogether
(docs/postgresql.md)."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

# Fields of /proc/self/stat after the command name's ")": the third field (state) is the first.
_ARG_START, _ARG_END = 48 - 3, 49 - 3


def hide_passwords() -> int:
    """Overwrite the passwords of PostgreSQL URLs among this process's arguments; how many were found."""
    if not sys.platform.startswith("linux"):
        return 0
    from metadata.postgres.location import password_spans

    try:
        fields = Path("/proc/self/stat").read_text().rpartition(")")[2].split()
        start, end = int(fields[_ARG_START]), int(fields[_ARG_END])
        raw = Path("/proc/self/cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return 0
    if not 0 < start < end or b"://" not in raw:
        return 0
    hidden = 0
    offset = 0
    for arg in raw[: end - start].split(b"\0"):
        text = arg.decode(errors="surrogateescape")
        for first, last in password_spans(text):
            at = offset + len(text[:first].encode(errors="surrogateescape"))
            size = len(text[first:last].encode(errors="surrogateescape"))
            if at + size <= end - start:
                ctypes.memset(start + at, ord("*"), size)
                hidden += 1
        offset += len(arg) + 1
    return hidden
