"""The recursion guard per deployment (eventing.storage.origins): a deployment never handles what it wrote
to its own source (across runs of new workers and `dlq replay`), a later deployment of the same function
handles what an earlier one wrote, exactly once, and log entries from before origins named the deployment
(a bare function name) count as every deployment's own."""

from __future__ import annotations

from eventing.api import Eventing
from eventing.core.mutation import OP_UPDATE, encode_document
from eventing.ops import dlq
from eventing.storage.origins import deployment_origin, is_own, origin_function
from eventing.storage.values import Write

# Counts every mutation it handles (`seen`), and copies each original document into its own source once.
HANDLER = """
def on_update(doc, meta):
    if doc.get("fail") and ctl.get("mode", {}).get("fail"):
        raise RuntimeError("told to fail")
    seen.increment(meta.id)
    if not meta.id.startswith("copy::"):
        src["copy::" + meta.id] = {"of": meta.id}
"""

DEFINITION = {
    "name": "fn_copy",
    "source_bucket": "src",
    "boundary": "everything",
    "bindings": [
        {"alias": "src", "bucket": "src", "access": "rw"},
        {"alias": "seen", "bucket": "seen", "access": "rw"},
        {"alias": "ctl", "bucket": "ctl", "access": "r"},
    ],
}


def _run(app: Eventing) -> None:
    summary = app.run(until_caught_up=True)
    assert not summary.errors, summary.errors


def _counts(app: Eventing) -> dict[str, int]:
    return {key: app.get("seen", key)["count"] for key in app.keys("seen")}


def test_a_later_deployment_handles_an_earlier_ones_writes_once_and_never_its_own(data_dir):
    app = Eventing(data_dir, executor="in-process")
    for bucket in ("src", "seen", "ctl"):
        app.create_bucket(bucket)
    app.upsert("src", "a", {"n": 1})
    app.upsert("src", "b", {"n": 2})
    # an entry written before origins named the deployment: the function's own, for every deployment
    app.bucket("src").write([Write("legacy", OP_UPDATE, encode_document({"n": 0}))], origin="fn_copy")

    app.deploy(DEFINITION, HANDLER)
    _run(app)
    _run(app)  # new workers, from the checkpoints: still not its own copies
    assert _counts(app) == {"a": 1, "b": 1}
    assert app.get("src", "copy::a") == {"of": "a"}
    first = app.stats("fn_copy").view["recursion_filtered"]
    assert first == 3  # copy::a, copy::b and the legacy entry

    app.undeploy("fn_copy")
    app.deploy(DEFINITION, HANDLER)  # a new generation, from everything
    _run(app)
    app.upsert("src", "c", {"n": 3})
    _run(app)
    _run(app)
    # a and b again (from everything), c once; the first deployment's copies once each; none of this
    # deployment's own copies, nor the legacy entry
    assert _counts(app) == {"a": 2, "b": 2, "c": 1, "copy::a": 1, "copy::b": 1}

    # a dead letter replayed: its write carries this deployment's origin, so it does not come back
    app.upsert("ctl", "mode", {"fail": True})
    app.upsert("src", "d", {"fail": True})
    _run(app)
    assert "d" not in _counts(app) and app.stats("fn_copy").dlq
    app.upsert("ctl", "mode", {"fail": False})
    report = dlq.replay(data_dir, "fn_copy", dlq.DlqSelector(everything=True))
    assert report.replayed == 1 and app.get("src", "copy::d") == {"of": "d"}
    _run(app)
    assert _counts(app) == {"a": 2, "b": 2, "c": 1, "d": 1, "copy::a": 1, "copy::b": 1}


def test_origins_name_the_deployment():
    assert (
        deployment_origin("fn", 3) == "fn@3"
        and origin_function("fn@3") == "fn"
        and origin_function(None) is None
    )
    assert is_own("fn@3", "fn", 3) and not is_own("fn@2", "fn", 3) and not is_own("fn2@3", "fn", 3)
    assert is_own("fn", "fn", 3) and is_own("fn", "fn", 1)  # a bare name: every deployment's own
    assert is_own("fn@2", "fn", None) and not is_own(None, "fn", 3) and not is_own("other", "fn", None)
