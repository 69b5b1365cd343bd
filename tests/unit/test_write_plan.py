"""A batch of updates planned before the write lock (eventing.storage.write_plan) logs exactly what the
row-by-row path logs: same log rows, docs rows, high seqnos, (vb, seqno) answers, effect marks."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventing.core.mutation import OP_DELETE, OP_UPDATE
from eventing.storage import effects as effects_module
from eventing.storage import writes as writes_module
from eventing.storage.bucket import LocalBucket
from eventing.storage.files import bucket_path
from eventing.storage.values import EffectGroup, Write

KEYS = [f"doc::{i}" for i in range(40)]  # few keys: batches repeat keys and share vBuckets

# A handler's write carries the cas it reserved (eventing.storage.writes.CasSource); others get a fresh one.
update = st.builds(
    lambda k, rev, exp, cas: Write(KEYS[k], OP_UPDATE, bytes([0x81, 0xA1, 0x72, rev]), exp, 0, cas),
    st.integers(0, len(KEYS) - 1),
    st.integers(0, 127),
    st.sampled_from([0, 0, 0, 2_000_000_000]),
    st.one_of(st.none(), st.none(), st.integers(1, 2**62)),
)
delete = st.builds(lambda k: Write(KEYS[k], OP_DELETE), st.integers(0, len(KEYS) - 1))
batches = st.lists(
    st.one_of(st.lists(update, max_size=30), st.lists(st.one_of(update, delete), max_size=30)),
    min_size=1,
    max_size=6,
)


def _contents(bucket: LocalBucket) -> tuple[list, list, list]:
    """The bucket's rows with each cas replaced by its rank, and arrival times taken from the clock (the
    effects') by -1: both come from the clock."""
    db = bucket.file.db
    ranks = {c: i for i, (c,) in enumerate(db.execute("SELECT cas FROM log ORDER BY cas"))}
    log = [
        (*r[:4], ranks[r[4]], *r[5:9], r[9] if r[9] < 10**12 else -1)
        for r in db.execute(
            "SELECT vb, seqno, key, op, cas, doc, origin, expiry, flags, arrival_ms FROM log ORDER BY vb, "
            "seqno"
        )
    ]
    docs = [(*r[:3], ranks[r[3]], *r[4:]) for r in db.execute("SELECT * FROM docs ORDER BY key")]
    return log, docs, bucket.high_seqnos()


@pytest.fixture(scope="module")
def empty_bucket(tmp_path_factory) -> Path:
    """An empty bucket's file, created once (creating one syncs the disk several times): each run copies
    it."""
    data_dir = tmp_path_factory.mktemp("template")
    LocalBucket.create(data_dir, "b").close()
    return bucket_path(data_dir, "b")


def _run(batches: list[list[Write]], planned: bool, empty_bucket: Path) -> tuple:
    with pytest.MonkeyPatch.context() as m, tempfile.TemporaryDirectory() as data_dir:
        if not planned:
            # Looked up in both: writes (write, load_rows) and effects (apply_effects).
            m.setattr(writes_module, "_plan", lambda items: None)
            m.setattr(effects_module, "_plan", lambda items: None)
        copy = bucket_path(data_dir, "b")
        copy.parent.mkdir(parents=True)
        shutil.copyfile(empty_bucket, copy)
        bucket = LocalBucket.open(data_dir, "b")
        answers = [bucket.write(batch, origin="fn", arrival_ms=1_000 + i) for i, batch in enumerate(batches)]
        # The same batches again as effects of a function: planned in apply_effects, then replayed (all
        # duplicates) and once with a stale epoch (fenced): the general path.
        groups = [
            EffectGroup(vb, 3, [(s + 1, w) for s, w in enumerate(batch)]) for vb, batch in enumerate(batches)
        ]
        results = [
            bucket.apply_effects("fx", groups),
            bucket.apply_effects("fx", groups),
            bucket.apply_effects("fx", [EffectGroup(0, 2, groups[0].writes)]),
        ]
        marks = sorted(bucket.file.db.execute("SELECT * FROM effect_marks"))
        contents = _contents(bucket)
        bucket.close()
        return answers, [(r.applied, r.duplicates, sorted(r.fenced_vbs)) for r in results], marks, contents


@settings(max_examples=60, deadline=None)
@given(batches=batches)
def test_a_planned_batch_logs_what_the_row_by_row_path_logs(batches, empty_bucket):
    assert _run(batches, True, empty_bucket) == _run(batches, False, empty_bucket)


def test_a_batch_of_updates_is_planned_and_one_with_a_delete_is_not():
    assert writes_module._plan([("k", OP_UPDATE, b"\x80", 0, 0, None)]) is not None
    assert (
        writes_module._plan([("k", OP_UPDATE, b"\x80", 0, 0, None), ("k", OP_DELETE, None, 0, 0, None)])
        is None
    )
