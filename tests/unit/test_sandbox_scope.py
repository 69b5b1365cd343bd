"""The sandbox's scoped data service by collection: a function bound to one collection of a bucket reads
and writes only that collection's documents, and reads its source's log with the rows of the source
bucket's other collections stripped of key, document and origin (no Landlock needed: the service is a
plain class answering calls)."""

from __future__ import annotations

import msgpack
import pytest

from eventing.core.definition import FunctionDefinition
from eventing.core.keyspaces import key_prefix, split_stored_key
from eventing.core.mutation import OP_UPDATE, encode_document
from eventing.errors import ConfigError
from eventing.storage.factory import create_bucket
from eventing.storage.protocol import Bucket
from eventing.storage.remote import BUCKET_CALLS, META_CALLS, DataService
from eventing.storage.rows_ahead import rows_of_columns
from eventing.storage.values import EffectGroup, Write
from eventing.workers.sandbox import scope as sandbox_scope
from eventing.workers.sandbox.scope import ScopedService
from sharding import vbucket_of


@pytest.fixture
def scoped(tmp_path):
    data_dir = str(tmp_path)
    source = create_bucket(data_dir, "src")
    mine, theirs = source.create_collection("s", "mine"), source.create_collection("s", "theirs")
    source.write(
        [
            Write(key_prefix(cid) + f"k{i}", OP_UPDATE, encode_document({"c": cid, "i": i}))
            for i in range(40)
            for cid in (0, mine, theirs)
        ]
    )
    out = create_bucket(data_dir, "out")
    a, b = out.create_collection("t", "a"), out.create_collection("t", "b")
    out.write([Write(key_prefix(cid) + "doc", OP_UPDATE, encode_document({"c": cid})) for cid in (0, a, b)])
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn",
            "source_bucket": "src",
            "source_scope": "s",
            "source_collection": "mine",
            "bindings": [{"alias": "o", "bucket": "out", "scope": "t", "collection": "a", "access": "rw"}],
        }
    )
    service = ScopedService("fn", defn, DataService(data_dir))
    yield service, {"mine": mine, "theirs": theirs, "a": a, "b": b}
    service.backend.close()


def _bucket(service, name, call, *args, **kwargs):
    return service.call("bucket", name, call, args, kwargs)


def test_documents_are_read_only_in_the_bound_collections(scoped):
    service, ids = scoped
    assert _bucket(service, "out", "get_raw", key_prefix(ids["a"]) + "doc") is not None
    assert _bucket(service, "src", "get_raw", key_prefix(ids["mine"]) + "k1") is not None
    for bucket, key in (
        ("out", key_prefix(ids["b"]) + "doc"),
        ("out", "doc"),
        ("src", key_prefix(ids["theirs"]) + "k1"),
        ("src", "k1"),
    ):
        for call in ("get_raw", "get", "get_meta", "get_doc"):
            with pytest.raises(ConfigError, match="runs sandboxed"):
                _bucket(service, bucket, call, key)
    with pytest.raises(ConfigError):
        _bucket(service, "src", "previous_doc", key_prefix(ids["theirs"]) + "k1", 10**9)
    with pytest.raises(ConfigError):
        _bucket(service, "out", "keys", "")  # the default collection is not the function's
    assert _bucket(service, "out", "keys", key_prefix(ids["a"])) == [key_prefix(ids["a"]) + "doc"]
    with pytest.raises(ConfigError):
        _bucket(service, "out", "count", key_prefix(ids["b"]))


def test_effects_only_in_the_read_write_collection(scoped):
    service, ids = scoped

    def effects(key):
        group = EffectGroup(0, 0, [(1, Write(key, OP_UPDATE, encode_document({"x": 1})))])
        return _bucket(service, "out", "apply_effects", "fn", [group], origin="fn")

    assert effects(key_prefix(ids["a"]) + "new").applied == 1
    for key in (key_prefix(ids["b"]) + "new", "new", "\x01" + "no-collection-id"):
        with pytest.raises(ConfigError, match="runs sandboxed"):
            effects(key)
    # Judged a collection at a time: a refused write late in a batch of allowed ones refuses the batch.
    writes = [
        (s, Write(key_prefix(ids["a"]) + f"n{s}", OP_UPDATE, encode_document({"s": s}))) for s in (2, 3)
    ]
    late = [(4, Write(key_prefix(ids["b"]) + "n4", OP_UPDATE, encode_document({"s": 4})))]
    with pytest.raises(ConfigError, match="runs sandboxed"):
        _bucket(service, "out", "apply_effects", "fn", [EffectGroup(0, 0, writes + late)], origin="fn")
    assert _bucket(service, "out", "get_raw", key_prefix(ids["a"]) + "n2") is None  # nothing applied


def test_log_rows_of_other_collections_carry_nothing(scoped):
    service, ids = scoped
    vb = vbucket_of("k1")
    rows = msgpack.unpackb(service.call("read_vb", "src", vb, 0, 1000), raw=False)
    assert rows and [r[1] for r in rows] == sorted(r[1] for r in rows)
    seen = {split_stored_key(r[2])[0] for r in rows}
    assert seen == {0, ids["mine"], ids["theirs"]}  # every seqno is there, so the reader moves past them
    for row in rows:
        cid, user_key = split_stored_key(row[2])
        if cid == ids["mine"]:
            assert row[5] is not None and user_key
        else:
            assert user_key == "" and row[5] is None and row[6] is None
    blob, highs = service.call("read_many", "src", [(vb, 0, 1000)])
    (answer,) = msgpack.unpackb(blob, raw=False)
    many = answer[1] if answer[0] == 0 else rows_of_columns(vb, 0, tuple(answer[1:]))
    assert [tuple(r) for r in many] == [tuple(r) for r in rows]
    blob, changed_highs, runs = service.call("read_changed", "src", [(vb, 0)], 1000)
    assert runs == [(vb, 0, highs[vb])] and changed_highs[vb] == highs[vb]
    (answer,) = msgpack.unpackb(blob, raw=False)
    changed = answer[1] if answer[0] == 0 else rows_of_columns(vb, 0, tuple(answer[1:]))
    assert [tuple(r) for r in changed] == [tuple(r) for r in rows]  # scoped as read_many's
    assert _bucket(service, "src", "read_vb_packed", vb, 0, 1000, "fn") is None  # read again as rows


def test_a_default_source_reads_its_log_whole(tmp_path):
    data_dir = str(tmp_path)
    source = create_bucket(data_dir, "src")
    source.write([Write(f"k{i}", OP_UPDATE, encode_document({"i": i})) for i in range(20)])
    defn = FunctionDefinition.from_dict({"name": "fn", "source_bucket": "src", "bindings": []})
    service = ScopedService("fn", defn, DataService(data_dir))
    try:
        vb = vbucket_of("k1")
        plain = DataService(data_dir)
        assert service.call("read_many", "src", [(vb, 0, 100)]) == plain.call(
            "read_many", "src", [(vb, 0, 100)]
        )
        assert service.call("read_vb", "src", vb, 0, 100) == plain.call("read_vb", "src", vb, 0, 100)
        plain.close()
    finally:
        service.backend.close()


def test_the_scoped_calls_are_calls_the_data_service_serves_and_no_write_of_a_bucket(scoped):
    service, _ = scoped
    served_bucket = set(BUCKET_CALLS)
    assert sandbox_scope.READ_CALLS | sandbox_scope.EFFECT_CALLS <= served_bucket
    assert sandbox_scope.KEY_CALLS | sandbox_scope.LIST_CALLS <= sandbox_scope.READ_CALLS
    assert sandbox_scope.META_CALLS == set(META_CALLS)
    assert served_bucket - {"collection_list", "mirror_list", "partition_marks"} <= {
        name for klass in Bucket.__mro__ for name in vars(klass)
    }
    for call in (
        "write",
        "upsert",
        "delete",
        "flush",
    ):  # served to a worker of the cluster, never to a sandbox
        assert call in served_bucket
        with pytest.raises(ConfigError, match="runs sandboxed and may not call bucket"):
            _bucket(service, "out", call, [])
    with pytest.raises(ConfigError, match="runs sandboxed and may not call close"):
        service.call("close")
    assert set(service.calls) == {
        "ping",
        "bucket_info",
        "read_vb",
        "read_many",
        "read_changed",
        "bucket",
        "meta",
        "app_log",
        "put_file",
        "curl",
    }


def test_the_host_makes_requests_only_of_the_functions_bindings_with_credentials_or_limits(tmp_path):
    create_bucket(str(tmp_path), "src")
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn",
            "source_bucket": "src",
            "url_bindings": [
                {"alias": "secret", "url": "http://127.0.0.1:9", "auth": "bearer", "token": "t"},
                {"alias": "limited", "url": "http://127.0.0.1:9", "rate_limit": {"per_second": 5}},
                {"alias": "few", "url": "http://127.0.0.1:9", "max_in_flight": 2},
                {"alias": "open", "url": "http://127.0.0.1:9"},
            ],
        }
    )
    service = ScopedService("fn", defn, DataService(str(tmp_path)))
    try:
        request = ("POST", "http://127.0.0.1:9/x", b"{}", {}, 1.0)
        for alias in ("secret", "limited", "few"):
            service.check("curl", (alias, *request))  # the child asks the host for these
        for alias in ("open", "other"):  # the child makes these itself, or they are not the function's
            with pytest.raises(ConfigError, match="runs sandboxed and may not call curl"):
                service.check("curl", (alias, *request))
    finally:
        service.backend.close()


WINDOW = {"kind": "tumbling", "size": "1m", "time_field": "ts", "group_by": ["c"], "aggregates": ["count"]}
ROW_BATCH = "windows/fn/incoming/g1-fn_w0-18a2b3c4d5e-000000003.arrow"


@pytest.mark.parametrize(
    "windowed,path,size,allowed",
    [
        (True, ROW_BATCH, 10, True),
        (False, ROW_BATCH, 10, False),  # a function without a window writes no rows
        (True, "windows/fn/incoming/big0", 10, False),  # not a row batch's name
        (True, "windows/fn/incoming/sub/" + ROW_BATCH.rsplit("/", 1)[1], 10, False),
        (True, ROW_BATCH.replace("/fn/", "/other/"), 10, False),  # another function's area
        (True, ROW_BATCH, sandbox_scope.ROW_BATCH_MAX + 1, False),  # larger than any checkpoint's rows
    ],
)
def test_a_sandbox_hands_over_only_its_own_window_row_batches(tmp_path, windowed, path, size, allowed):
    create_bucket(str(tmp_path), "src")
    defn = FunctionDefinition.from_dict(
        {"name": "fn", "source_bucket": "src", **({"window": WINDOW} if windowed else {})}
    )
    service = ScopedService("fn", defn, DataService(str(tmp_path)))
    try:
        if allowed:
            service.check("put_file", (path, bytes(size)))
        else:
            with pytest.raises(ConfigError, match="runs sandboxed and may not call put_file"):
                service.check("put_file", (path, bytes(size)))
    finally:
        service.backend.close()
