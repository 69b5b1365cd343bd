"""A remote worker's read of the rows to come, kept back for the service to make as it calls the next step
(eventing.control.step_reads, eventing.storage.remote._RayClient.submit_ahead): the service's answer is
the data service's answer at that moment, the worker takes it without a round trip, and a read waited for
without it is sent to the data service as before."""

from __future__ import annotations

from eventing.control.step_reads import StepReads
from eventing.storage.remote import DataService, _RayClient
from eventing.storage.state import as_state
from eventing.testing import load_source
from sharding import vbucket_spans


def test_the_services_read_is_the_data_services_answer_as_it_is_made(data_dir):
    source = load_source(data_dir, 30, 300, seed=2)
    highs = source.high_seqnos()
    owned = list(range(0, 1024, 3))
    positions = [(vb, max(0, highs[vb] - 1)) for vb in owned]
    reads = StepReads(as_state(data_dir))
    service = DataService(data_dir)
    try:
        ident, answer = reads.answer((7, "read_changed", ("src", positions, 1000)))
        expected = service.do_read_changed("src", positions, 1000, vbucket_spans(owned))
        assert ident == 7 and answer == expected and answer[2]  # some vBuckets had a row to read
        # A write made after the worker asked is in the read made as the next step is called.
        vb, seqno = source.upsert("late", {"n": 1})
        assert vb in owned
        positions = [(v, highs[v]) for v in owned]
        _, answer = reads.answer((8, "read_changed", ("src", positions, 1000)))
        assert answer[1][vb] == seqno and answer[2] == [(vb, highs[vb], 1)]
        assert reads.answered == 2
        # Nothing to make here: none kept, or a read of another kind.
        assert reads.answer(None) is None and reads.answer((9, "read_many", ("src", [], 1))) is None
    finally:
        reads.close()
        service.close()


def _client(sent: list) -> _RayClient:
    client = _RayClient(actor=None)
    client.submit = lambda method, *args: sent.append((method, args)) or (lambda: ("sent", method))
    return client


def test_a_kept_back_read_is_taken_from_the_steps_answer_without_a_round_trip():
    sent: list = []
    client = _client(sent)
    wait = client.submit_ahead("read_changed", "src", [(1, 5)], 10)
    ident, method, args = client.take_deferred()
    assert (method, args) == ("read_changed", ("src", [(1, 5)], 10))
    assert client.take_deferred() is None  # taken once, by one step's report
    client.answer(ident, ("rows", "highs", "runs"))
    assert wait() == ("rows", "highs", "runs") and sent == []


def test_a_kept_back_read_waited_for_without_an_answer_is_sent_then():
    sent: list = []
    client = _client(sent)
    wait = client.submit_ahead("read_changed", "src", [(1, 5)], 10)
    assert wait() == ("sent", "read_changed")
    assert sent == [("read_changed", ("src", [(1, 5)], 10))]
    assert client.take_deferred() is None  # sent already: the report carries nothing


def test_an_answer_to_an_older_read_is_not_taken_for_a_newer_one():
    sent: list = []
    client = _client(sent)
    client.submit_ahead("read_changed", "src", [(1, 5)], 10)
    old_ident = client.take_deferred()[0]
    wait = client.submit_ahead("read_changed", "src", [(1, 9)], 10)
    client.answer(old_ident, "stale")
    assert wait() == ("sent", "read_changed") and len(sent) == 1
