"""Write notifications (eventing.storage.wake): a committed write wakes the caught-up worker owning its
vBucket at once, and a write never depends on a service listening."""

from __future__ import annotations

import os
import socket
import time

import pytest

from eventing import Eventing, FunctionDefinition
from eventing.control import supervisor
from eventing.core.mutation import OP_UPDATE, encode_document
from eventing.storage import wake
from eventing.storage.bucket import LocalBucket
from eventing.storage.values import Write
from eventing.testing import wait_for
from sharding.vbucket import vbucket_of

COPY = "def on_update(doc, meta):\n    dst[meta.id] = doc\n"


def _copy_app(data_dir) -> Eventing:
    app = Eventing(data_dir, executor="in-process")
    app.create_bucket("src")
    app.create_bucket("dst")
    defn = FunctionDefinition.from_dict(
        {
            "name": "copy",
            "source_bucket": "src",
            "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
        }
    )
    app.deploy(defn, COPY)
    return app


def _idle(service, poll_s: float) -> bool:
    """Every worker of `copy` is up, caught up and not due to be stepped again for most of `poll_s`."""
    sup = service.supervisors.get("copy")
    if sup is None or not sup.slots:
        return False
    later = time.monotonic() + poll_s / 2
    return all(
        s.ready and s.caught_up and not s.inflight and s.next_step_at > later for s in sup.slots.values()
    )


def test_a_write_wakes_a_caught_up_worker_long_before_its_poll(tmp_path, monkeypatch):
    monkeypatch.delenv(wake.WAKE_ENV, raising=False)
    poll_s = 600.0
    monkeypatch.setattr(supervisor, "IDLE_POLL_S", poll_s)  # only a wake can step the worker in this test
    app = _copy_app(tmp_path / "data")
    running = app.run(until_caught_up=False)
    service = running._service
    try:
        wait_for(lambda: _idle(service, poll_s), "the worker is caught up and idle", timeout=30)
        assert wake.socket_path(tmp_path / "data").exists()
        written = time.monotonic()
        vb, _ = app.upsert("src", "a", {"x": 1})
        wait_for(lambda: app.bucket("dst").get("a") == {"x": 1}, "the effect of 'a'", timeout=30, every=0.005)
        took = time.monotonic() - written
        assert took < poll_s / 10
        wakes = [(bucket, vbs, woken) for at, bucket, vbs, woken in service.wake_log if at >= written]
        assert any(bucket == "src" and vb in vbs and woken >= 1 for bucket, vbs, woken in wakes), wakes
        assert service.wakes["src"] >= 1
        assert sum(s.wakes for s in service.supervisors["copy"].slots.values()) >= 1
    finally:
        running.stop()
    assert not running.wait(timeout=30).errors
    assert not wake.socket_path(tmp_path / "data").exists()  # the service removed its socket
    vb, _ = app.upsert("src", "b", {"x": 2})  # the service is gone: writes go on
    assert app.bucket("src").get("b") == {"x": 2}


def test_with_waking_off_the_poll_still_finds_writes(tmp_path, monkeypatch):
    monkeypatch.setenv(wake.WAKE_ENV, "0")
    app = _copy_app(tmp_path / "data")
    running = app.run(until_caught_up=False)
    service = running._service
    try:
        wait_for(
            lambda: _idle(service, supervisor.IDLE_POLL_S), "the worker is caught up and idle", timeout=30
        )
        assert service.waker is None and not wake.socket_path(tmp_path / "data").exists()
        app.upsert("src", "a", {"x": 1})
        wait_for(lambda: app.bucket("dst").get("a") == {"x": 1}, "the effect of 'a'", timeout=30)
        assert not service.wake_log
    finally:
        running.stop()
    assert not running.wait(timeout=30).errors


def _write(bucket: LocalBucket, key: str) -> tuple[int, int] | None:
    return bucket.write([Write(key, OP_UPDATE, encode_document({"k": key}))])[0]


def test_writes_succeed_without_a_socket_with_a_stale_one_and_with_a_full_queue(tmp_path):
    data = tmp_path / "data"
    bucket = LocalBucket.create(data, "b")
    path = wake.socket_path(data)
    assert not path.parent.exists()
    assert _write(bucket, "no-socket") is not None  # no service ever ran here

    path.parent.mkdir()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: a service that was killed
    assert _write(bucket, "stale") is not None

    path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(path))
    try:
        keys = [f"k{i}" for i in range(200)]  # never read: the queue fills, and writes go on
        for key in keys:
            assert _write(bucket, key) is not None
        first = wake.decode(listener.recv(4096))
        assert first == ("b", {vbucket_of(keys[0])})
    finally:
        listener.close()
    assert bucket.get("k199") == {"k": "k199"}
    bucket.close()


def test_a_listener_collects_what_writes_in_other_buckets_and_batches_name(tmp_path):
    data = tmp_path / ("d" * 80)  # longer than a socket address can hold with run/wake.sock
    assert len(str(wake.socket_path(data))) > 107
    a, b = LocalBucket.create(data, "a"), LocalBucket.create(data, "b")
    listener = wake.WakeListener(data)
    assert listener.start()
    try:
        _write(a, "x")
        b.write([Write(f"key{i}", OP_UPDATE, encode_document({})) for i in range(500)])  # one datagram
        expected = {"a": {vbucket_of("x")}, "b": {vbucket_of(f"key{i}") for i in range(500)}}
        got: dict[str, set[int]] = {}

        def collected() -> bool:
            for name, vbs in listener.take().items():
                got.setdefault(name, set()).update(vbs)
            return got == expected

        wait_for(collected, "both notifications arrive", timeout=10, every=0.01)
    finally:
        listener.close()
    assert not wake.socket_path(data).exists()
    _write(a, "after")  # nobody listens any more
    a.close()
    b.close()


@pytest.mark.parametrize("vbs", [set(), {0}, {1023, 5, 77}, set(range(1024))])
def test_a_notification_round_trips(vbs):
    assert wake.decode(wake.encode("bucket_1", vbs)) == ("bucket_1", vbs)


def test_garbage_is_not_a_notification():
    assert wake.decode(b"") is None
    assert wake.decode(b"name-without-separator") is None
    assert wake.decode(b"b\x00\x01") is None  # half a vBucket
    assert wake.decode(b"b\x01\x00\x00") is None  # not a kind this version sends
    assert os.environ.get(wake.WAKE_ENV, "1") != "0" or not wake.enabled()
