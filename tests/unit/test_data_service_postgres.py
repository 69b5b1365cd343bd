"""The data service's `read_changed` on a server's bucket (a sandboxed worker's host on a PostgreSQL store)
looks at the vBuckets asked in one round trip and takes the rows from what the look holds: its answer is
what plain reads answer, for a few vBuckets (one statement) and for many (the pipeline), after writes
made between two calls, and under the caller's row limit."""

from __future__ import annotations

import random

import msgpack
import pytest

from eventing.storage.remote import PARTIAL_LOOK, DataService
from eventing.storage.rows_ahead import rows_of_columns
from eventing.storage.state import as_state
from eventing.testing import load_source
from sharding import NUM_VBUCKETS, vbucket_spans


def _expected(bucket, positions, limit):
    highs = bucket.high_seqnos()
    runs, left = [], limit
    for vb, at in positions:
        if highs[vb] > at and left > 0:
            runs.append((vb, at, min(highs[vb] - at, left)))
            left -= highs[vb] - at
    return {vb: highs[vb] for vb, _ in positions}, runs, [bucket.read_vb_rows(*run) for run in runs]


@pytest.mark.parametrize("asked", [3, PARTIAL_LOOK + 40])
def test_a_servers_read_changed_answers_what_plain_reads_answer(pg_schema_url, asked):
    source = load_source(pg_schema_url, 60, 600, seed=4)
    service = DataService(pg_schema_url)
    plain = as_state(pg_schema_url).open_bucket("src")
    rng = random.Random(asked)
    try:
        for round_ in range(4):
            highs = plain.high_seqnos()
            vbs = rng.sample(range(NUM_VBUCKETS), asked)
            positions = [(vb, max(0, highs[vb] - rng.randint(0, 3))) for vb in vbs]
            limit = rng.choice([2, 5, 32000])
            blob, got_highs, runs = service.do_read_changed("src", positions, limit, vbucket_spans(vbs))
            want_highs, want_runs, want_rows = _expected(plain, positions, limit)
            assert {vb: got_highs[vb] for vb in vbs} == want_highs
            assert runs == want_runs
            answers = msgpack.unpackb(blob, raw=False, use_list=False)
            rows = [
                answer[1] if answer[0] == 0 else rows_of_columns(vb, after, answer[1:])
                for (vb, after, _), answer in zip(runs, answers, strict=True)
            ]
            assert [tuple(map(tuple, r)) for r in rows] == [tuple(map(tuple, w)) for w in want_rows]
            for i in range(5):  # written between two calls: the next one sees them
                source.upsert(f"r{round_}-{i}", {"i": i})
    finally:
        service.close()
        plain.close()
