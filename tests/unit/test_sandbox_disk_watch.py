"""The host's watch on a sandboxed child's disk (eventing.workers.sandbox.disk_watch): what a folder and
the files given to it hold on disk, links not followed, and the child past the limit reported once a look."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from eventing.errors import ConfigError
from eventing.workers.sandbox.disk_watch import DiskWatch, disk_limit_bytes, used_bytes


def write(path, megabytes: int) -> None:
    with open(path, "wb") as f:
        f.write(os.urandom(1024) * (megabytes * 1024))
        f.flush()
        os.fsync(f.fileno())


def test_a_folder_counts_its_files_blocks_and_what_its_process_holds_open_not_what_links_point_to(tmp_path):
    folder = tmp_path / "child"
    (folder / "sub").mkdir(parents=True)
    write(folder / "a", 2)
    write(folder / "sub" / "b", 1)
    write(tmp_path / "outside", 8)
    os.symlink(tmp_path / "outside", folder / "link")  # a package view's link: not the child's disk
    alone = used_bytes(str(folder))
    assert 3 << 20 <= alone < (3 << 20) + (256 << 10)  # the folders' own blocks are counted too
    # what a process holds: a file outside the folder (its call notes), one removed while open, and the
    # folder's own file open again (counted once); a process of its own, whose only open files are these
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys, time\n"
            "notes = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
            "removed = os.open(sys.argv[2], os.O_RDWR | os.O_CREAT)\n"
            "again = os.open(sys.argv[3], os.O_RDONLY)\n"
            "os.posix_fallocate(notes, 0, 3 << 20)\n"
            "os.posix_fallocate(removed, 0, 5 << 20)\n"
            "os.unlink(sys.argv[2])\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n",
            str(tmp_path / "notes"),
            str(folder / "gone"),
            str(folder / "a"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        used = used_bytes(str(folder), holder.pid)
    finally:
        holder.kill()
        holder.wait()
    assert used - alone >= 8 << 20 and used - alone < (8 << 20) + (1 << 20), (used, alone)


def test_a_child_past_the_limit_is_reported_and_a_forgotten_one_is_not(tmp_path):
    small, large = tmp_path / "small", tmp_path / "large"
    small.mkdir()
    large.mkdir()
    write(large / "f", 2)
    watch, over = DiskWatch(), []
    kept = watch.watch(str(small), None, 1 << 20, lambda used: over.append(("small", used)))
    key = watch.watch(str(large), None, 1 << 20, lambda used: over.append(("large", used)))
    watch.check()
    assert [name for name, _ in over] == ["large"] and over[0][1] >= 2 << 20
    watch.forget(key)  # the child is being ended: it is looked at no more
    watch.check()
    assert len(over) == 1
    watch.forget(kept)


@pytest.mark.parametrize("value", ["0", "-5", "lots", "1.5"])
def test_a_bad_limit_is_one_line_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("EVENTING_SANDBOX_DISK_MB", value)
    with pytest.raises(ConfigError, match="EVENTING_SANDBOX_DISK_MB"):
        disk_limit_bytes()


def test_a_notes_file_grown_by_a_handler_is_cut_back_when_reopened_and_its_notes_kept(tmp_path):
    from eventing.workers.crash_guard import CallNotes, notes_path, open_notes_file

    fd = open_notes_file("loc", "fn", "w0", tmp_path)
    assert fd is not None
    notes = CallNotes(fd, generation=3, slots=2)
    notes.note(0, 7, 100, 120)  # a call in flight when the process died
    os.posix_fallocate(fd, 0, 64 << 20)  # what a sandboxed handler could do to its inherited descriptor
    os.close(fd)
    fd = open_notes_file("loc", "fn", "w0", tmp_path)
    try:
        assert os.fstat(fd).st_size <= 1 << 16
        assert CallNotes(fd, generation=3, slots=2).left  # the notes of the call in flight survive
    finally:
        os.close(fd)
    assert notes_path("loc", "fn", "w0", tmp_path).exists()
