"""Scopes and collections: keyspace names, a collection's documents kept apart from the others of its
bucket while sharing its vBuckets and seqno order, and the check-and-set primitive the Data API uses."""

from __future__ import annotations

import pytest

from eventing.core.keyspaces import Keyspace, split_stored_key, stored_key, vbucket_of_stored
from eventing.core.mutation import OP_UPDATE, encode_document
from eventing.errors import ConfigError, InvalidKeyError, NotFoundError
from eventing.storage.factory import create_bucket
from eventing.storage.keyspace import create_collection, drop_collection, list_collections, open_keyspace
from eventing.storage.values import Write
from sharding import vbucket_of


@pytest.mark.parametrize(
    "text, expected",
    [
        ("shop", Keyspace("shop")),
        ("shop.sales.orders", Keyspace("shop", "sales", "orders")),
        ("`my.shop`.sales.orders", Keyspace("my.shop", "sales", "orders")),
        ("`my.shop`", Keyspace("my.shop")),
        ("a.b", Keyspace("a.b")),
    ],
)
def test_keyspace_names_parse_as_couchbase_writes_them(text, expected):
    assert Keyspace.parse(text) == expected


def test_a_bucket_named_with_dots_stays_a_bucket_and_bad_names_are_named():
    assert Keyspace.parse("x.y.z", known_buckets={"x.y.z"}) == Keyspace("x.y.z")
    with pytest.raises(ConfigError, match="collection name '_hidden' of keyspace 'b.s._hidden' is not valid"):
        Keyspace("b", "s", "_hidden").check()
    assert Keyspace("b", "s", "*").check(wildcard=True).is_wildcard


def test_a_collection_key_is_in_the_vbucket_of_its_own_key():
    for key in ("customer::1", "k", "ü-2"):
        stored = stored_key(9, key)
        assert split_stored_key(stored) == (9, key)
        assert vbucket_of_stored(stored) == vbucket_of(key) == vbucket_of_stored(key)


@pytest.mark.parametrize("partitions", [1, 4])
def test_collections_keep_their_documents_apart_and_share_the_seqno_order(data_dir, partitions):
    create_bucket(data_dir, "shop", partitions=partitions).close()
    assert create_collection(data_dir, "shop.sales.orders") == 8
    assert create_collection(data_dir, "shop.hr.staff") == 9
    with pytest.raises(ConfigError, match="exists already"):
        create_collection(data_dir, "shop.sales.orders")
    with open_keyspace(data_dir, "shop.sales.orders") as orders, open_keyspace(data_dir, "shop") as default:
        vb, first = orders.upsert("k1", {"n": 1})
        assert vb == vbucket_of("k1")
        assert default.upsert("k1", {"n": 2}) == (vb, first + 1)  # one seqno order per vBucket
        orders.upsert("k2", {"n": 3})
        assert orders.get("k1") == {"n": 1} and default.get("k1") == {"n": 2}
        assert orders.keys() == ["k1", "k2"] and default.keys() == ["k1"]
        assert [k for k, _, _ in default.scan()] == ["k1"]
        assert orders.count() == 2 and default.count() == 1
        with pytest.raises(InvalidKeyError, match="reserved"):
            orders.upsert("\x01x", {})
    names = [str(ks) for ks, _ in list_collections(open_keyspace(data_dir, "shop").bucket)]
    assert names == ["shop", "shop.hr.staff", "shop.sales.orders"]
    assert drop_collection(data_dir, "shop.sales.orders") == 2
    with pytest.raises(NotFoundError, match="create it with `eventing collection create shop.sales.orders`"):
        open_keyspace(data_dir, "shop.sales.orders")
    with open_keyspace(data_dir, "shop") as default:
        assert default.keys() == ["k1"]


def test_change_document_checks_and_writes_in_one_transaction(data_dir):
    create_bucket(data_dir, "b").close()
    create_collection(data_dir, "b.s.c")
    with open_keyspace(data_dir, "b.s.c") as coll:

        def insert(current):
            if current is not None:
                raise ConfigError("exists")
            return Write(coll.stored("doc"), OP_UPDATE, encode_document({"v": 1}), 0, 7)

        made = coll.change("doc", insert)
        assert made is not None and made.flags == 7 and made.cas == coll.get_doc("doc")[1]
        with pytest.raises(ConfigError, match="exists"):
            coll.change("doc", insert)
        assert coll.change("doc", lambda current: None) == made  # nothing to write: the version as it is


@pytest.mark.parametrize("partitions", [1, 4])
def test_change_documents_commits_a_group_each_change_seeing_the_ones_before(data_dir, partitions):
    from eventing.core.mutation import OP_DELETE
    from eventing.storage.values import Changed

    create_bucket(data_dir, "b", partitions=partitions).close()
    with open_keyspace(data_dir, "b") as coll:
        bucket = coll.bucket

        def insert(key, value):
            def change(current):
                if current is not None:
                    raise ConfigError(f"{key} exists")
                return Write(key, OP_UPDATE, encode_document({"v": value}), 0, value)

            return key, change

        def remove(key):
            return key, lambda current: None if current is None else Write(key, OP_DELETE)

        commits = sum(part.file.commits for part in getattr(bucket, "parts", [bucket]))
        out = bucket.change_documents(
            [insert("a", 1), insert("a", 2), insert("k1", 3), remove("a"), remove("nope")]
        )
        # one transaction in each file the keys live in (one file when unpartitioned)
        files = {id(bucket._part_of_key(k)) for k in ("a", "k1", "nope")} if partitions > 1 else {0}
        assert sum(part.file.commits for part in getattr(bucket, "parts", [bucket])) == commits + len(files)
        first, second, third, deleted, nothing = out
        assert isinstance(first, Changed) and first.after is not None and first.after.flags == 1
        assert isinstance(second, ConfigError) and "a exists" in str(second)  # saw the first insert
        assert (
            isinstance(third, Changed) and coll.get("k1") == {"v": 3} and third.cas == coll.get_doc("k1")[1]
        )
        assert isinstance(deleted, Changed) and deleted.after is None and deleted.cas > first.cas
        assert deleted.seqno > first.seqno and deleted.vb == first.vb  # the delete is a write of its own
        assert nothing == Changed(None) and coll.get("a") is None


KEYSPACE_HANDLER = """
def on_update(doc, meta):
    ks = meta.keyspace
    out[meta.id] = {"from": ks["scope_name"] + "." + ks["collection_name"], "n": doc["n"]}

def on_delete(meta, options):
    del out[meta.id]
"""


def _deploy(data_dir: str, name: str, **source) -> None:
    from eventing.core.definition import FunctionDefinition
    from eventing.testing import deploy_function

    defn = FunctionDefinition.from_dict(
        {
            "name": name,
            "source_bucket": "shop",
            **source,
            "worker_count": 2,
            "bindings": [
                {"alias": "out", "bucket": "results", "scope": "fn", "collection": name, "access": "rw"}
            ],
        }
    )
    deploy_function(data_dir, defn, KEYSPACE_HANDLER)


def test_a_function_handles_only_its_source_collection_and_writes_to_its_bound_collection(data_dir):
    from eventing.api import Eventing

    create_bucket(data_dir, "shop").close()
    create_bucket(data_dir, "results").close()
    for ks in (
        "shop.sales.orders",
        "shop.sales.returns",
        "shop.hr.staff",
        "results.fn.orders_fn",
        "results.fn.default_fn",
        "results.fn.sales_fn",
    ):
        create_collection(data_dir, ks)
    _deploy(data_dir, "orders_fn", source_scope="sales", source_collection="orders")
    _deploy(data_dir, "default_fn")
    _deploy(data_dir, "sales_fn", source_scope="sales", source_collection="*")
    for ks, n in (("shop.sales.orders", 3), ("shop", 2), ("shop.sales.returns", 2), ("shop.hr.staff", 4)):
        with open_keyspace(data_dir, ks) as coll:
            for i in range(n):
                coll.upsert(f"k{i}", {"n": i})  # the same keys in every collection: kept apart
    with open_keyspace(data_dir, "shop.sales.orders") as orders:
        orders.delete("k2")
    Eventing(data_dir, executor="in-process").run(until_caught_up=True)

    def seen(fn: str) -> dict:
        with open_keyspace(data_dir, f"results.fn.{fn}") as coll:
            return {key: (doc["from"], doc["n"]) for key, doc, _ in coll.scan()}

    assert seen("orders_fn") == {"k0": ("sales.orders", 0), "k1": ("sales.orders", 1)}
    assert seen("default_fn") == {"k0": ("_default._default", 0), "k1": ("_default._default", 1)}
    # `*`: every collection of the scope; a key of two collections is one result key, last writer wins in
    # its vBucket's seqno order: returns wrote k0/k1 after orders did.
    assert seen("sales_fn") == {"k0": ("sales.returns", 0), "k1": ("sales.returns", 1)}
    with open_keyspace(data_dir, "results") as default:
        assert default.count() == 0  # nothing leaked into the bound bucket's default collection


def test_a_definition_naming_a_missing_collection_is_refused_with_the_fix(data_dir):
    create_bucket(data_dir, "shop").close()
    create_bucket(data_dir, "results").close()
    with pytest.raises(NotFoundError, match="eventing collection create shop.sales.orders"):
        _deploy(data_dir, "orders_fn", source_scope="sales", source_collection="orders")
