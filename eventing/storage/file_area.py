"""Named binary files written whole: the storage a windowed function's row files, partial aggregates and
held rows live in (``State.file_area(root)``), on a data directory or on a PostgreSQL server.

    area = state.file_area("windows/fn_sales")
    area.write("incoming/g1-w0-1a2b-000000000.arrow", data)   # durable and atomic once it returns
    area.list("incoming")                                      # ["g1-w0-1a2b-000000000.arrow"]
    table = pa.ipc.open_file(pa.BufferReader(area.read("incoming/g1-...arrow"))).read_all()
    area.delete("incoming/g1-...arrow"); area.delete_folder("staging")

A name is a relative path of folders and a file name (``incoming/x.arrow``, ``staging/job-1/x.parquet``),
none of them empty, ``.`` or ``..``; names starting with ``.`` are never listed (a directory's temporary
files). ``DirectoryArea`` keeps the files under a folder of this machine exactly as they always were
(written under a hidden temporary name, fsynced, renamed into place, the folder fsynced), so readers that
want a real file (a memory map, a local Spark) get its path from ``local_path``; the PostgreSQL area
(``eventing.storage.postgres.file_area.PostgresArea``) keeps them in a table and has no local path.
``ServiceArea`` is a remote worker's: its writes go to the data service, which writes them under the
data directory.
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from eventing.errors import StoreError
from metadata.sqlite_io import private_folder

Data = bytes | bytearray | memoryview


class FileArea(Protocol):
    """Named binary files written whole (see the module docstring)."""

    def write(self, name: str, data: Data) -> None:
        """Store ``data`` as ``name``, replacing any file of that name: when this returns the file is durable,
        and a reader sees either the old file or the whole new one."""
        ...

    def read(self, name: str) -> bytes:
        """The file's bytes; FileNotFoundError when there is none."""
        ...

    def list(self, folder: str) -> list[str]:
        """The names of the files directly in ``folder`` (without the folder), sorted; [] when it is empty
        or missing."""
        ...

    def exists(self, name: str) -> bool: ...

    def delete(self, name: str) -> None:
        """Remove the file; a missing one is fine."""
        ...

    def delete_many(self, names: Iterable[str]) -> None:
        """``delete`` for each name (one round trip on a server)."""
        ...

    def delete_folder(self, folder: str) -> None:
        """Remove ``folder`` and everything under it; a missing one is fine."""
        ...

    def copy(self, source: str, target: str) -> None:
        """Store ``source``'s bytes as ``target`` too (a hard link on a directory); the copy stays when the
        source is deleted. FileNotFoundError when ``source`` is missing."""
        ...

    def local_path(self, name: str) -> Path | None:
        """Where ``name`` (a file or a folder) is on this machine's file system, or None when the area is
        not a folder of this machine."""
        ...

    def describe(self, name: str) -> str:
        """Where ``name`` is, for messages."""
        ...


def split_name(name: str) -> tuple[str, str]:
    """(folder, file name) of a name ("" for a file at the top); ValueError for a name that is not a plain
    relative path."""
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name or "\x00" in name:
        raise ValueError(f"file name {name!r} must be a relative path such as 'incoming/x.arrow'")
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(
            f"file name {name!r} must be a relative path such as 'incoming/x.arrow' (no '', '.', '..')"
        )
    return "/".join(parts[:-1]), parts[-1]


def check_folder(folder: str) -> str:
    """A folder name as ``split_name`` checks names; "" is the area's top."""
    if folder:
        split_name(folder)
    return folder


def disk_full_error(path: Path, count: int, exc: OSError) -> StoreError | None:
    """The one line every full disk gives (``cannot write PATH: the disk is full ...``), or None when
    ``exc`` is another error."""
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT) and "No space left" not in str(exc):
        return None
    folder = path.parent
    what = path if count == 1 else f"{count} files in {folder}"
    return StoreError(
        f"cannot write {what}: the disk is full ({exc.strerror or exc}); free space on the file system of "
        f"{folder} (see `df {folder}`), then run the command again (nothing was checkpointed past what is on "
        "disk)"
    )


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DirectoryArea:
    """Files under a folder of this machine (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)
        self._made: set[Path] = set()  # folders known to exist: one mkdir per folder, not per write

    def _path(self, name: str) -> Path:
        split_name(name)
        return self.root / name

    def _folder_of(self, path: Path) -> None:
        folder = path.parent
        if folder not in self._made:
            private_folder(folder)
            self._made.add(folder)

    def write(self, name: str, data: Data) -> None:
        path = self._path(name)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        try:
            try:
                self._open_write(tmp, data)
            except FileNotFoundError:  # the folder went (a reset): make it again
                self._made.discard(path.parent)
                self._folder_of(path)
                self._open_write(tmp, data)
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise disk_full_error(path, 1, exc) or exc from None
        fsync_dir(path.parent)

    def _open_write(self, tmp: Path, data: Data) -> None:
        self._folder_of(tmp)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def read(self, name: str) -> bytes:
        return self._path(name).read_bytes()

    def list(self, folder: str) -> list[str]:
        try:
            with os.scandir(self.root / check_folder(folder)) as listing:
                return sorted(e.name for e in listing if not e.name.startswith(".") and e.is_file())
        except (FileNotFoundError, NotADirectoryError):
            return []

    def exists(self, name: str) -> bool:
        return self._path(name).is_file()

    def delete(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)

    def delete_many(self, names: Iterable[str]) -> None:
        for name in names:
            self.delete(name)

    def delete_folder(self, folder: str) -> None:
        if not check_folder(folder):
            raise ValueError("delete_folder needs a folder inside the area, not its top")
        path = self.root / folder
        shutil.rmtree(path, ignore_errors=True)
        self._made = {made for made in self._made if made != path and path not in made.parents}

    def copy(self, source: str, target: str) -> None:
        src, dst = self._path(source), self._path(target)
        self._folder_of(dst)
        try:
            os.link(src, dst)
        except FileExistsError:
            dst.unlink()
            os.link(src, dst)
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                raise
            shutil.copyfile(src, dst)  # no hard links on this file system

    def local_path(self, name: str) -> Path:
        return self.root / check_folder(name)

    def describe(self, name: str) -> str:
        return str(self.root / name)

    def __repr__(self) -> str:
        return f"<DirectoryArea {self.root}>"


class ServiceArea:
    """A remote worker's area: it only writes, and each write goes to the data service (``put``, which
    writes the file durably under the same name in the data directory before it returns)."""

    def __init__(self, put: Callable[[str, bytes], None], root: str):
        self._put = put
        self.root = root

    def write(self, name: str, data: Data) -> None:
        split_name(name)
        self._put(f"{self.root}/{name}", data if isinstance(data, bytes) else bytes(data))

    def read(self, name: str) -> bytes:
        raise _write_only()

    def list(self, folder: str) -> list[str]:
        raise _write_only()

    def exists(self, name: str) -> bool:
        raise _write_only()

    def delete(self, name: str) -> None:
        raise _write_only()

    def delete_many(self, names: Iterable[str]) -> None:
        raise _write_only()

    def delete_folder(self, folder: str) -> None:
        raise _write_only()

    def copy(self, source: str, target: str) -> None:
        raise _write_only()

    def local_path(self, name: str) -> None:
        return None

    def describe(self, name: str) -> str:
        return f"{self.root}/{name} (through the data service)"


def _write_only() -> NotImplementedError:
    return NotImplementedError(
        "a remote worker's file area only writes; the service that holds the data directory reads it"
    )
