"""Runs the HTTP application with uvicorn: in the foreground (`eventing serve`) or on a thread beside a
running service (`eventing run --serve PORT`)."""

from __future__ import annotations

import socket
import threading
import weakref

import uvicorn

from eventing.errors import ConfigError
from eventing.http.app import build_app
from eventing.http.auth import ServerConfig


def check_port(host: str, port: int) -> None:
    """A clear error now rather than uvicorn's log line and exit code 3 once serving starts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {host}:{port} ({exc.strerror}); pick another port with --port, or stop "
                "what uses it"
            ) from None


def make_server(config: ServerConfig) -> uvicorn.Server:
    from eventing.kv.server import register_node

    config.check()
    check_port(config.host, config.port)
    register_node(config, None)  # the /pools documents name this server's port (eventing.http.routes.pools)
    app = build_app(config)
    # No proxy headers: a client cannot claim another address; access logs off (the API shows user data).
    return uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level="warning",
            access_log=False,
            proxy_headers=False,
            server_header=False,
            lifespan="off",
        )
    )


def serve(config: ServerConfig) -> None:
    make_server(config).run()


def start_in_thread(config: ServerConfig) -> uvicorn.Server:
    """Start serving on a daemon thread; returns once the port is bound. `server.should_exit = True` stops
    it."""
    server = make_server(config)
    thread = threading.Thread(target=server.run, name="eventing-http", daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        thread.join(0.05)
    if not server.started:
        raise OSError(f"the HTTP server could not listen on {config.host}:{config.port}")
    _THREADS[server] = thread
    return server


_THREADS: weakref.WeakKeyDictionary[uvicorn.Server, threading.Thread] = weakref.WeakKeyDictionary()
STOP_TIMEOUT_S = 10.0


def stop_in_thread(server: uvicorn.Server, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Stop a server start_in_thread started and wait for its thread: a process that exits while the
    server still closes its connections and the state it opened tears them down under it."""
    server.should_exit = True
    thread = _THREADS.pop(server, None)
    if thread is not None:
        thread.join(timeout_s)
