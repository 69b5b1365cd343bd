"""The server-side functions of a PostgreSQL bucket (eventing.storage.postgres.functions) against the
statements they stand in for: the same sequences of flushes of effects, fences and writes on two stores, one
taking the functions where it can and one never, leave the same documents, log, high seqnos and marks, and
answer the same. Then what the functions do where they cannot apply a batch, and their commit tokens."""

from __future__ import annotations

import uuid
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventing.core import xattrs as X
from eventing.core.mutation import OP_DELETE, OP_UPDATE, encode_document
from eventing.storage import postgres as pg_buckets
from eventing.storage.postgres import effects as pg_effects
from eventing.storage.postgres import writer as pg_writer
from eventing.storage.values import EffectGroup, Write
from metadata.postgres import PostgresDatabase
from sharding import vbucket_of

FUNCTION = "fn"
KEYS = [f"doc{i}" for i in range(4)]
SOURCE_VBS = [3, 7]


@pytest.fixture(scope="module")
def pg_module_url(pg_server) -> str:
    return pg_server.create_database(f"effects_fn_{uuid.uuid4().hex[:8]}")


def _url(request) -> str:
    return request.getfixturevalue("pg_module_url") + f"?schema=t_{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def shared_db(pg_module_url):
    """One schema for the examples of the property test, each example's buckets named afresh (a schema
    each cost a tenth of a second of DDL)."""
    db = PostgresDatabase.open(pg_module_url + f"?schema=t_{uuid.uuid4().hex[:12]}")
    yield db
    db.close()


@contextmanager
def _bucket(request):
    db = PostgresDatabase.open(_url(request))
    try:
        with pg_buckets.create_bucket(db, "b") as bucket:
            yield bucket, db
    finally:
        db.close()


def _writes_by_statements(monkeypatch) -> None:
    monkeypatch.setattr(pg_writer, "plain_updates", lambda items: False)


class _Counting:
    """Counts the flushes the server's function applied (and those it handed back)."""

    def __init__(self, monkeypatch, *, allowed: bool):
        self.applied = self.declined = 0
        real = pg_effects.EffectApplier._apply_usual

        def spy(applier, *args):
            if not allowed:
                return None
            out = real(applier, *args)
            if out is None:
                self.declined += 1
            else:
                self.applied += 1
            return out

        monkeypatch.setattr(pg_effects.EffectApplier, "_apply_usual", spy)


def _state(bucket, db) -> dict:
    """Everything a flush may change, without the cas values and arrival times the clock gives."""
    ref = bucket.ref
    return {
        "docs": db.read(
            "SELECT key, vb, seqno, deleted, doc, expiry, flags, xattrs FROM bucket_docs WHERE bucket = %s "
            "ORDER BY key",
            (ref.id,),
        ),
        "log": db.read(
            "SELECT vb, seqno, key, op, doc, origin, expiry, flags, xattrs FROM bucket_log WHERE bucket = %s "
            "ORDER BY vb, seqno",
            (ref.id,),
        ),
        "high": bucket.high_seqnos(),
        "marks": bucket.effect_marks(FUNCTION),
    }


_write = st.builds(
    lambda key, delete, n, expiry: Write(
        key, OP_DELETE if delete else OP_UPDATE, None if delete else encode_document({"n": n}), expiry
    ),
    st.sampled_from(KEYS),
    st.sampled_from([False, False, False, True]),  # a delete now and then
    st.integers(0, 9),
    st.sampled_from([0, 0, 4_000_000_000]),
)
_step = st.one_of(
    # a flush: groups of (source vb, epoch, how far back its seqnos start, its writes)
    st.tuples(
        st.just("flush"),
        st.lists(
            st.tuples(
                st.sampled_from(SOURCE_VBS),
                st.integers(1, 3),
                st.sampled_from([0, 0, 0, 1, -1, -2]),
                st.lists(_write, max_size=3),
            ),
            min_size=1,
            max_size=3,
        ),
    ),
    st.tuples(st.just("fence"), st.sampled_from(SOURCE_VBS), st.integers(1, 3)),
    st.tuples(st.just("xattrs"), st.sampled_from(KEYS)),
    st.tuples(st.just("write"), st.lists(_write, min_size=1, max_size=4)),
)


def _run(bucket, steps) -> list:
    """Apply the steps; the answers of the flushes."""
    answers = []
    seqno = dict.fromkeys(SOURCE_VBS, 0)
    for step in steps:
        if step[0] == "fence":
            bucket.fence(FUNCTION, {step[1]: step[2]})
        elif step[0] == "xattrs":  # a document with extended attributes, which updates keep
            bucket.write([Write(step[1], OP_UPDATE, encode_document({"x": 1}), xattrs=X.encode({"m": 1}))])
        elif step[0] == "write":  # a batch of the bucket's own writes: (vb, seqno) or None each
            answers.append(bucket.write(step[1]))
        else:
            groups = []
            for vb, epoch, back, writes in step[1]:
                start = max(0, seqno[vb] + back)  # back < 0: a replay of seqnos applied already
                group = EffectGroup(vb, epoch, [(start + 1 + i, w) for i, w in enumerate(writes)])
                seqno[vb] = max(seqno[vb], start + len(writes))
                groups.append(group)
            result = bucket.apply_effects(FUNCTION, groups, origin="fn")
            answers.append(
                (result.applied, result.duplicates, sorted(result.fenced_vbs), result.fenced_writes)
            )
    return answers


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=st.lists(_step, min_size=1, max_size=8))
def test_the_servers_flush_leaves_what_the_statements_leave(request, monkeypatch, steps):
    db = request.getfixturevalue("shared_db")
    tag = uuid.uuid4().hex[:8]
    with pg_buckets.create_bucket(db, f"f{tag}") as fast, pg_buckets.create_bucket(db, f"s{tag}") as slow:
        fast_db = slow_db = db
        with monkeypatch.context() as m:
            _Counting(m, allowed=True)
            fast_answers = _run(fast, steps)
        with monkeypatch.context() as m:
            _Counting(m, allowed=False)
            _writes_by_statements(m)
            slow_answers = _run(slow, steps)
        assert fast_answers == slow_answers
        assert _state(fast, fast_db) == _state(slow, slow_db)


def test_usual_flushes_go_through_the_function_and_others_back_to_the_statements(request, monkeypatch):
    counting = _Counting(monkeypatch, allowed=True)
    k = KEYS[0]
    with _bucket(request) as (bucket, db):
        bucket.fence(FUNCTION, {3: 2})
        assert (
            bucket.apply_effects(
                FUNCTION, [EffectGroup(3, 2, [(1, Write(k, OP_UPDATE, encode_document({"v": 0})))])]
            ).applied
            == 1
        )
        assert (counting.applied, counting.declined) == (1, 0)
        # a group of an older owner: the function declines, the statements reject it as fenced
        fenced = bucket.apply_effects(
            FUNCTION, [EffectGroup(3, 1, [(2, Write(k, OP_UPDATE, encode_document({"v": 1})))])]
        )
        assert (fenced.applied, fenced.fenced_vbs) == (0, {3})
        assert (counting.applied, counting.declined) == (1, 1)
        # a replay of seqno 1 beside a new seqno 2: the statements skip the one applied already
        replay = bucket.apply_effects(
            FUNCTION,
            [
                EffectGroup(
                    3,
                    2,
                    [
                        (1, Write(k, OP_UPDATE, encode_document({"v": 0}))),
                        (2, Write(k, OP_UPDATE, encode_document({"v": 2}))),
                    ],
                )
            ],
        )
        assert (replay.applied, replay.duplicates) == (1, 1)
        assert (counting.applied, counting.declined) == (1, 2)
        assert bucket.get(k) is not None and bucket.effect_marks(FUNCTION)[3] == (2, 2)
        # a delete is never the function's
        bucket.apply_effects(FUNCTION, [EffectGroup(3, 2, [(3, Write(k, OP_DELETE))])])
        assert (counting.applied, counting.declined) == (1, 2) and bucket.get(k) is None
        assert [m.seqno for m in bucket.read_vb(vbucket_of(k), 0, 10)] == [1, 2, 3]


def test_the_commit_token_is_there_exactly_when_the_function_applied_its_writes(request):
    from eventing.storage.postgres.effects import _APPLY_USUAL

    with _bucket(request) as (bucket, db):
        bucket.fence(FUNCTION, {3: 2})
        key = KEYS[1]
        vb = vbucket_of(key)
        doc = encode_document({"n": 1})

        def call(epoch: int, seqno: int) -> tuple[bool, bool]:
            token = uuid.uuid4()
            args = (token, bucket.ref.id, FUNCTION, "fn", 0, [3], [epoch], [seqno], [3], [epoch], [seqno])
            args += ([vb], [key], [doc], [0], [0], [seqno])
            with db.pool().connection() as conn:
                answer = conn.execute(_APPLY_USUAL.replace("%b", "%s"), args).fetchone()[0]
            kept = db.read("SELECT count(*) FROM eventing_commits WHERE token = %s", (token,))[0][0]
            return answer, kept == 1

        assert call(1, 1) == (False, False)  # fenced: nothing applied, no token
        assert bucket.get(key) is None
        assert call(2, 1) == (True, True)
        assert call(2, 1) == (False, False)  # applied already
        assert bucket.get(key) == {"n": 1}


def test_an_update_through_the_function_keeps_the_documents_extended_attributes(request, monkeypatch):
    counting = _Counting(monkeypatch, allowed=True)
    with _bucket(request) as (bucket, db):
        bucket.write([Write("held", OP_UPDATE, encode_document({"v": 0}), xattrs=X.encode({"m": 1}))])
        group = EffectGroup(
            3,
            1,
            [
                (1, Write("held", OP_UPDATE, encode_document({"v": 1}))),
                (2, Write("new", OP_UPDATE, encode_document({"v": 2}))),
            ],
        )
        assert bucket.apply_effects(FUNCTION, [group]).applied == 2
        assert counting.applied == 1
        assert X.decode(bucket.get_meta("held")["xattrs"]) == {"m": 1} and "xattrs" not in bucket.get_meta(
            "new"
        )
        assert bucket.get("held") == {"v": 1}
        logged = db.read(
            "SELECT key, xattrs FROM bucket_log WHERE bucket = %s AND key = 'held' ORDER BY seqno",
            (bucket.ref.id,),
        )
        assert [bytes(x) if x else None for _, x in logged] == [X.encode({"m": 1})] * 2


def test_plain_writes_go_through_the_function_and_a_lost_answer_is_found_again(request, monkeypatch):
    calls = []
    real = pg_writer.LogWriter._write_updates

    def spy(writer, *args):
        calls.append(len(args[0]))
        return real(writer, *args)

    monkeypatch.setattr(pg_writer.LogWriter, "_write_updates", spy)
    with _bucket(request) as (bucket, db):
        key = KEYS[2]
        placed = bucket.write([Write(key, OP_UPDATE, encode_document({"n": i})) for i in range(3)])
        vb = vbucket_of(key)
        assert placed == [(vb, 1), (vb, 2), (vb, 3)] and calls == [3]
        assert bucket.get(key) == {"n": 2}
        # a delete takes the statements
        assert bucket.write([Write(key, OP_DELETE)]) == [(vb, 4)] and calls == [3]
        # what a call whose answer was lost answers once its token says it committed: each write's seqno
        # found again from its cas
        bucket.write(
            [
                Write(key, OP_UPDATE, encode_document({"n": 5}), cas=111),
                Write("other", OP_UPDATE, b"\x80", cas=222),
            ]
        )
        writer = bucket._writer
        assert writer._placed([vb, vbucket_of("other")], [111, 222]) == [5, 1]
