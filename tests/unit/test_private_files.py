"""What a data directory holds is its owner's alone: the metadata store (scrypt hashes, URL secrets) with its
-wal and -shm files, bucket files (partitions too), backups and the folders holding them are made 0600 files
in 0700 folders whatever the umask. `eventing backup -o` says which folders it made, and a restore leaves
nothing beside the backup it read."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from eventing.cli.app import main
from eventing.core.definition import FunctionDefinition
from eventing.storage.factory import create_bucket, open_bucket
from eventing.testing import deploy_function
from metadata.factory import open_store

HANDLER = "def on_update(doc, meta):\n    log('seen', meta.id)\n"


@pytest.fixture
def permissive_umask():
    """Files and folders would be world-readable (0644, 0755) if their modes were left to the umask."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def cli(capsys, data_dir: str, *argv: str) -> tuple[int, str]:
    status = main(["--data-dir", data_dir, *argv])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def test_a_data_directory_its_store_buckets_and_backups_are_private(tmp_path, capsys, permissive_umask):
    data_dir = str(tmp_path / "new" / "data")
    assert cli(capsys, data_dir, "bucket", "create", "src")[0] == 0
    assert cli(capsys, data_dir, "bucket", "create", "parts", "--partitions", "2")[0] == 0
    with open_bucket(data_dir, "src") as src:
        src.upsert("k", {"n": 1})
    deploy_function(
        data_dir, FunctionDefinition.from_dict({"name": "fn_src", "source_bucket": "src"}), HANDLER
    )
    with open_store(data_dir) as store:
        store.put_user("root", "scrypt$hash", ["admin"])  # the store is open: its -wal and -shm are there
        root = Path(data_dir)
        files = [
            root / "metadata.sqlite3",
            root / "metadata.sqlite3-wal",
            root / "metadata.sqlite3-shm",
            root / "buckets" / "src.sqlite3",
            root / "buckets" / "parts.sqlite3",
            root / "buckets" / "parts.partitions" / "1.sqlite3",
            root / "buckets" / "src.sqlite3-wlock",  # the writers' turns: a side file, empty, private too
        ]
        assert {str(f): mode(f) for f in files} == {str(f): 0o600 for f in files}
    assert cli(capsys, data_dir, "run", "--until-caught-up", "--executor", "in-process")[0] == 0
    folders = [root.parent, root, root / "buckets", root / "buckets" / "parts.partitions", root / "logs"]
    assert {str(f): mode(f) for f in folders} == {str(f): 0o700 for f in folders}
    assert mode(root / "logs" / "fn_src.log") == 0o600
    status, out = cli(capsys, data_dir, "backup", "-o", str(tmp_path / "kept" / "b.sqlite3"))
    assert status == 0
    assert out.splitlines()[0] == f"created the folder {tmp_path / 'kept'} (it did not exist)"
    assert mode(tmp_path / "kept") == 0o700 and mode(tmp_path / "kept" / "b.sqlite3") == 0o600
    status, out = cli(capsys, data_dir, "backup", "--with-buckets", "-o", str(tmp_path / "all" / "b1"))
    assert status == 0 and f"{tmp_path / 'all'}, {tmp_path / 'all' / 'b1'}" in out.splitlines()[0]
    copies = [p for p in (tmp_path / "all").rglob("*")]
    assert {str(p): mode(p) for p in copies} == {str(p): 0o700 if p.is_dir() else 0o600 for p in copies}
    status, out = cli(capsys, data_dir, "backup")  # its default folder: nothing to say about folders
    assert status == 0 and "created the folder" not in out


def test_a_restore_leaves_nothing_beside_the_backup(data_dir, tmp_path, capsys):
    create_bucket(data_dir, "src").close()
    deploy_function(
        data_dir, FunctionDefinition.from_dict({"name": "fn_src", "source_bucket": "src"}), HANDLER
    )
    backups = tmp_path / "backups"
    backups.mkdir()
    assert cli(capsys, data_dir, "backup", "-o", str(backups / "b.sqlite3"))[0] == 0
    assert cli(capsys, data_dir, "restore", str(backups / "b.sqlite3"))[0] == 0
    assert sorted(p.name for p in backups.iterdir()) == ["b.sqlite3"]
    with open_store(data_dir, create=False) as store:
        assert [f.name for f in store.list_functions()] == ["fn_src"]
