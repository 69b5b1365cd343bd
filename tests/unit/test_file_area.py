"""The file areas windowed functions keep their files in (eventing.storage.file_area): one contract for a
data directory's folder and for a PostgreSQL store's files table, then what only one of them does (a full
disk, a remote worker's writes, a schema from a newer version), and the PostgreSQL window sink's contract."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventing.errors import StoreError
from eventing.storage.file_area import DirectoryArea, FileArea, ServiceArea
from eventing.storage.state import DirectoryState
from eventing.windows.batches import build_row_batch, read_row_file, row_schema, write_row_file
from eventing.windows.runtime.paths import FOLDERS, reset_windows, window_area


@pytest.fixture(params=["directory", "postgresql"])
def make_area(request, tmp_path):
    """Areas of one backend: ``make_area(root)`` gives the area ``root`` of the same directory or database."""
    if request.param == "directory":
        return lambda root="windows/fn": DirectoryArea(tmp_path / root)
    from eventing.storage.postgres.file_area import PostgresArea

    url = request.getfixturevalue("pg_url")
    return lambda root="windows/fn": PostgresArea.open(url, root)


def test_a_file_reads_back_as_written_and_a_second_write_replaces_it(make_area):
    area: FileArea = make_area()
    area.write("incoming/a.arrow", b"first")
    assert area.read("incoming/a.arrow") == b"first"
    area.write("incoming/a.arrow", memoryview(b"second, longer"))
    assert area.read("incoming/a.arrow") == b"second, longer"
    assert area.exists("incoming/a.arrow") and not area.exists("incoming/b.arrow")
    with pytest.raises(FileNotFoundError):
        area.read("incoming/b.arrow")


def test_large_and_binary_files_keep_every_byte(make_area):
    area = make_area()
    data = bytes(range(256)) * (6 << 12)  # 6 MB, every byte value, NULs included
    area.write("accepted/big.parquet", data)
    assert area.read("accepted/big.parquet") == data
    area.write("accepted/empty.parquet", b"")
    assert area.read("accepted/empty.parquet") == b""


def test_a_listing_holds_the_folders_own_files_sorted(make_area):
    area = make_area()
    for name in [
        "incoming/g1-b-1-000000001.arrow",
        "incoming/g1-a-1-000000000.arrow",
        "incoming/sub/x.arrow",
        "accepted/f1-000000000.parquet",
        "top.txt",
    ]:
        area.write(name, name.encode())
    assert area.list("incoming") == ["g1-a-1-000000000.arrow", "g1-b-1-000000001.arrow"]
    assert area.list("incoming/sub") == ["x.arrow"]
    assert area.list("") == ["top.txt"]
    assert area.list("held") == []  # a folder never written


def test_deletes_take_what_they_name_and_a_missing_file_is_fine(make_area):
    area = make_area()
    for i in range(5):
        area.write(f"incoming/{i}.arrow", b"x")
    area.delete("incoming/0.arrow")
    area.delete("incoming/0.arrow")
    area.delete_many(["incoming/1.arrow", "incoming/2.arrow", "incoming/missing.arrow"])
    area.delete_many([])
    assert area.list("incoming") == ["3.arrow", "4.arrow"]


def test_deleting_a_folder_takes_its_subfolders_and_nothing_else(make_area):
    area, other = make_area("windows/fn"), make_area("windows/fn_2")
    for name in [
        "staging/job-1-1/a.parquet",
        "staging/job-1-2/b.parquet",
        "staging/c.parquet",
        "staging_old/d.parquet",
        "accepted/e.parquet",
    ]:
        area.write(name, b"x")
        other.write(name, b"y")
    area.delete_folder("staging")
    area.delete_folder("never-made")
    assert area.list("staging") == [] and area.list("staging/job-1-1") == []
    assert area.list("staging_old") == ["d.parquet"] and area.list("accepted") == ["e.parquet"]
    assert other.list("staging") == ["c.parquet"] and other.read("staging/job-1-1/a.parquet") == b"y"
    with pytest.raises(ValueError, match="not its top"):
        area.delete_folder("")


def test_a_copy_outlives_its_source_and_replaces_its_target(make_area):
    area = make_area()
    area.write("accepted/a.parquet", b"rows of a")
    area.write("staging/job-1/a.parquet", b"older")
    area.copy("accepted/a.parquet", "staging/job-1/a.parquet")
    area.copy("accepted/a.parquet", "staging/job-2/a.parquet")
    area.delete("accepted/a.parquet")
    assert area.read("staging/job-1/a.parquet") == area.read("staging/job-2/a.parquet") == b"rows of a"
    with pytest.raises(FileNotFoundError):
        area.copy("accepted/a.parquet", "staging/job-3/a.parquet")


@pytest.mark.parametrize("name", ["", "/abs", "../up", "incoming/../x", "a//b", "a/./b", "incoming/"])
def test_names_must_be_plain_relative_paths(make_area, name):
    area = make_area()
    with pytest.raises(ValueError, match="relative path"):
        area.write(name, b"x")
    with pytest.raises(ValueError, match="relative path"):
        area.read(name)


def test_row_files_read_back_through_any_area_and_a_damaged_one_is_named(make_area):
    area = make_area()
    layout = row_schema(["country"], ["amount"])
    table = build_row_batch(
        layout,
        vb=[0, 1],
        seqno=[1, 1],
        key=["a", "b"],
        event_time_ms=[0, 1],
        columns={"country": ["KR", None], "amount": [1.5, None]},
        arrival_ms=[5, 6],
    )
    name = write_row_file(area, "incoming", "g1-w0-1-000000000", table)
    assert name == "incoming/g1-w0-1-000000000.arrow"
    assert read_row_file(area, name).equals(table)
    data = bytearray(area.read(name))
    data[len(data) // 2] ^= 0xFF
    area.write(name, bytes(data))
    with pytest.raises(StoreError, match="is damaged") as caught:
        read_row_file(area, name, function="fn")
    assert area.describe(name) in str(caught.value) and "function 'fn'" in str(caught.value)


def test_reset_windows_empties_every_folder_of_the_function_and_keeps_other_functions(
    make_area, monkeypatch, data_dir
):
    area, other = make_area("windows/fn"), make_area("windows/fn_other")
    monkeypatch.setattr(DirectoryState, "file_area", lambda self, root: make_area(root))
    for folder in FOLDERS:
        area.write(f"{folder}/x", b"x")
        other.write(f"{folder}/x", b"x")

    class States:
        reset_for: list[str] = []

        def window_states(self) -> Any:
            return self

        def reset(self, function: str) -> None:
            self.reset_for.append(function)

    store = States()
    reset_windows(data_dir, store, "fn")
    assert store.reset_for == ["fn"]
    assert all(area.list(folder) == [] for folder in FOLDERS)
    assert all(other.list(folder) == ["x"] for folder in FOLDERS)


# -- a data directory's folder ------------------------------------------------------------------------------


def test_a_directory_area_is_the_data_directorys_windows_folder(data_dir):
    area = window_area(data_dir, "fn")
    assert isinstance(area, DirectoryArea) and area.root == Path(data_dir) / "windows" / "fn"
    area.write("incoming/a.arrow", b"x")
    assert (Path(data_dir) / "windows/fn/incoming/a.arrow").read_bytes() == b"x"
    assert area.local_path("incoming/a.arrow") == Path(data_dir) / "windows/fn/incoming/a.arrow"
    assert not [p for p in (Path(data_dir) / "windows").rglob(".*")], "a temporary file was left behind"


def test_a_directory_area_lists_no_hidden_or_temporary_files(tmp_path):
    area = DirectoryArea(tmp_path)
    area.write("incoming/a.arrow", b"x")
    (tmp_path / "incoming" / ".a.arrow.123.tmp").write_bytes(b"half")
    (tmp_path / "incoming" / "folder").mkdir()
    assert area.list("incoming") == ["a.arrow"]


def test_a_directory_area_writes_again_into_a_folder_removed_meanwhile(tmp_path):
    area = DirectoryArea(tmp_path)
    area.write("incoming/a.arrow", b"x")
    DirectoryArea(tmp_path).delete_folder("incoming")  # another process reset the windows
    area.write("incoming/b.arrow", b"y")
    assert area.list("incoming") == ["b.arrow"]


def test_a_directory_area_on_a_full_disk_says_so_in_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    area = DirectoryArea(tmp_path)
    area.write("incoming/old.arrow", b"old")

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(StoreError) as caught:
        area.write("incoming/old.arrow", b"new")
    target = tmp_path / "incoming" / "old.arrow"
    message = str(caught.value)
    assert f"cannot write {target}: the disk is full" in message and "\n" not in message
    assert f"free space on the file system of {target.parent}" in message
    monkeypatch.undo()
    assert sorted(p.name for p in target.parent.iterdir()) == ["old.arrow"] and target.read_bytes() == b"old"


def test_a_remote_workers_area_sends_each_write_to_the_data_service_under_the_functions_folder():
    sent: list[tuple[str, bytes]] = []
    area = ServiceArea(lambda relative, data: sent.append((relative, data)), "windows/fn")
    area.write("incoming/g1-w-1-000000000.arrow", memoryview(b"rows"))
    assert sent == [("windows/fn/incoming/g1-w-1-000000000.arrow", b"rows")]
    assert area.local_path("incoming") is None
    with pytest.raises(NotImplementedError, match="only writes"):
        area.list("incoming")


# -- a PostgreSQL store's files table ------------------------------------------------------------------------


def test_a_postgresql_area_has_no_local_path_and_names_its_store_in_messages(pg_url):
    from eventing.storage.postgres.file_area import PostgresArea

    area = PostgresArea.open(pg_url, "windows/fn")
    assert area.local_path("incoming/a.arrow") is None
    assert area.describe("incoming/a.arrow") == f"windows/fn/incoming/a.arrow in {area.db.target.shown}"


def test_concurrent_writes_of_one_name_leave_one_whole_file(pg_url):
    from eventing.storage.postgres.file_area import PostgresArea

    area = PostgresArea.open(pg_url, "windows/fn")
    payloads = [bytes([i]) * 200_000 for i in range(8)]
    seen: list[bytes] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                seen.append(area.read("incoming/x.arrow"))
            except FileNotFoundError:
                pass

    thread = threading.Thread(target=reader)
    thread.start()
    writers = [threading.Thread(target=area.write, args=("incoming/x.arrow", p)) for p in payloads]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    stop.set()
    thread.join()
    assert area.read("incoming/x.arrow") in payloads
    assert all(data in payloads for data in seen), "a reader saw a file that no writer wrote whole"


def test_a_store_whose_files_table_is_from_a_newer_version_is_refused_in_one_line(pg_url):
    from eventing.storage.postgres import file_area
    from metadata.postgres import PostgresDatabase

    db = PostgresDatabase.open(pg_url)
    file_area.PostgresArea(db, "windows/fn")
    db.run(lambda conn: conn.execute("UPDATE eventing_schema SET version = 99 WHERE component = 'files'"))
    file_area._ready.clear()  # as a new process would
    with pytest.raises(StoreError) as caught:
        file_area.PostgresArea(db, "windows/fn")
    assert "newer version of eventing (files schema 99" in str(caught.value) and "\n" not in str(caught.value)


# -- the PostgreSQL window sink ------------------------------------------------------------------------------


def results(rows: list[tuple[int, str | None, int, float | None]]) -> pa.Table:
    from eventing.windows.batches import result_schema

    schema = result_schema(["country"], [("count", None, "count"), ("sum", "amount", "sum_amount")])
    return pa.Table.from_pylist(
        [
            {"window_start_ms": s, "window_end_ms": s + 60, "country": c, "count": n, "sum_amount": v}
            for s, c, n, v in rows
        ],
        schema=schema,
    )


def test_the_postgresql_sink_writes_each_window_once_and_reads_back_as_the_sqlite_sink(pg_url, tmp_path):
    from eventing.windows.spark.postgres_sink import PostgresWindowSink
    from eventing.windows.spark.sink import SqliteWindowSink

    table = results(
        [(0, "KR", 2, 3.5), (0, None, 1, None), (60, "US", 1, float("inf")), (120, "KR", 4, -1.0)]
    )
    sink = PostgresWindowSink.open(pg_url)
    assert sink.write("fn", table.slice(0, 2)) == 1
    assert sink.write("fn", table, windows=[(180, 240)]) == 3  # [0, 60) was written already
    tampered = table.set_column(3, "count", pa.array([9, 9, 9, 9], pa.int64()))
    again = PostgresWindowSink.open(pg_url)  # a restarted service replays everything
    assert again.write("fn", tampered, windows=[(180, 240)]) == 0
    assert again.written_windows("fn") == {(0, 60), (60, 120), (120, 180), (180, 240)}
    assert again.written_windows("fn_other") == set() and again.read("fn_other").num_rows == 0
    sqlite = SqliteWindowSink(tmp_path / "r.sqlite3")
    sqlite.write("fn", table, windows=[(180, 240)])
    assert again.read("fn").equals(sqlite.read("fn")) and again.read("fn").equals(table)


def test_the_postgresql_sink_keeps_a_write_whole_or_not_at_all(pg_url, monkeypatch):
    import json
    from types import SimpleNamespace

    from eventing.windows.spark import postgres_sink

    sink = postgres_sink.PostgresWindowSink.open(pg_url)
    sink.write("fn", results([(0, "KR", 1, 1.0)]))
    rows: list[Any] = []

    def dumps(value: Any) -> str:  # the second result row fails, after the windows' records were inserted
        rows.append(value)
        if len(rows) == 2:
            raise RuntimeError("power cut")
        return json.dumps(value)

    monkeypatch.setattr(postgres_sink, "json", SimpleNamespace(dumps=dumps))
    later = results([(60, "KR", 1, 1.0), (120, "US", 1, 1.0)])
    with pytest.raises(RuntimeError, match="power cut"):
        sink.write("fn", later)
    assert sink.written_windows("fn") == {(0, 60)} and sink.read("fn").num_rows == 1
    monkeypatch.undo()
    assert sink.write("fn", later) == 2 and sink.read("fn").num_rows == 3
    other = pa.table({"window_start_ms": [180], "window_end_ms": [240], "n": [1.0]})
    with pytest.raises(ValueError, match="already has window results") as caught:
        sink.write("fn", other)
    assert "\n" not in str(caught.value) and sink.written_windows("fn") == {(0, 60), (60, 120), (120, 180)}


def test_concurrent_sinks_write_a_window_once(pg_url):
    from eventing.windows.spark.postgres_sink import PostgresWindowSink

    table = results([(s, c, 1, 1.0) for s in range(0, 600, 60) for c in ("KR", "US")])
    counts: list[int] = []
    threads = [
        threading.Thread(target=lambda: counts.append(PostgresWindowSink.open(pg_url).write("fn_c", table)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(counts) == [0, 0, 0, 10]
    assert PostgresWindowSink.open(pg_url).read("fn_c").num_rows == 20


def test_the_postgresql_sink_gives_a_long_function_name_a_table_of_its_own(pg_url):
    from eventing.windows.spark.postgres_sink import PostgresWindowSink, results_table

    long_a, long_b = "f" * 90 + "_a", "f" * 90 + "_b"
    assert results_table("fn_sales") == "window_results_fn_sales"
    assert results_table(long_a) != results_table(long_b) and len(results_table(long_a)) <= 63
    sink = PostgresWindowSink.open(pg_url)
    sink.write(long_a, results([(0, "KR", 1, 1.0)]))
    sink.write(long_b, results([(0, "KR", 2, 2.0)]))
    assert sink.read(long_a).column("count").to_pylist() == [1]
    assert sink.read(long_b).column("count").to_pylist() == [2]


def test_a_sink_with_a_path_stays_the_users_local_output_when_the_files_are_on_postgresql(
    pg_url, data_dir, tmp_path, monkeypatch
):
    from eventing.storage.postgres.file_area import PostgresArea
    from eventing.windows.runtime.emission import make_sink
    from eventing.windows.runtime.row_writer import RowLayout
    from eventing.windows.spark.postgres_sink import PostgresWindowSink
    from eventing.windows.spark.sink import ParquetWindowSink, SqliteWindowSink

    monkeypatch.setattr(DirectoryState, "file_area", lambda self, root: PostgresArea.open(pg_url, root))
    window = {"kind": "tumbling", "size": "1m", "time_field": "ts", "aggregates": ["count"]}
    assert isinstance(make_sink(data_dir, "fn", RowLayout.for_definition("fn", window)), PostgresWindowSink)
    given = {**window, "sink": {"kind": "sqlite", "path": str(tmp_path / "out.sqlite3")}}
    sink = make_sink(data_dir, "fn", RowLayout.for_definition("fn", given))
    assert isinstance(sink, SqliteWindowSink) and sink.path == tmp_path / "out.sqlite3"

    class ServerState(DirectoryState):  # a state with no directory anywhere
        @property
        def directory(self) -> None:  # type: ignore[override]
            return None

    monkeypatch.chdir(tmp_path)
    relative = {**window, "sink": {"kind": "parquet", "path": "results"}}
    sink = make_sink(ServerState(data_dir), "fn", RowLayout.for_definition("fn", relative))
    assert isinstance(sink, ParquetWindowSink) and sink.directory == Path("results")
    sink.write("fn", pa.table({"window_start_ms": [0], "window_end_ms": [60], "n": [1]}))
    assert (tmp_path / "results" / "fn" / "window_0_60.parquet").exists()
