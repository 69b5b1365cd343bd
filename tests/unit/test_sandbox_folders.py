"""Sandbox folders are removed whichever way their host ends: `sweep_sandboxes` removes a folder whose
host's lock on `<folder>.lock` is free (the kernel frees it when the host ends, even by kill -9), and
leaves a folder whose lock is held, or that has no lock file (being created, or another version's) unless
nothing changed it for an hour."""

from __future__ import annotations

import fcntl
import os
import tempfile

from eventing.workers.sandbox import folders as sandbox


def _folder(root: str, name: str, *, locked: bool) -> int | None:
    os.mkdir(os.path.join(root, name))
    with open(os.path.join(root, name, "file"), "w") as f:
        f.write("x")
    fd = os.open(os.path.join(root, name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    if locked:
        fcntl.flock(
            fd, fcntl.LOCK_EX
        )  # a live host's (flock locks of two opens conflict, in one process too)
        return fd
    os.close(fd)
    return None


def test_a_sweep_removes_only_the_folders_of_hosts_that_ended(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    root = sandbox.sandboxes_root()
    assert root == str(tmp_path / "eventing-sandboxes")
    held = _folder(root, "fn_live-1", locked=True)
    _folder(root, "fn_dead-2", locked=False)
    os.mkdir(os.path.join(root, "fn_unlocked-3"))
    try:
        assert sandbox.sweep_sandboxes() == 1
        assert sorted(os.listdir(root)) == ["fn_live-1", "fn_live-1.lock", "fn_unlocked-3"]
    finally:
        assert held is not None
        os.close(held)  # the live host ends
    assert sandbox.sweep_sandboxes() == 1
    assert os.listdir(root) == ["fn_unlocked-3"]


def test_a_folder_without_a_lock_goes_once_it_is_an_hour_old(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    root = sandbox.sandboxes_root()
    for name in ("fn_new-1", "fn_old-2"):
        os.mkdir(os.path.join(root, name))
    hours_ago = os.stat(root).st_mtime - sandbox.ORPHAN_AGE_S - 60
    os.utime(os.path.join(root, "fn_old-2"), (hours_ago, hours_ago))
    assert sandbox.sweep_sandboxes() == 1
    assert os.listdir(root) == ["fn_new-1"]  # being created: its lock comes next
