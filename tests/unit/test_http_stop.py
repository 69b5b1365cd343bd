"""A server started beside a service (`eventing run --serve`) is stopped and waited for: its thread has
ended and its port is free when stop_in_thread returns, so the process never exits under it."""

from __future__ import annotations

import socket
import threading

from eventing.http.auth import ServerConfig
from eventing.http.server import start_in_thread, stop_in_thread
from eventing.storage.factory import create_bucket
from eventing.testing.postgres import free_port


def test_stop_in_thread_returns_once_the_server_thread_has_ended(data_dir):
    create_bucket(data_dir, "src").close()
    port = free_port()
    before = set(threading.enumerate())
    server = start_in_thread(ServerConfig(data_dir, port=port))
    (thread,) = [t for t in threading.enumerate() if t.name == "eventing-http" and t not in before]

    stop_in_thread(server)

    assert not thread.is_alive()
    with socket.create_server(("127.0.0.1", port)):
        pass  # the port was let go
