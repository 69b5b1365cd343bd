"""Runs the HTTP application with uvicorn: in the foreground (`eventing serve`) or on a thread beside a
running service (`eventing run --serve PORT`)."""

from __future__ import annotations

import threading

import uvicorn

from eventing.http.app import build_app
from eventing.http.auth import ServerConfig


def make_server(config: ServerConfig) -> uvicorn.Server:
    config.check()
    app = build_app(config)
    # No proxy headers: a client cannot claim another address; access logs off (the API shows user data).
    return uvicorn.Server(uvicorn.Config(
        app, host=config.host, port=config.port, log_level="warning", access_log=False,
        proxy_headers=False, server_header=False, lifespan="off",
    ))


def serve(config: ServerConfig) -> None:
    make_server(config).run()


def start_in_thread(config: ServerConfig) -> uvicorn.Server:
    """Start serving on a daemon thread; returns once the port is bound. `server.should_exit = True` stops it."""
    server = make_server(config)
    thread = threading.Thread(target=server.run, name="eventing-http", daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        thread.join(0.05)
    if not server.started:
        raise OSError(f"the HTTP server could not listen on {config.host}:{config.port}")
    return server
