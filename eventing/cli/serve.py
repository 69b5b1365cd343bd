"""`eventing serve`: the REST API, Prometheus metrics and the web console; and `eventing run --serve PORT`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from eventing.cli.common import state_of
from eventing.cli.output import emit_json


def _config(args: argparse.Namespace, port: int) -> Any:
    from eventing.http.auth import ServerConfig

    return ServerConfig.from_env(
        state_of(args),
        host=args.host,
        port=port,
        admin_token=args.admin_token,
        read_token=args.read_token,
        admin_token_file=args.admin_token_file,
        read_token_file=args.read_token_file,
        max_body_bytes=args.max_body,
        cors_origins=tuple(args.cors_origin or ()),
        idempotency_retention_s=_retention(args.idempotency_retention),
    )


def _retention(value: str) -> float:
    from eventing.core.durations import DurationError, parse_duration
    from eventing.errors import ConfigError

    try:
        seconds = parse_duration(value, field="--idempotency-retention").total_seconds()
    except DurationError as exc:
        raise ConfigError(f"eventing serve {exc}") from None
    if seconds <= 0:
        raise ConfigError("--idempotency-retention must be positive, for example 24h")
    return seconds


def _credentials(config: Any) -> tuple[list[str], str | None]:
    """What a caller must present, as the server will check it (the tokens given, the stored users), and why
    no caller can be accepted now, if so: a metadata store that cannot be read, or one that had users and
    has none left (it never goes back to trusting every local caller)."""
    from eventing.security.users import store_had_users, stored_users

    needed = (["the admin token"] if config.admin_token else []) + (
        ["the read-only token"] if config.read_token else []
    )
    try:
        users = len(stored_users(config.state))
        had_users = users > 0 or store_had_users(config.state)
    except Exception as exc:  # noqa: BLE001 - a damaged or unreachable store: the guard answers 503 meanwhile
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        return needed, f"every request is answered 503 until the metadata store can be read: {reason}"
    if users:
        needed.append(f"the password of {users} user{'s' if users != 1 else ''}")
    elif had_users and not needed:
        return ["a user's password"], (
            "the metadata store had users and has none left, so no caller is accepted; add one with "
            "`eventing user add NAME --role admin` (a running server sees it within 2 s)"
        )
    return needed, None


def _banner(config: Any, suffix: str = "") -> str:
    """The line `serve` starts with (`suffix` at its end), and a warning line when no caller can be
    accepted."""
    needed, problem = _credentials(config)
    auth = (
        f"credentials required: {', '.join(needed)}"
        if needed
        else "no credentials: every local caller is trusted (loopback only)"
        if problem is None
        else "credentials: unknown until the metadata store can be read"
    )
    return (
        f"eventing console and API on http://{config.host}:{config.port}/ ({auth}); data "
        f"{config.state.shown}; API description at /api/v1/openapi.json, metrics at /metrics{suffix}"
        + (f"\nwarning: {problem}" if problem else "")
    )


def _start_kv(args: argparse.Namespace, config: Any) -> Any:
    """The KV port beside the HTTP server (eventing.kv): --kv-port, 11210 by default, 0 for none. The default
    port already taken (another server on this machine) leaves it off with one line; a port asked for is
    an error."""
    from eventing.errors import ConfigError
    from eventing.kv.server import DEFAULT_KV_PORT, register_node, start_kv_server

    port = DEFAULT_KV_PORT if args.kv_port is None else args.kv_port
    register_node(config, None)  # /pools names the HTTP port, and the KV port once it listens
    if port == 0:
        return None
    try:
        return start_kv_server(config, port)
    except OSError as exc:
        if args.kv_port is not None:
            raise ConfigError(
                f"cannot listen for the KV protocol on {config.host}:{port} ({exc.strerror or exc}); "
                "pick another port with --kv-port, or 0 for none"
            ) from None
        print(
            f"warning: the KV port {config.host}:{port} is taken ({exc.strerror or exc}); Couchbase SDKs "
            "cannot connect to this server: give --kv-port PORT",
            file=sys.stderr,
            flush=True,
        )
        return None


def cmd_serve(args: argparse.Namespace) -> int:
    from eventing.http.server import make_server

    config = _config(args, args.port)
    server = make_server(config)  # checks the bind rule and tokens first
    kv = _start_kv(args, config)
    kv_port = kv.node.kv_port if kv is not None else None
    if args.json:
        needed, problem = _credentials(config)
        emit_json(
            {
                "url": f"http://{config.host}:{config.port}/",
                "data_dir": config.state.shown,
                "secured": bool(needed) or problem is not None,
                "credentials": needed,
                "warning": problem,
                "kv_port": kv_port,
            }
        )
    else:
        print(
            _banner(
                config,
                f"; Couchbase SDKs at couchbase://{config.host} (KV port {kv_port})" if kv_port else "",
            ),
            flush=True,
        )
    try:
        server.run()
    finally:
        if kv is not None:
            kv.stop()
    return 0 if server.started else 1


def _with_serve(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run_with_server(args: argparse.Namespace) -> int:
        if not getattr(args, "serve", None):
            from eventing.http.auth import forget_token_environment

            forget_token_environment()  # no worker, sandbox or subprocess this run starts inherits a token
            return run(args)
        from eventing.http.server import start_in_thread, stop_in_thread

        config = _config(args, args.serve)
        server = start_in_thread(config)
        kv = None
        try:
            kv = _start_kv(args, config)
            print(
                _banner(config, f"; KV port {kv.node.kv_port}" if kv is not None else ""),
                file=sys.stderr,
                flush=True,
            )
            return run(args)
        finally:
            stop_in_thread(server)
            if kv is not None:
                kv.stop()

    return run_with_server


def _add_server_options(p: argparse.ArgumentParser, *, host: bool = True) -> None:
    from eventing.http.auth import (
        ADMIN_TOKEN_ENV,
        ADMIN_TOKEN_FILE_ENV,
        DEFAULT_HOST,
        DEFAULT_MAX_BODY,
        READ_TOKEN_ENV,
        READ_TOKEN_FILE_ENV,
    )

    if host:
        p.add_argument(
            "--host",
            default=DEFAULT_HOST,
            help=f"address to bind (default {DEFAULT_HOST}; any other needs --admin-token)",
        )
    p.add_argument(
        "--admin-token",
        default=None,
        help=f"token for state-changing requests (default ${ADMIN_TOKEN_ENV}); prefer a token file or the "
        "environment, since flags show in the process list",
    )
    p.add_argument(
        "--admin-token-file",
        default=None,
        metavar="PATH",
        help=f"read the admin token from this file (default ${ADMIN_TOKEN_FILE_ENV}); unlike a variable, "
        "it stays out of /proc/PID/environ. The token variables are removed from the environment once read",
    )
    p.add_argument("--read-token", default=None, help=f"read-only token (default ${READ_TOKEN_ENV})")
    p.add_argument(
        "--read-token-file",
        default=None,
        metavar="PATH",
        help=f"read the read-only token from this file (default ${READ_TOKEN_FILE_ENV})",
    )
    p.add_argument(
        "--max-body",
        type=int,
        default=DEFAULT_MAX_BODY,
        help=f"largest request body in bytes (default {DEFAULT_MAX_BODY}); larger ones get 413",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        help="allow browser pages of this origin to call the API (repeatable; default: none)",
    )
    p.add_argument(
        "--idempotency-retention",
        default="24h",
        metavar="DURATION",
        help="how long the Data API keeps the answer of a write sent with an Idempotency-Key, which a "
        "retry with the same key and body gets again (default 24h; docs/data-api.md)",
    )
    p.add_argument(
        "--kv-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve the KV (memcached binary) protocol of Couchbase's SDKs on this port (default 11210, "
        "left off with a warning when taken; 0 for none); see docs/couchbase-sdk.md",
    )


def register(sub: Any, add: Callable[..., argparse.ArgumentParser]) -> None:
    from eventing.http.auth import DEFAULT_PORT

    p = add(
        "serve", cmd_serve, "serve the REST API (Couchbase-shaped), Prometheus /metrics and the web console"
    )
    p.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}, as Couchbase Eventing)"
    )
    _add_server_options(p)
    run = sub.choices.get("run")
    if run is None:
        return
    run.add_argument(
        "--serve",
        type=int,
        metavar="PORT",
        default=None,
        help="also serve the API, metrics and console on this port while running",
    )
    run.add_argument("--host", default="127.0.0.1", help="with --serve: address to bind (default 127.0.0.1)")
    _add_server_options(run, host=False)
    run.set_defaults(func=_with_serve(run.get_default("func")))
