"""The fast path of window-only functions (SourceReader.take_window_batch, WindowRowWriter.add_packed) against
the per-row path (MutationHandler.handle, WindowRowWriter.add): the same row files, counters, checkpoints and
dead letters for a mix of documents, on real SQLite buckets."""

from __future__ import annotations

import shutil
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import pytest

from eventing.control import lifecycle
from eventing.core.definition import FunctionDefinition
from eventing.core.mutation import OP_DELETE, OP_EXPIRE, OP_UPDATE, Mutation, encode_document
from eventing.storage import loadgen
from eventing.storage.bucket import LocalBucket
from eventing.storage.values import PackedUpdates, Write
from eventing.storage.writes import chunked
from eventing.windows.batches import read_row_batch
from eventing.windows.runtime import row_writer as rows_module
from eventing.windows.runtime.paths import WindowPaths
from eventing.windows.runtime.row_writer import MAX_EVENT_MS, MIN_EVENT_MS, RowLayout, WindowRowWriter
from eventing.workers.handling import MutationHandler
from eventing.workers.worker import WorkerCore, WorkerSpec
from metadata import DlqRow
from metadata.factory import open_store
from sharding import NUM_VBUCKETS, vbucket_of

FN = "fn_fast"
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
WINDOW = {
    "kind": "tumbling",
    "size": "1m",
    "time_field": "ts",
    "group_by": ["country"],
    # ts is also an aggregated field and amount both summed and counted: shared fields of one document.
    "aggregates": [
        "count",
        {"op": "sum", "field": "amount"},
        {"op": "count", "field": "email"},
        {"op": "count", "field": "amount"},
        {"op": "max", "field": "ts"},
    ],
    "out_of_order_tolerance": "10s",
}
PROCESSING_WINDOW = {
    "kind": "tumbling",
    "size": "1m",
    "boundary": "processing_time",
    "group_by": ["country"],
    "aggregates": ["count", {"op": "sum", "field": "amount"}],
}
ON_DELETE = "def on_delete(meta, options):\n    pass\n"
MAX_BYTES = 300


def keys_by_vb(count: int, per_vb: int) -> list[list[str]]:
    """`per_vb` keys of each of `count` vBuckets."""
    found: dict[int, list[str]] = {}
    i = 0
    while len([v for v in found.values() if len(v) >= per_vb]) < count:
        key = f"doc-{i}"
        i += 1
        keys = found.setdefault(vbucket_of(key), [])
        if len(keys) < per_vb:
            keys.append(key)
    return [v for v in found.values() if len(v) >= per_vb][:count]


def doc(i: int, **fields: Any) -> bytes:
    return msgpack.packb(
        {"ts": T0 + i * 1000, "country": "KR", "amount": 1.5 + i, "email": f"u{i}@x", "name": "n", **fields},
        use_bin_type=True,
    )


def update(key: str, data: bytes | None) -> Write:
    return Write(key, OP_UPDATE, data)


def mix() -> tuple[list[list[str]], list[tuple[list[Write], str | None]]]:
    """Writes (with their origin) over vBuckets of one kind each: plain, deletes, float times, rows of the
    function itself, dead letters, an oversize document, unusual values, edge times."""
    plain, deletes, floats, recursion, bad, oversize, odd, edges = vbs = keys_by_vb(8, 4)
    out: list[tuple[list[Write], str | None]] = []
    out.append(([update(k, doc(i + r, f0=99, f1="x")) for r in range(4) for i, k in enumerate(plain)], None))
    out.append(
        (
            [update(k, doc(i)) for i, k in enumerate(deletes)]
            + [Write(deletes[0], OP_DELETE), Write(deletes[1], OP_EXPIRE)]
            + [update(k, doc(i + 10)) for i, k in enumerate(deletes)],
            None,
        )
    )
    out.append(
        (
            [update(k, doc(i)) for i, k in enumerate(floats)]
            + [update(floats[0], doc(0, ts=T0 + 1500.75)), update(floats[1], doc(1, ts=float(T0)))]
            + [update(k, doc(i + 5)) for i, k in enumerate(floats)],
            None,
        )
    )
    out.append(([update(k, doc(i)) for i, k in enumerate(recursion)], None))
    out.append(([update(recursion[0], doc(7))], FN))  # written by the function's own binding
    out.append(([update(k, doc(i + 20)) for i, k in enumerate(recursion)], None))
    bad_docs = [
        msgpack.packb({"country": "KR", "amount": 1}),  # no time field
        doc(1, ts=None),
        doc(2, ts="yesterday"),
        doc(3, ts=True),
        doc(4, ts=10**18),
        doc(5, ts=float("nan")),
        b"\xc1",  # not msgpack at all
        msgpack.packb({"ts": T0}) + b"\x00",  # trailing bytes
        None,  # an update without a document
    ]
    bad_docs += [msgpack.packb([1, 2]), msgpack.packb("text"), msgpack.packb(None)]  # not objects
    out.append(
        (
            [update(bad[i % len(bad)], d) for i, d in enumerate(bad_docs)]
            + [update(k, doc(i + 30)) for i, k in enumerate(bad)],
            None,
        )
    )
    out.append(
        (
            [update(k, doc(i)) for i, k in enumerate(oversize)]
            + [update(oversize[0], doc(6, pad="x" * MAX_BYTES))]
            + [update(k, doc(i + 40)) for i, k in enumerate(oversize)],
            None,
        )
    )
    odd_values = [
        {"country": 7, "amount": "2.5"},
        {"country": True, "amount": "abc"},
        {"country": None, "amount": True},
        {"country": [1, "a"], "amount": None, "email": None},
        {"country": {"b": 1, "a": [2]}, "amount": "nan"},
        {"country": 2.5, "amount": 3},
        {"country": "", "amount": 2**64 - 1},
        {"country": "DE", "amount": -0.0},
    ]
    out.append(
        (
            [update(odd[i % len(odd)], doc(i, **v)) for i, v in enumerate(odd_values)]
            + [update(odd[0], msgpack.packb({"ts": T0, "email": "e"}))],
            None,
        )
    )  # only ts and email
    out.append(
        (
            [
                update(edges[0], doc(0, ts=MIN_EVENT_MS)),
                update(edges[1], doc(0, ts=MAX_EVENT_MS)),
                update(edges[2], doc(0, ts=0)),
                update(edges[3], doc(0, ts=-1)),
            ],
            None,
        )
    )
    return vbs, out


def make_source(base: Path, writes: list[tuple[list[Write], str | None]]) -> None:
    source = LocalBucket.create(base, "src")
    for batch, origin in writes:
        source.write(batch, origin=origin)
    source.close()


def run_worker(
    data_dir: Path,
    *,
    window: dict,
    handler: str = "",
    batch_size: int = 1000,
    hung: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Deploy the function and drain the source with one in-process worker; what it left behind. `hung`:
    (vb, seqno) of a mutation a previous process of the worker hung on (a `timeout` dead letter)."""
    defn = FunctionDefinition.from_dict(
        {
            "name": FN,
            "source_bucket": "src",
            "window": window,
            "batch_size": batch_size,
            "checkpoint_interval": "1h",  # rows are written at the final commit (or when the buffer is full)
            "max_document_bytes": MAX_BYTES,
        }
    )
    lifecycle.save_function(str(data_dir), defn, handler)
    lifecycle.deploy(str(data_dir), FN)
    store = open_store(data_dir)
    if hung is not None:
        vb, seqno = hung
        epoch = store.claim(FN, [vb], "local/w0")[vb].epoch
        generation = store.get_function(FN).generation  # a letter of this deployment: its workers skip it
        row = DlqRow(FN, vb, seqno, "?", "timeout", "hung", "", 1, 1.0, 1.0, b"", generation=generation)
        store.commit(FN, {vb: epoch}, {}, [row])
    spec = WorkerSpec(
        str(data_dir), FN, store.get_function(FN).generation, "local/w0", tuple(range(NUM_VBUCKETS))
    )
    core = WorkerCore(spec)
    assert core.handler.on_update is None and core.window_rows is not None
    handled = 0
    while not (report := core.step()).caught_up:
        handled += report.handled
    handled += report.handled
    core.stop()
    core.close()
    files = sorted(WindowPaths.of(data_dir, FN).incoming.glob("*.arrow"))
    return {
        "handled": handled,
        "files": [read_row_batch(p).to_pylist() for p in files],
        # Latency counters depend on the clock, not on the path taken; every other counter must match.
        "counters": {k: v for k, v in store.counters(FN).items() if not k.startswith("latency_")},
        "checkpoints": {vb: cp.seqno for vb, cp in store.checkpoints(FN).items()},
        "dlq": [
            (r.vb, r.seqno, r.key, r.reason, r.error, r.traceback, r.attempts, r.mutation)
            for r in store.dlq_rows(FN)
        ],
    }


class FastPathCalls:
    """Counts the batches add_packed buffered, by vBucket."""

    def __init__(self, monkeypatch):
        self.taken: Counter[int] = Counter()
        original = WindowRowWriter.add_packed

        def counted(writer, batch):
            ok = original(writer, batch)
            if ok:
                self.taken[batch.vb] += 1
            return ok

        monkeypatch.setattr(WindowRowWriter, "add_packed", counted)


def both_paths(tmp_path: Path, monkeypatch, writes, **kwargs) -> tuple[dict, dict, FastPathCalls]:
    """Run the same source (a copy of one bucket file: same cas, same documents) with the fast path and
    with add_packed refusing every batch, so every row takes _handle."""
    make_source(tmp_path / "base", writes)
    for name in ("fast", "per_row"):
        shutil.copytree(tmp_path / "base", tmp_path / name)
    with monkeypatch.context() as m:
        calls = FastPathCalls(m)
        fast = run_worker(tmp_path / "fast", **kwargs)
    with monkeypatch.context() as m:
        m.setattr(WindowRowWriter, "add_packed", lambda writer, batch: False)
        per_row = run_worker(tmp_path / "per_row", **kwargs)
    # Arrival times: per row on the per-row path; the bulk path keeps each vBucket's least and greatest
    # (row_writer.arrival_times), which is all the coordinator reads from them when they spread less than
    # the shortest idle timeout. Compared by those, then left out of the row-by-row comparison.
    assert _arrival_bounds(fast) == _arrival_bounds(per_row)
    return fast, per_row, calls


def _arrival_bounds(outcome: dict) -> dict[int, tuple[int, int]]:
    bounds: dict[int, tuple[int, int]] = {}
    for f in outcome["files"]:
        for row in f:
            a = row.pop("arrival_ms")
            lo, hi = bounds.get(row["vb"], (a, a))
            bounds[row["vb"]] = (min(lo, a), max(hi, a))
    return bounds


@pytest.mark.parametrize("batch_size", [1000, 3])
@pytest.mark.parametrize("max_buffered", [rows_module.MAX_BUFFERED_ROWS, 4])
def test_a_mix_of_documents_gives_the_same_rows_counters_and_dead_letters(
    tmp_path, monkeypatch, batch_size, max_buffered
):
    monkeypatch.setattr(rows_module, "MAX_BUFFERED_ROWS", max_buffered)
    vbs, writes = mix()
    fast, per_row, calls = both_paths(tmp_path, monkeypatch, writes, window=WINDOW, batch_size=batch_size)
    assert fast == per_row
    plain, deletes, floats, recursion, bad, oversize, odd, edges = (vbucket_of(keys[0]) for keys in vbs)
    assert {plain, deletes, odd, edges} <= set(calls.taken)
    if batch_size == 1000:  # one batch per vBucket: these hold a row the fast path leaves to _handle
        assert not {floats, recursion, bad, oversize} & set(calls.taken)
    counters = fast["counters"]
    assert counters["mutations_seen"] == fast["handled"] == sum(len(w) for w, _ in writes)
    assert counters["recursion_filtered"] == 1 and counters["no_handler"] == 2
    assert Counter(row[3] for row in fast["dlq"]) == {"bad_event_time": 9, "undecodable": 3, "oversize": 1}
    assert counters["window_values_not_numeric"] == 3  # "abc", True and "nan" as amounts
    assert sum(len(f) for f in fast["files"]) == counters["window_rows_written"]
    if max_buffered == 4:
        assert all(len(f) == 4 for f in fast["files"][:-1])


def test_deletes_with_an_on_delete_handler_take_the_per_row_path(tmp_path, monkeypatch):
    vbs, writes = mix()
    fast, per_row, calls = both_paths(tmp_path, monkeypatch, writes, window=WINDOW, handler=ON_DELETE)
    assert fast == per_row
    assert fast["counters"]["on_delete_success"] == 2
    assert vbucket_of(vbs[1][0]) not in calls.taken and vbucket_of(vbs[0][0]) in calls.taken


def test_a_mutation_a_previous_process_hung_on_is_skipped_on_both_paths(tmp_path, monkeypatch):
    vbs, writes = mix()
    plain = vbucket_of(vbs[0][0])
    fast, per_row, calls = both_paths(tmp_path, monkeypatch, writes, window=WINDOW, hung=(plain, 3))
    assert fast == per_row
    assert fast["counters"]["hung_skipped"] == 1 and plain not in calls.taken


def test_processing_time_rows_match_except_for_their_times(tmp_path, monkeypatch):
    _, writes = mix()
    fast, per_row, calls = both_paths(tmp_path, monkeypatch, writes, window=PROCESSING_WINDOW, batch_size=5)
    for outcome in (fast, per_row):
        outcome["files"] = [
            [{k: v for k, v in row.items() if k != "event_time"} for row in f] for f in outcome["files"]
        ]
    assert fast == per_row
    assert calls.taken
    # Processing time needs no time field, but grouping needs an object: lists, strings and null are not.
    assert Counter(row[3] for row in fast["dlq"])["bad_event_time"] == 3


def test_generated_mutations_give_the_same_results(tmp_path, monkeypatch):
    writes = [(chunk, None) for chunk in chunked(loadgen.generate(200, 3000, seed=3, span_ms=600_000), 1000)]
    fast, per_row, calls = both_paths(tmp_path, monkeypatch, writes, window=WINDOW, batch_size=200)
    assert fast == per_row
    assert fast["counters"]["window_rows_written"] > 2500
    assert "on_update_success" not in fast["counters"]  # a window-only function calls no handler


def test_plain_documents_never_go_row_by_row(tmp_path, monkeypatch):
    writes = [(chunk, None) for chunk in chunked(loadgen.generate(200, 3000, seed=3, span_ms=600_000), 1000)]
    make_source(tmp_path, writes)

    def refuse(handler, m):
        raise AssertionError(f"{m} took the per-row path")

    monkeypatch.setattr(MutationHandler, "handle", refuse)
    calls = FastPathCalls(monkeypatch)
    outcome = run_worker(tmp_path, window=WINDOW, batch_size=300)
    assert outcome["handled"] == 3000
    assert calls.taken.total() >= 3000 / 300
    updates = sum(1 for chunk, _ in writes for w in chunk if w.op == OP_UPDATE)
    assert outcome["counters"]["window_rows_written"] == updates
    assert outcome["counters"]["no_handler"] == 3000 - updates


def packed(
    vb: int, keys: list[str], docs: list[bytes], *, after: int = 0, others: list[int] = ()
) -> PackedUpdates:
    """The updates of keys and docs (and deletes at seqnos `others`) as read_vb_packed gives them."""
    last = after + len(docs) + len(others)
    return PackedUpdates(
        vb, after, last, list(others), len(docs), b"\0".join(k.encode() for k in keys), b"".join(docs)
    )


def flushed(writer: WindowRowWriter) -> list[dict]:
    return read_row_batch(writer.flush()).to_pylist()


def test_add_packed_buffers_what_add_buffers(tmp_path):
    layout = RowLayout.for_definition(FN, WINDOW)
    docs = [
        {"ts": T0 + i, "country": c, "amount": a, "email": e, "f0": "not a row field"}
        for i, (c, a, e) in enumerate([("KR", 1, "a"), (None, "2", None), (3, None, "b"), ([1], True, {})])
    ]
    docs.append({"ts": T0})  # every other field missing
    one, batch = (WindowRowWriter(tmp_path, FN, 1, w, layout) for w in ("one", "batch"))
    # Keys of every width, non-ASCII among them; seqnos 3 and 6 are deletes.
    keys = ["k", "ключ-2", "k\u00e9y3", "𝄞" * 30, "k5"]
    seqnos = [1, 2, 4, 5, 7]
    for seqno, key, d in zip(seqnos, keys, docs, strict=True):
        assert one.add(Mutation(7, seqno, key, OP_UPDATE, 0, b"", None, 0, 0), d)
    assert batch.add_packed(packed(7, keys, [encode_document(d) for d in docs], others=[3, 6]))
    assert len(batch) == len(one) == 5
    assert flushed(batch) == flushed(one)
    assert batch.counters == one.counters


def test_add_packed_keeps_the_order_of_rows_add_buffered_before_and_after(tmp_path):
    writer = WindowRowWriter(tmp_path, FN, 1, "w", RowLayout.for_definition(FN, WINDOW))
    writer.add(Mutation(1, 1, "a", OP_UPDATE, 0, b"", None, 0, 0), {"ts": T0})
    assert writer.add_packed(packed(2, ["b", "c"], [encode_document({"ts": T0 + 1})] * 2))
    writer.add(Mutation(1, 2, "d", OP_UPDATE, 0, b"", None, 0, 0), {"ts": T0 + 2})
    assert [(r["vb"], r["seqno"], r["key"]) for r in flushed(writer)] == [
        (1, 1, "a"),
        (2, 1, "b"),
        (2, 2, "c"),
        (1, 2, "d"),
    ]


@pytest.mark.parametrize(
    "bad",
    [
        msgpack.packb({"ts": T0 + 0.5}),
        msgpack.packb({"ts": True}),
        msgpack.packb({"ts": MAX_EVENT_MS + 1}),
        msgpack.packb({"ts": 2**64 - 1}),
        msgpack.packb({}),
        msgpack.packb([1]),
        b"\xc1",
        b"",
    ],
)
def test_add_packed_refuses_a_batch_with_one_unusable_document_and_buffers_nothing(tmp_path, bad):
    writer = WindowRowWriter(tmp_path, FN, 1, "w", RowLayout.for_definition(FN, WINDOW))
    docs = [encode_document({"ts": T0, "country": "KR"}), bad, encode_document({"ts": T0})]
    assert not writer.add_packed(packed(0, ["a", "b", "c"], docs))
    assert len(writer) == 0 and writer.flush() is None and not writer.counters


def test_add_packed_refuses_keys_holding_a_nul_byte(tmp_path):
    writer = WindowRowWriter(tmp_path, FN, 1, "w", RowLayout.for_definition(FN, WINDOW))
    assert not writer.add_packed(packed(0, ["a\0b", "c"], [encode_document({"ts": T0})] * 2))
    assert len(writer) == 0


def test_read_vb_packed_gives_the_log_in_seqno_order_or_none_when_it_cannot(tmp_path):
    bucket = LocalBucket.create(tmp_path, "src")
    keys = keys_by_vb(1, 6)[0]
    vb = vbucket_of(keys[0])
    bucket.write([update(k, doc(i)) for i, k in enumerate(keys)])
    bucket.write([Write(keys[0], OP_DELETE), update(keys[1], doc(9))])
    batch = bucket.read_vb_packed(vb, 0, 100, FN)
    assert (batch.after_seqno, batch.last_seqno, batch.other_seqnos, batch.update_count) == (0, 8, [7], 7)
    assert batch.keys.split(b"\0") == [k.encode() for k in [*keys, keys[1]]]
    assert batch.docs == b"".join([*(doc(i) for i in range(6)), doc(9)])
    assert bucket.read_vb_packed(vb, 2, 3, FN).last_seqno == 5  # a window of the log
    assert bucket.read_vb_packed(vb, 8, 100, FN) is None  # nothing after the last
    bucket.write([update(keys[2], doc(1))], origin=FN)  # the function's own write: row by row
    assert bucket.read_vb_packed(vb, 0, 100, FN) is None
    assert bucket.read_vb_packed(vb, 0, 100, "another") is not None
    bucket.write([update(keys[3], None)])  # an update without a document
    assert bucket.read_vb_packed(vb, 8, 100, FN) is None
    assert bucket.max_doc_bytes(vb, 0, 9) == max(len(doc(i)) for i in (*range(6), 9, 1))
    bucket.file.db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 200)  # more documents than SQLite may concatenate
    assert bucket.read_vb_packed(vb, 0, 5, FN) is None
    assert bucket.read_vb_packed(vb, 0, 1, FN) is not None
    bucket.close()


def test_a_worker_buffers_and_writes_its_rows_without_importing_pandas_or_arrows_compute(tmp_path):
    """pyarrow.array() imports pandas at its first call (~0.15 s of every worker process's start): the
    rows are built from their buffers instead, on both paths. Nor does a worker need pyarrow.compute or
    pyarrow.parquet (~40 ms more)."""
    code = f"""
import sys
from eventing.core.mutation import OP_UPDATE, Mutation, encode_document
from eventing.storage.values import PackedUpdates
from eventing.windows.batches import read_row_batch
from eventing.windows.runtime.row_writer import RowLayout, WindowRowWriter

writer = WindowRowWriter(sys.argv[1], "{FN}", 1, "w", RowLayout.for_definition("{FN}", {WINDOW!r}))
writer.add(Mutation(1, 1, "a", OP_UPDATE, 0, b"", None, 0, 0), {{"ts": {T0}, "country": 3, "amount": "2"}})
docs = [encode_document({{"ts": {T0} + i, "country": None if i else "KR", "amount": i}}) for i in range(3)]
assert writer.add_packed(PackedUpdates(2, 0, 3, [], 3, b"b\\0c\\0d", b"".join(docs)))
path = writer.flush()
imported = [m for m in ("pandas", "pyarrow.compute", "pyarrow.parquet") if m in sys.modules]
assert not imported, f"a worker's rows imported {{imported}}"
rows = read_row_batch(path).to_pylist()
assert [(r["key"], r["country"], r["amount"]) for r in rows] == [
    ("a", "3", 2.0), ("b", "KR", 0.0), ("c", None, 1.0), ("d", None, 2.0)
], rows
"""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "values",
    [
        [],
        ["KR"] * 3,
        ["KR", None, "", "a\0b", None],
        ["ключ", "𝄞", None, "k\u00e9y", "plain"],
        [None, None],
    ],
)
def test_string_columns_built_from_buffers_equal_pyarrows(values):
    import pyarrow as pa

    from eventing.windows.batches import string_column

    built = string_column(list(values))
    built.validate(full=True)
    assert built.equals(pa.array(values, pa.string()))


@pytest.mark.parametrize("values", [[], [1.5, -2.0], [None, 0.0, None, 3.25], [None]])
def test_float_columns_built_from_buffers_equal_pyarrows(values):
    import pyarrow as pa

    from eventing.windows.batches import float_column

    built = float_column(list(values))
    built.validate(full=True)
    assert built.equals(pa.array(values, pa.float64()))
