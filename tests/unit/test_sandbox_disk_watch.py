"""The host's watch on a sandboxed child's disk (eventing.workers.sandbox.disk_watch): what a folder and
the files given to it hold on disk, links not followed, and the child past the limit reported once a look."""

from __future__ import annotations

import os

import pytest

from eventing.errors import ConfigError
from eventing.workers.sandbox.disk_watch import DiskWatch, disk_limit_bytes, used_bytes


def write(path, megabytes: int) -> None:
    with open(path, "wb") as f:
        f.write(os.urandom(1024) * (megabytes * 1024))
        f.flush()
        os.fsync(f.fileno())


def test_a_folder_counts_its_files_blocks_and_its_open_files_not_what_links_point_to(tmp_path):
    folder = tmp_path / "child"
    (folder / "sub").mkdir(parents=True)
    write(folder / "a", 2)
    write(folder / "sub" / "b", 1)
    write(tmp_path / "outside", 8)
    os.symlink(tmp_path / "outside", folder / "link")  # a package view's link: not the child's disk
    notes = os.open(tmp_path / "notes", os.O_RDWR | os.O_CREAT)
    try:
        os.posix_fallocate(notes, 0, 3 << 20)
        used = used_bytes(str(folder), [notes])
    finally:
        os.close(notes)
    assert 6 << 20 <= used < 7 << 20


def test_a_child_past_the_limit_is_reported_and_a_forgotten_one_is_not(tmp_path, monkeypatch):
    monkeypatch.setenv("EVENTING_SANDBOX_DISK_MB", "1")
    small, large = tmp_path / "small", tmp_path / "large"
    small.mkdir()
    large.mkdir()
    write(large / "f", 2)
    watch, over = DiskWatch(), []
    kept = watch.watch(str(small), [], lambda used: over.append(("small", used)))
    key = watch.watch(
        str(large),
        [os.open(tmp_path / "large" / "f", os.O_RDONLY)],
        lambda used: over.append(("large", used)),
    )
    watch.check()
    assert [name for name, _ in over] == ["large"] and over[0][1] >= 2 << 20
    watch.forget(key)  # the child ended: its files are closed, it is looked at no more
    watch.check()
    assert len(over) == 1
    watch.forget(kept)


@pytest.mark.parametrize("value", ["0", "-5", "lots", "1.5"])
def test_a_bad_limit_is_one_line_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("EVENTING_SANDBOX_DISK_MB", value)
    with pytest.raises(ConfigError, match="EVENTING_SANDBOX_DISK_MB"):
        disk_limit_bytes()
