"""Filters before the handler: the predicate language, its validation, and a filtered function end to end
on the in-process executor (exactly the matching mutations reach the handler, counters, checkpoints,
`verify`)."""

from __future__ import annotations

import pytest

from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.core import counters as counter_names
from eventing.core.definition import FunctionDefinition
from eventing.core.filters import FilterError, compile_filter
from eventing.core.mutation import OP_DELETE, OP_UPDATE, encode_document
from eventing.errors import ConfigError
from eventing.ops.verify import verify_function
from eventing.storage.factory import create_bucket, open_bucket
from eventing.storage.values import Write
from eventing.testing import LEDGER_HANDLER, deploy_function, ledger_definition
from eventing.workers.executor import InProcessExecutor
from metadata.factory import open_store


def row(key: str = "order::1", doc: object = None, *, op: int = OP_UPDATE, expiry: int = 0, flags: int = 0):
    """A log row in Mutation's field order."""
    raw = encode_document(doc) if doc is not None else None
    return (5, 9, key, op, 77, raw, None, expiry, flags, 0)


def matches(spec: dict, doc: object = None, **kw) -> bool:
    import msgpack

    return compile_filter(spec).matches(row(doc=doc, **kw), lambda raw: msgpack.unpackb(raw, raw=False))


DOC = {
    "type": "order",
    "total": 120,
    "price": 9.5,
    "paid": True,
    "note": None,
    "address": {"city": "Seoul", "zip": "04524"},
    "tags": ["a"],
}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"field": "type", "eq": "order"}, True),
        ({"field": "type", "eq": "refund"}, False),
        ({"field": "total", "eq": 120.0}, True),  # numbers compare as numbers
        ({"field": "paid", "eq": 1}, False),  # true is not 1
        ({"field": "total", "eq": True}, False),
        ({"field": "note", "eq": None}, True),
        ({"field": "missing", "eq": None}, False),  # missing is not null
        ({"field": "type", "ne": "refund"}, True),
        ({"field": "type", "ne": "order"}, False),
        ({"field": "missing", "ne": "x"}, True),
        ({"field": "total", "lt": 121}, True),
        ({"field": "total", "lt": 120}, False),
        ({"field": "total", "lte": 120}, True),
        ({"field": "total", "gt": 119.5}, True),
        ({"field": "total", "gt": 120}, False),
        ({"field": "total", "gte": 120}, True),
        ({"field": "total", "gte": "100"}, False),  # a number is not ordered against a string
        ({"field": "type", "gt": "apple"}, True),  # strings in their order
        ({"field": "paid", "gt": 0}, False),  # booleans have no order
        ({"field": "missing", "lt": 5}, False),
        ({"field": "type", "in": ["refund", "order"]}, True),
        ({"field": "type", "in": ["refund", 1]}, False),
        ({"field": "note", "exists": True}, True),
        ({"field": "missing", "exists": True}, False),
        ({"field": "missing", "exists": False}, True),
        ({"field": "address.city", "eq": "Seoul"}, True),  # nested fields with dots
        ({"field": "address.zip.x", "exists": True}, False),  # a path through a string
        ({"field": "tags.a", "exists": True}, False),
        ({"field": "doc.type", "eq": "order"}, True),
        ({"key_prefix": "order::"}, True),
        ({"key_prefix": "refund::"}, False),
        ({"field": "meta.id", "eq": "order::1"}, True),
        ({"field": "meta.expiration", "gt": 0}, False),
        ({"field": "meta.vb", "eq": 5}, True),
        ({"field": "meta.seq", "eq": 9}, True),
        ({"field": "meta.cas", "eq": 77}, True),
        ({"field": "meta.flags", "eq": 0}, True),
        (
            {
                "and": [
                    {"field": "type", "eq": "order"},
                    {"field": "total", "gte": 100},
                    {"key_prefix": "order::"},
                ]
            },
            True,
        ),
        ({"and": [{"field": "type", "eq": "order"}, {"field": "total", "gte": 500}]}, False),
        ({"or": [{"field": "type", "eq": "refund"}, {"field": "total", "gte": 100}]}, True),
        ({"or": [{"field": "type", "eq": "refund"}, {"key_prefix": "x"}]}, False),
        ({"not": {"field": "type", "eq": "refund"}}, True),
        (
            {
                "not": {
                    "and": [
                        {"key_prefix": "order::"},
                        {"or": [{"field": "paid", "eq": False}, {"field": "address.city", "eq": "Seoul"}]},
                    ]
                }
            },
            False,
        ),
    ],
)
def test_every_operator_on_an_update(spec, expected):
    assert matches(spec, DOC) is expected


def test_a_binary_document_fails_field_conditions_but_not_key_ones():
    assert matches({"field": "type", "exists": True}, b"\x00type") is False
    assert matches({"key_prefix": "order::"}, b"\x00type") is True


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"field": "type", "eq": "order"}, True),  # a document condition is unknown for a delete: it passes
        ({"not": {"field": "type", "eq": "order"}}, True),  # not unknown is unknown
        ({"key_prefix": "order::"}, True),
        ({"key_prefix": "refund::"}, False),  # key and meta conditions do filter deletes
        (
            {"and": [{"field": "type", "eq": "order"}, {"key_prefix": "refund::"}]},
            False,
        ),  # and with a false part
        (
            {"or": [{"field": "type", "eq": "order"}, {"key_prefix": "refund::"}]},
            True,
        ),  # or with an unknown part
        ({"and": [{"field": "type", "eq": "x"}, {"field": "meta.expiration", "eq": 0}]}, True),
        ({"not": {"field": "meta.expiration", "eq": 0}}, False),
        ({"field": "meta.expiration", "exists": True}, True),
    ],
)
def test_deletes_are_decided_by_key_and_meta_only(spec, expected):
    assert matches(spec, op=OP_DELETE) is expected


@pytest.mark.parametrize(
    ("spec", "flag"),
    [
        ({"field": "type", "eq": "order"}, True),
        ({"not": {"or": [{"field": "a.b", "exists": False}, {"field": "doc.meta.x", "in": [1, "y"]}]}}, True),
        ({"and": [{"field": "type", "eq": "order"}, {"not": {"field": "total", "lt": 5}}]}, True),
        ({"key_prefix": "order::"}, False),
        (
            {"or": [{"field": "type", "eq": "order"}, {"key_prefix": "refund::"}]},
            False,
        ),  # passes all, asked anyway
        ({"and": [{"field": "type", "eq": "x"}, {"field": "meta.expiration", "eq": 0}]}, False),
        ({"not": {"field": "meta.flags", "eq": 0}}, False),
    ],
)
def test_deletes_pass_without_asking_only_when_no_key_or_meta_condition_could_fail_one(spec, flag):
    compiled = compile_filter(spec)
    deletes = [
        row(key, op=op, expiry=expiry, flags=flags)
        for key in ("order::1", "refund::2", "x")
        for op in (OP_DELETE, 2)
        for expiry in (0, 9)
        for flags in (0, 3)
    ]
    assert compiled.deletes_pass is flag
    if flag:  # the worker takes every delete without asking delete()
        assert all(compiled.delete(r) for r in deletes)


def test_a_filter_without_document_conditions_never_decodes():
    compiled = compile_filter({"and": [{"key_prefix": "order::"}, {"field": "meta.flags", "eq": 0}]})
    assert not compiled.needs_doc

    def refuse(raw):
        raise AssertionError("decoded")

    assert compiled.matches(row(doc={"x": 1}), refuse) is True
    assert compiled.matches(row("refund::1", {"x": 1}), refuse) is False


def test_an_undecodable_document_matches_so_the_handler_path_dead_letters_it():
    bad = (5, 9, "order::1", OP_UPDATE, 77, b"\xc1", None, 0, 0, 0)
    assert compile_filter({"field": "type", "eq": "x"}).matches(bad, lambda raw: 1 / 0) is True


def test_the_byte_prefilter_takes_the_top_level_conjuncts():
    pre = compile_filter(
        {
            "and": [
                {"key_prefix": "o::"},
                {"field": "a.type", "eq": "order"},
                {"field": "n", "eq": 5},
                {"field": "s", "in": ["x", True]},
                {"or": [{"field": "z", "eq": "q"}]},
                {"not": {"key_prefix": "p"}},
            ]
        }
    ).prefilter
    assert pre.key_prefixes == ("o::",)
    # "a.type" = "order" as msgpack: the name then the value; a number (several encodings) gives no needle
    assert pre.needles == ((b"\xa4type\xa5order",), (b"\xa1s\xa1x", b"\xa1s\xc3"))
    assert not compile_filter({"or": [{"key_prefix": "a"}, {"key_prefix": "b"}]}).prefilter


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("type=order", 'filter is "type=order"; give an object'),
        ({}, "filter has keys none; use one of field"),
        ({"field": "type"}, "filter (field 'type') has no operator"),
        ({"field": "type", "eq": "a", "ne": "b"}, "filter (field 'type') has operator(s) eq, ne"),
        ({"field": "type", "like": "a"}, "operator(s) like; give exactly one of eq, ne"),
        ({"field": "", "eq": 1}, 'filter.field is ""'),
        ({"field": "a..b", "eq": 1}, 'filter.field is "a..b"'),
        (
            {"field": "meta.owner", "eq": 1},
            "filter.field 'meta.owner' is not a meta field; use one of meta.id",
        ),
        ({"field": "total", "gte": [1]}, "filter.gte is [1]; compare with a number or a string"),
        ({"field": "total", "lt": True}, "filter.lt is true"),
        ({"field": "t", "eq": {"a": 1}}, 'filter.eq is {"a": 1}; give a string, number, boolean or null'),
        ({"field": "t", "in": []}, "filter.in is []; give a non-empty list"),
        ({"field": "t", "in": "ab"}, 'filter.in is "ab"'),
        ({"field": "t", "exists": 1}, "filter.exists is 1; give true or false"),
        ({"key_prefix": ""}, 'filter.key_prefix is ""; give a non-empty string'),
        ({"and": []}, "filter.and is []; give a non-empty list of filters"),
        ({"or": [{"key_prefix": "a"}, {"field": "x", "gt": None}]}, "filter.or[1].gt is null"),
        ({"and": [{"not": {"nor": []}}]}, "filter.and[0].not has keys nor"),
        ({"key_prefix": "a", "and": []}, "filter has keys and, key_prefix"),
    ],
)
def test_a_bad_filter_is_refused_naming_the_bad_part(spec, named):
    with pytest.raises(FilterError, match=None) as info:
        compile_filter(spec)
    assert named in str(info.value)
    assert "\n" not in str(info.value)


def test_a_definition_with_a_bad_filter_is_refused_at_save_naming_the_function():
    with pytest.raises(ConfigError) as info:
        FunctionDefinition.from_dict(
            {
                "name": "fn",
                "source_bucket": "src",
                "filter": {"and": [{"field": "total", "gte": "x"}, {"field": "t"}]},
            }
        )
    assert str(info.value).startswith("function 'fn': filter.and[1] (field 't') has no operator")
    good = {"field": "total", "gte": 100}
    defn = FunctionDefinition.from_dict({"name": "fn", "source_bucket": "src", "filter": good})
    assert defn.to_dict()["filter"] == good
    assert "filter" not in FunctionDefinition.from_dict({"name": "fn", "source_bucket": "src"}).to_dict()


# -- end to end, in-process ------------------------------------------------------------------------------


def load_orders(data_dir: str) -> tuple[list[Write], set[tuple[str, int]]]:
    """Updates and deletes of orders and refunds; returns the writes and the (key, total) of the updates a
    filter `total >= 100 and key_prefix order::` matches."""
    source = create_bucket(data_dir, "src")
    writes: list[Write] = []
    for i in range(200):
        key = f"{'order' if i % 3 else 'refund'}::{i % 50}"
        if i % 11 == 10:
            writes.append(Write(key, OP_DELETE))
        else:
            writes.append(Write(key, OP_UPDATE, encode_document({"total": (i * 37) % 200, "rev": i})))
    source.write(writes)
    source.close()
    return writes, set()


FILTER = {"and": [{"key_prefix": "order::"}, {"field": "total", "gte": 100}]}


def test_only_matching_mutations_reach_the_handler_in_order_and_verify_accounts_for_the_rest(data_dir):
    load_orders(data_dir)
    defn = ledger_definition("fn_f", "src", "ledger", workers=2, filter=FILTER)
    deploy_function(data_dir, defn, LEDGER_HANDLER)
    EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()

    source = open_bucket(data_dir, "src")
    log = [m for batch in source.scan_log() for m in batch]
    compiled = compile_filter(FILTER)
    import msgpack

    expected = {
        (m.key, m.seqno) for m in log if compiled.matches(m, lambda raw: msgpack.unpackb(raw, raw=False))
    }
    updates = {(m.key, m.seqno) for m in log if m.op == OP_UPDATE}
    deletes = {(m.key, m.seqno) for m in log if m.op == OP_DELETE}
    assert expected & deletes == {
        (m.key, m.seqno) for m in log if m.op == OP_DELETE and m.key.startswith("order::")
    }
    ledger = open_bucket(data_dir, "ledger")
    effects = {k for k in ledger.keys("e|fn_f|")}
    # the ledger handler writes an effect for every on_update and on_delete it gets
    handled = {(k.split("|")[2], int(k.split("|")[3])) for k in effects}
    assert handled == expected
    assert 0 < len(expected & updates) < len(updates)
    # per document, in seqno order
    for key in {k for k, _ in expected}:
        history = ledger.get(f"h|fn_f|{key}")
        assert history["seqs"] == sorted(s for k, s in expected if k == key)

    store = open_store(data_dir)
    counters = store.counters("fn_f")
    checkpoints = store.checkpoints("fn_f")
    store.close()
    assert counters[counter_names.FILTERED] == len(log) - len(expected)
    assert counters[counter_names.MUTATIONS_SEEN] == len(log)
    highs = source.high_seqnos()
    assert all(cp.seqno == highs[vb] for vb, cp in checkpoints.items())
    report = verify_function(data_dir, "fn_f")
    assert report.ok, report.summary()
    assert report.filtered == len(log) - len(expected)
    assert report.accounted == report.source_mutations == len(log)
    assert "not matching the function's filter" in report.summary()


def test_a_filtered_function_without_the_byte_check_gives_the_same_calls(data_dir):
    """previous_version runs the filter one mutation at a time in _handle, with no query-side check."""
    load_orders(data_dir)
    handler = "calls = []\ndef on_update(doc, meta):\n    calls.append(meta.seq)\n"
    for name, extra in (("fn_fast", {}), ("fn_slow", {"previous_version": True})):
        defn = FunctionDefinition.from_dict(
            {
                "name": name,
                "source_bucket": "src",
                "filter": {"field": "total", "lt": 20},
                **extra,
                "bindings": [{"alias": "out", "bucket": f"out_{name}", "access": "rw"}],
            }
        )
        create_bucket(data_dir, f"out_{name}")
        deploy_function(
            data_dir, defn, handler.replace("calls.append(meta.seq)", "out[meta.id + str(meta.seq)] = doc")
        )
    EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    fast, slow = open_bucket(data_dir, "out_fn_fast"), open_bucket(data_dir, "out_fn_slow")
    assert fast.keys() == slow.keys() and len(fast.keys()) > 0
    assert all(doc["total"] < 20 for _, doc, _ in fast.scan())
    store = open_store(data_dir)
    assert (
        store.counters("fn_fast")[counter_names.FILTERED]
        == store.counters("fn_slow")[counter_names.FILTERED]
        > 0
    )
    store.close()


def test_a_filter_is_kept_by_save_and_export(data_dir):
    create_bucket(data_dir, "src")
    defn = FunctionDefinition.from_dict({"name": "fn", "source_bucket": "src", "filter": FILTER})
    lifecycle.save_function(data_dir, defn, "def on_update(doc, meta):\n    pass\n")
    store = open_store(data_dir)
    assert store.get_function("fn").definition["filter"] == FILTER
    store.close()


def test_the_debugger_shows_a_mutation_the_filter_rules_out(data_dir):
    from eventing.ops.debugger import DebugSession

    source = create_bucket(data_dir, "src")
    source.write([Write("refund::1", OP_UPDATE, encode_document({"total": 500}))])
    source.close()
    defn = FunctionDefinition.from_dict({"name": "fn_dbg", "source_bucket": "src", "filter": FILTER})
    deploy_function(data_dir, defn, "def on_update(doc, meta):\n    raise RuntimeError('called')\n")
    events: list[dict] = []
    outcome = DebugSession(data_dir, "fn_dbg", on_event=events.append).run()
    assert outcome.status == "filtered" and outcome.ok
    assert {"event": "call", "kind": None, "doc": None, "meta": None, "filtered": True} in events


COUNT_CALLS = """
def on_update(doc, meta):
    pass
"""


@pytest.mark.parametrize("vip_every, min_scanned, max_scanned", [(10, 600, 1600), (1, 200, 200)])
def test_a_batch_scans_past_batch_size_when_the_filter_rules_most_out_and_hands_the_handler_about_batch_size(
    data_dir, vip_every, min_scanned, max_scanned
):
    from eventing.workers.worker import WorkerCore, WorkerSpec
    from sharding import NUM_VBUCKETS

    source = create_bucket(data_dir, "src")
    source.write(
        [
            Write(f"k{i}", OP_UPDATE, encode_document({"segment": "vip" if i % vip_every == 0 else "std"}))
            for i in range(10_000)
        ]
    )
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_b",
            "source_bucket": "src",
            "batch_size": 200,
            "filter": {"field": "segment", "eq": "vip"},
        }
    )
    deploy_function(data_dir, defn, COUNT_CALLS)
    core = WorkerCore(
        WorkerSpec(
            data_dir,
            "fn_b",
            open_store(data_dir).get_function("fn_b").generation,
            "n/w0",
            tuple(range(NUM_VBUCKETS)),
        )
    )
    try:
        core.step(200)  # the first batch learns how many entries the query keeps
        calls = core.counters[counter_names.handler_outcome("on_update", "success")]
        scanned = core.step(200).handled  # one batch (an explicit budget)
        called = core.counters[counter_names.handler_outcome("on_update", "success")] - calls
        assert min_scanned <= scanned <= max_scanned
        assert 0 < called <= 200 * 1.2  # about batch_size rows reach Python and the handler
    finally:
        core.close()
