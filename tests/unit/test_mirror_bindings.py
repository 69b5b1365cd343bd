"""A collection that mirrors a table (eventing.storage.mirror) is written by its mirror alone: a function
whose binding is read-write on one is refused at save, deploy and resume with one line naming the binding, the
collection and the fix; a handler write into one that reaches it anyway (a binding over several collections,
`scope.*`, and a mirror made after the deploy) is dead-lettered, never applied. No PostgreSQL here: the
collections are registered as mirrors the way `collection create --mirror` registers them."""

from __future__ import annotations

import pytest

from eventing.api import Eventing
from eventing.control import lifecycle
from eventing.errors import ConfigError
from eventing.storage.state import open_state
from metadata.factory import open_store

SHOWN = "table public.orders of postgresql://app@127.0.0.1/app"

COPY = """
def on_update(doc, meta):
    copies[meta.id] = {"n": doc["n"]}
"""

INTO_SAME_COLLECTION = """
def on_update(doc, meta):
    ks = meta.keyspace
    into = copies.in_keyspace({"bucket_name": "copies", "scope_name": ks["scope_name"],
                               "collection_name": ks["collection_name"]})
    into[meta.id] = {"n": doc["n"]}
"""


def _mirror(data_dir: str, bucket: str, scope: str, collection: str) -> int:
    state = open_state(data_dir)
    try:
        with state.open_bucket(bucket) as opened:
            return opened.create_collection(scope, collection, mirror=SHOWN)
    finally:
        state.close()


def _definition(name: str, source: str, binding: dict) -> dict:
    bucket, scope, collection = source.split(".")
    return {
        "name": name,
        "source_bucket": bucket,
        "source_scope": scope,
        "source_collection": collection,
        "language": "python",
        "bindings": [{"alias": "copies", "bucket": "copies", **binding}],
    }


def test_a_read_write_binding_of_a_mirror_is_refused_at_save_and_deploy(data_dir):
    app = Eventing(data_dir, executor="in-process")
    app.create_bucket("shop")
    app.create_bucket("copies")
    app.create_collection("shop.sales.orders")
    _mirror(data_dir, "copies", "pg", "orders")
    rw = _definition("fn_rw", "shop.sales.orders", {"scope": "pg", "collection": "orders", "access": "rw"})
    with pytest.raises(ConfigError) as caught:
        app.save(rw, COPY)
    message = str(caught.value)
    assert "binding 'copies' of function 'fn_rw'" in message and "'copies.pg.orders'" in message
    assert "mirrors table public.orders" in message and "bind it read-only (access 'r')" in message
    assert "\n" not in message
    with open_store(data_dir) as store:  # nothing saved
        assert [f.name for f in store.list_functions()] == []
    # Read-only, it saves, deploys and reads the mirror's documents.
    ro = _definition("fn_ro", "shop.sales.orders", {"scope": "pg", "collection": "orders", "access": "r"})
    app.deploy(ro, "def on_update(doc, meta):\n    assert copies.get(meta.id) is None\n")
    # A definition saved while its collection was a plain one, which is then made a mirror under the same
    # name: refused at deploy.
    app.create_collection("copies.pg.plain")
    later = _definition(
        "fn_later", "shop.sales.orders", {"scope": "pg", "collection": "plain", "access": "rw"}
    )
    app.save(later, COPY)
    app.drop_collection("copies.pg.plain")
    _mirror(data_dir, "copies", "pg", "plain")
    with pytest.raises(
        ConfigError, match="binding 'copies' of function 'fn_later' is read-write on 'copies.pg.plain'"
    ):
        lifecycle.deploy(app.state, "fn_later")
    with open_store(data_dir) as store:
        assert store.get_function("fn_later").state.value == "undeployed"
        assert store.get_function("fn_ro").state.value == "deployed"


JS_INTO_SAME_COLLECTION = """
function OnUpdate(doc, meta) {
    var ks = meta.keyspace;
    var into = {bucket_name: 'copies', scope_name: ks.scope_name, collection_name: ks.collection_name};
    couchbase.upsert(copies, {id: meta.id, keyspace: into}, {n: doc.n});
}
"""


@pytest.mark.parametrize("language", ["python", "javascript"])
def test_a_handler_write_into_a_mirror_is_dead_lettered_and_never_applied(data_dir, language):
    if language == "javascript":
        pytest.importorskip("STPyV8")
    app = Eventing(data_dir, executor="in-process")
    app.create_bucket("shop")
    app.create_bucket("copies")
    for keyspace in ("shop.pg.orders", "shop.pg.plain", "copies.pg.plain"):
        app.create_collection(keyspace)
    # A binding over the scope `copies.pg.*`, deployed before the scope holds a mirror.
    definition = _definition("fn_all", "shop.pg.*", {"scope": "pg", "collection": "*", "access": "rw"})
    definition["language"] = language
    app.deploy(definition, JS_INTO_SAME_COLLECTION if language == "javascript" else INTO_SAME_COLLECTION)
    _mirror(data_dir, "copies", "pg", "orders")
    app.upsert("shop.pg.orders", "o1", {"n": 1})
    app.upsert("shop.pg.plain", "p1", {"n": 2})
    app.run(until_caught_up=True)
    assert app.get("copies.pg.plain", "p1") == {"n": 2}  # its other collections take its writes
    assert app.keys("copies.pg.orders") == []  # the mirror's: never applied
    with open_store(data_dir) as store:
        letters = store.find_dlq_rows("fn_all")
    assert [(row.key, row.reason) for row in letters] == [("o1", "error")]
    assert "through binding 'copies'" in letters[0].error
    assert (
        "mirrors table public.orders" in letters[0].error
        and "bind it read-only (access 'r')" in letters[0].error
    )


def test_a_runner_over_the_data_service_refuses_writes_through_a_binding_of_a_mirror(data_dir):
    """A worker behind the data service (another machine, a sandboxed child) learns which collections are
    mirrors through it; a definition stored without the checks (an older version saved it) still writes
    nothing into the mirror."""
    from eventing.core.definition import FunctionDefinition
    from eventing.errors import BindingError
    from eventing.execution.runner import HandlerRunner
    from eventing.storage.remote import DataService, RemoteBucket
    from eventing.workers.sandbox.scope import ScopedService

    app = Eventing(data_dir, executor="in-process")
    app.create_bucket("shop")
    app.create_bucket("copies")
    app.create_collection("copies.pg.plain")
    cid = _mirror(data_dir, "copies", "pg", "orders")
    defn = FunctionDefinition.from_dict(
        _definition(
            "fn_old", "shop._default._default", {"scope": "pg", "collection": "orders", "access": "rw"}
        )
    )
    service = DataService(app.state)
    scoped = ScopedService("fn_old", defn, service)
    assert RemoteBucket(scoped, "copies").mirrors() == {cid: SHOWN}
    runner = HandlerRunner(
        "fn_old", defn, COPY, RemoteBucket(scoped, "shop"), lambda b: RemoteBucket(scoped, b)
    )
    try:
        binding = runner.bindings[0]
        with pytest.raises(BindingError, match="its collection mirrors table public.orders .*access 'r'"):
            binding["k"] = {"n": 1}
        with pytest.raises(BindingError, match="mirrors table public.orders"):
            binding.upsert("k", {"n": 1})
        assert binding.get("k") is None  # reads work as usual
    finally:
        runner.close()
