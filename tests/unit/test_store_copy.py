"""`eventing store copy`: a data directory to PostgreSQL and back holds every bucket row, every metadata
record, the windows' files and the logs as they were, and a function carries on after its checkpoints in
the copy, applying nothing twice."""

from __future__ import annotations

import pytest

from eventing.cli.app import main
from eventing.core import xattrs as X
from eventing.core.definition import FunctionDefinition
from eventing.core.mutation import OP_UPDATE, encode_document
from eventing.errors import ConfigError, LifecycleError
from eventing.ops.store_copy import copy_store
from eventing.storage.dumps import TABLES
from eventing.storage.state import open_state
from eventing.storage.values import Write
from eventing.testing import deploy_function, ledger_definition, load_source
from metadata.sql.dump import dump_tables
from sharding import vbucket_of

HANDLER = "def on_update(doc, meta):\n    dst[meta.id] = {'n': doc.get('n')}\n    log('seen', meta.id)\n"


def bucket_rows(state, name: str) -> dict[str, list[tuple]]:
    with state.open_bucket(name) as bucket:
        meta = bucket.dump_meta()
        rows = {table: sorted(r for batch in bucket.dump_rows(table) for r in batch) for table in TABLES}
    return {"meta": [(meta.uuid, meta.partitions, meta.collections)], **rows}


def metadata_rows(state) -> dict[str, list[tuple]]:
    store = state.metadata
    out: dict[str, list[tuple]] = {}
    for table, rows in dump_tables(getattr(store, "_store", lambda: store)()):
        out.setdefault(table, []).extend(rows)
    return {t: sorted(map(repr, rows)) for t, rows in out.items()}


def prepared(data_dir: str) -> None:
    """A source with a handled function, a partitioned binding bucket, a collection and a log."""
    load_source(data_dir, 80, 600, seed=3)
    state = open_state(data_dir)
    state.create_bucket("out", partitions=4).close()
    with state.open_bucket("src") as src:
        src.create_collection("s", "c")
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_copy",
            "source_bucket": "src",
            "bindings": [{"alias": "dst", "bucket": "out", "access": "rw"}],
        }
    )
    deploy_function(data_dir, defn, HANDLER)
    assert main(["--data-dir", data_dir, "run", "--until-caught-up", "--executor", "in-process"]) == 0
    state.close()


def test_a_directory_copied_to_postgresql_and_back_is_row_for_row_the_same(data_dir, tmp_path, pg_schema_url):
    prepared(data_dir)
    source, server, back = open_state(data_dir), open_state(pg_schema_url), open_state(str(tmp_path / "back"))
    copied = copy_store(source, server)
    assert set(copied["buckets"]) == {"out", "src"} and copied["functions"] == 1
    copy_store(server, back)
    for state in (server, back):
        assert state.bucket_names() == ["out", "src"]
        for name in ("src", "out"):
            assert bucket_rows(state, name) == bucket_rows(source, name), name
        assert metadata_rows(state) == metadata_rows(source)
        assert state.app_logs.tail("fn_copy", 1000) == source.app_logs.tail("fn_copy", 1000)
    assert len(source.app_logs.tail("fn_copy", 1000)) > 0


def _xattrs_of(state, bucket_name: str, key: str) -> tuple[bytes | None, list[bytes | None]]:
    """A document's stored XATTRs and those of each of its log entries."""
    with state.open_bucket(bucket_name) as bucket:
        live = (bucket.get_meta(key) or {}).get("xattrs")
        entries = [m.xattrs for m in bucket.read_vb(vbucket_of(key), 0, 10_000) if m.key == key]
    return live, entries


def test_extended_attributes_are_copied_to_postgresql_and_back(data_dir, tmp_path, pg_schema_url):
    prepared(data_dir)
    source = open_state(data_dir)
    tagged, other = X.encode({"audit": {"by": "ada"}, "_sync": {"rev": 3}}), X.encode({"audit": 1})
    for name in ("src", "out"):  # a bucket of one file and one of four partitions
        with source.open_bucket(name) as bucket:
            bucket.write([Write("x1", OP_UPDATE, encode_document({"n": 1}), xattrs=other)])
            bucket.write([Write("x1", OP_UPDATE, encode_document({"n": 2}), xattrs=tagged)])
    expected = (tagged, [other, tagged])
    server, back = open_state(pg_schema_url), open_state(str(tmp_path / "back"))
    copy_store(source, server)
    copy_store(server, back)
    for state in (source, server, back):
        for name in ("src", "out"):
            assert _xattrs_of(state, name, "x1") == expected, (state.shown, name)


def test_a_function_carries_on_in_the_copy_after_its_checkpoints(data_dir, pg_schema_url, capsys):
    prepared(data_dir)
    assert main(["store", "copy", "--from", data_dir, "--to", pg_schema_url]) == 0
    said = capsys.readouterr().out
    assert "run on it with `eventing --store 'postgresql://" in said  # quoted: a URL's ? and & are a shell's
    load_source(pg_schema_url, 80, 200, seed=4)
    assert main(["--store", pg_schema_url, "run", "--until-caught-up", "--executor", "in-process"]) == 0
    capsys.readouterr()
    assert main(["--store", pg_schema_url, "stats", "fn_copy", "--json"]) == 0
    import json

    stats = json.loads(capsys.readouterr().out)
    # 600 handled before the copy, 200 after it: each once, none applied twice
    assert stats["mutations_seen"] == 800 and stats["effects_duplicate"] == 0 and stats["checkpoint_lag"] == 0


def test_a_ledger_function_verifies_after_a_copy(data_dir, pg_schema_url):
    from eventing.ops.verify import verify_function

    load_source(data_dir, 60, 400, seed=9)
    deploy_function(data_dir, ledger_definition("fn_ledger", "src", "ledger"))
    assert main(["--data-dir", data_dir, "run", "--until-caught-up", "--executor", "in-process"]) == 0
    copy_store(data_dir, pg_schema_url)
    load_source(pg_schema_url, 60, 300, seed=10)
    assert main(["--store", pg_schema_url, "run", "--until-caught-up", "--executor", "in-process"]) == 0
    report = verify_function(pg_schema_url, "fn_ledger")
    assert report.ok, report.summary()


def test_a_copy_is_refused_into_a_store_that_holds_buckets_or_onto_itself(data_dir, tmp_path):
    prepared(data_dir)
    other = str(tmp_path / "other")
    open_state(other).create_bucket("x").close()
    with pytest.raises(ConfigError, match="already holds buckets"):
        copy_store(data_dir, other)
    with pytest.raises(ConfigError, match="both"):
        copy_store(data_dir, data_dir)


def test_a_copy_is_refused_while_a_service_runs_on_the_source(data_dir, tmp_path):
    prepared(data_dir)
    open_state(data_dir).metadata.heartbeat("host:1:abc", "{}")
    with pytest.raises(LifecycleError, match="stop it"):
        copy_store(data_dir, str(tmp_path / "copy"))
