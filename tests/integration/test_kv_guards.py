"""The KV port's guards, with a raw memcached client and the real `couchbase` SDK: a connection that has not
signed in may send small packets only; a client locked for others' wrong guesses still signs in with the
right password over SCRAM (the SDK's mechanism); a user removed loses its open connections."""

from __future__ import annotations

import socket
import struct
import time
from datetime import timedelta

import pytest

from eventing.http.auth import ServerConfig
from eventing.http.server import start_in_thread
from eventing.kv import protocol as p
from eventing.kv.server import PRE_AUTH_MAX_BODY, start_kv_server
from eventing.security.users import hash_password
from eventing.storage.factory import create_bucket
from eventing.testing.postgres import free_port
from metadata.factory import open_store

pytestmark = pytest.mark.integration

PASSWORD = "kv-guard-password-1"


@pytest.fixture
def kv(data_dir):
    create_bucket(data_dir, "shop").close()
    with open_store(data_dir) as store:
        store.put_user("app", hash_password(PASSWORD), ["data_reader[shop.*.*]", "data_writer[shop.*.*]"])
        store.put_user("temp", hash_password(PASSWORD), ["data_reader[shop.*.*]"])
    config = ServerConfig(data_dir, port=free_port())
    http = start_in_thread(config)  # the cluster map the SDK reads names it, as `eventing serve` runs both
    server = start_kv_server(config, free_port())
    yield {"data_dir": data_dir, "port": server.node.kv_port}
    server.stop()
    http.should_exit = True


def frame(opcode: int, key: bytes = b"", value: bytes = b"", *, length: int | None = None) -> bytes:
    body = len(key) + len(value) if length is None else length
    return struct.pack(">BBHBBHIIQ", 0x80, opcode, len(key), 0, 0, 0, body, 7, 0) + key + value


def answer(sock: socket.socket) -> tuple[int, bytes] | None:
    """(status, body) of the next response, or None when the server closed the connection."""
    header = b""
    while len(header) < p.HEADER_SIZE:
        chunk = sock.recv(p.HEADER_SIZE - len(header))
        if not chunk:
            return None
        header += chunk
    length = struct.unpack(">I", header[8:12])[0]
    body = b""
    while len(body) < length:
        body += sock.recv(length - len(body))
    return struct.unpack(">H", header[6:8])[0], body


def plain(sock: socket.socket, user: str, password: str) -> int | None:
    sock.sendall(frame(p.SASL_AUTH, b"PLAIN", b"\0" + user.encode() + b"\0" + password.encode()))
    got = answer(sock)
    return None if got is None else got[0]


def connect(kv) -> socket.socket:
    return socket.create_connection(("127.0.0.1", kv["port"]), timeout=10)


def test_a_connection_not_signed_in_may_not_send_a_large_packet(kv):
    with connect(kv) as sock:
        sock.sendall(frame(p.SASL_AUTH, b"PLAIN", length=PRE_AUTH_MAX_BODY + 1))
        assert answer(sock) is None  # closed before its body was read
    with connect(kv) as sock:  # signed in, the same packet is only a malformed one
        assert plain(sock, "app", PASSWORD) == p.SUCCESS
        sock.sendall(frame(p.NOOP))
        assert answer(sock) == (p.SUCCESS, b"")


def test_a_client_locked_by_wrong_guesses_still_signs_in_with_the_right_password(kv):
    from couchbase.auth import PasswordAuthenticator
    from couchbase.cluster import Cluster
    from couchbase.options import ClusterOptions, ClusterTimeoutOptions

    with connect(kv) as sock:
        for i in range(6):  # names that do not exist: the client's address is locked
            assert plain(sock, f"ghost{i}", "wrong") == p.AUTH_ERROR
    timeouts = ClusterTimeoutOptions(kv_timeout=timedelta(seconds=10), connect_timeout=timedelta(seconds=10))
    cluster = Cluster(
        f"couchbase://127.0.0.1:{kv['port']}",
        ClusterOptions(PasswordAuthenticator("app", PASSWORD), timeout_options=timeouts),
    )
    try:
        cluster.wait_until_ready(timedelta(seconds=20))  # SCRAM-SHA512, from the locked address
        shop = cluster.bucket("shop").default_collection()
        shop.upsert("k", {"n": 1})
        assert shop.get("k").content_as[dict] == {"n": 1}
    finally:
        cluster.close()


def test_a_removed_user_loses_its_open_connection(kv):
    with connect(kv) as sock:
        assert plain(sock, "temp", PASSWORD) == p.SUCCESS
        sock.sendall(frame(p.NOOP))
        assert answer(sock) == (p.SUCCESS, b"")
        with open_store(kv["data_dir"]) as store:
            store.delete_user("temp")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            sock.sendall(frame(p.NOOP))
            if answer(sock) is None:
                break  # closed: the user is gone
            time.sleep(0.5)
        else:
            pytest.fail("the removed user's connection stayed open")
