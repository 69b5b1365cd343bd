"""previous_version: on_update's meta.previous is the document's previous version (None when new), the
same whether it comes from the worker's cache or from the source log after a restart."""

from __future__ import annotations

from eventing.core.definition import FunctionDefinition
from eventing.storage.bucket import LocalBucket
from eventing.testing import deploy_function
from eventing.workers.worker import WorkerCore, WorkerSpec
from metadata.factory import open_store
from sharding import NUM_VBUCKETS

HANDLER = """
def on_update(doc, meta):
    prev = meta.previous
    dst[meta.id + "@" + str(doc["rev"])] = {"previous_rev": None if prev is None else prev["rev"]}

def on_delete(meta, options):
    pass
"""


def worker(data_dir: str, wid: str) -> WorkerCore:
    store = open_store(data_dir)
    generation = store.get_function("fn_p").generation
    return WorkerCore(WorkerSpec(data_dir, "fn_p", generation, wid, tuple(range(NUM_VBUCKETS))))


def test_meta_previous_is_the_previous_version_also_after_a_restart(data_dir):
    source = LocalBucket.create(data_dir, "src")
    d = FunctionDefinition.from_dict(
        {
            "name": "fn_p",
            "source_bucket": "src",
            "previous_version": True,
            "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
        }
    )
    deploy_function(data_dir, d, HANDLER)
    source.upsert("a", {"rev": 1})
    source.upsert("a", {"rev": 2})
    source.upsert("b", {"rev": 1})
    w = worker(data_dir, "n/w0")
    w.step()
    w.stop()
    source.upsert("a", {"rev": 3})  # the new worker has no cache: previous comes from the source log
    source.delete("b")
    source.upsert("b", {"rev": 2})  # after a delete, there is no previous version
    w2 = worker(data_dir, "n/w1")
    w2.step()
    w2.commit()
    dst = LocalBucket.open(data_dir, "dst")
    got = {k: dst.get(k)["previous_rev"] for k in dst.keys()}
    assert got == {"a@1": None, "a@2": 1, "a@3": 2, "b@1": None, "b@2": None}


def test_without_the_setting_meta_previous_is_none(data_dir):
    source = LocalBucket.create(data_dir, "src")
    d = FunctionDefinition.from_dict(
        {
            "name": "fn_p",
            "source_bucket": "src",
            "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
        }
    )
    deploy_function(data_dir, d, HANDLER)
    source.upsert("a", {"rev": 1})
    source.upsert("a", {"rev": 2})
    w = worker(data_dir, "n/w0")
    w.step()
    w.commit()
    assert LocalBucket.open(data_dir, "dst").get("a@2") == {"previous_rev": None}
