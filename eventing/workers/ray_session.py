"""Joining or starting Ray for this process (`init_ray`), what its workers inherit (the project's code,
forwarded settings, lighter worker processes), and filling a kept instance's pool of worker processes."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eventing.core.names import PROJECT_PACKAGES
from eventing.errors import EventingError
from eventing.workers.hosting import POOL_NAMESPACE, POOL_PREFIX, PooledWorkerHost

FORWARDED_ENV = (
    "EVENTING_METADATA_URL",
    "EVENTING_COUCHBASE_USERNAME",
    "EVENTING_COUCHBASE_PASSWORD",
    "EVENTING_STORE_WAIT_S",
    "EVENTING_PG_POOL_SIZE",
    # A PostgreSQL store's credentials and TLS settings where libpq takes them from the environment: workers
    # on other nodes connect to the server themselves (docs/postgresql.md).
    "PGPASSWORD",
    "PGPASSFILE",
    "PGSSLMODE",
    "PGSSLROOTCERT",
    "EVENTING_REMOTE_READ_AHEAD",
)

# Across Ray nodes a reply larger than Ray's inline limit (100 KiB) goes through the object stores: the
# callee's node stores it, the caller's raylet pulls it in chunks. A data-service read ahead (~5 MB) then
# cost ~24 ms of CPU over the cluster's processes; sent inline in the gRPC reply, ~10 ms (and it arrives
# sooner). Replies above this limit still go through the object stores.
INLINE_LIMIT_ENV = "RAY_max_direct_call_object_size"
INLINE_REPLY_BYTES = 32 << 20


def init_ray(
    address: str | None = None,
    *,
    num_cpus: int | None = None,
    join_local: str | None = None,
    windows: bool = False,
) -> None:
    """Start a local Ray instance, or join the cluster at `address`, once per process. ``join_local``: the
    address of a Ray instance on this machine started by `eventing ray start` (eventing.workers.ray_instance),
    whose workers already have this project's environment. ``windows``: a windowed function will run, so a
    local instance's worker processes import numpy and pyarrow ahead (eventing.workers.ray_setup)."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Workers must import this project the way the driver does (an editable install or a checkout).
    root = str(Path(__file__).resolve().parents[2])  # the folder holding eventing/, metadata/, sharding/
    env = {"PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    # Workers on other machines must open the same metadata store as the driver.
    for name in FORWARDED_ENV:
        if os.environ.get(name):
            env[name] = os.environ[name]
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": True,
        "logging_level": "ERROR",
        "configure_logging": True,
    }
    if address:
        check_ray_address(address)
        kwargs["address"] = address
        # Code on every node: the project's packages travel with the job (Ray uploads them once, each node
        # unpacks them into its own session folder), so a node needs only Python, Ray and the dependencies.
        env.setdefault(INLINE_LIMIT_ENV, os.environ.get(INLINE_LIMIT_ENV, str(INLINE_REPLY_BYTES)))
        kwargs["runtime_env"] = {"env_vars": env, "py_modules": project_modules()}
    elif num_cpus is not None and not join_local:
        kwargs["num_cpus"] = num_cpus
    try:
        if join_local:
            ray.init(address=join_local, namespace=POOL_NAMESPACE, **kwargs)
        elif address:
            ray.init(**kwargs)
        else:
            # A local instance's workers inherit the environment its raylet starts with. A runtime_env
            # would do the same through Ray's runtime-env agent, at ~0.4 s more per worker start.
            # address="local": always a new instance of our own. Without it Ray joins the last cluster
            # `ray start` left on this machine (/tmp/ray/ray_current_cluster), whose workers run in
            # another directory with another environment: joining one takes --ray-address.
            with _environment({**env, **light_worker_env(windows=windows)}):
                ray.init(address="local", **kwargs)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        target = address or "a local Ray instance"
        raise EventingError(
            f"cannot start or join {target}: {exc}; check --ray-address or `ray status`"
        ) from None


def light_worker_env(*, windows: bool = False) -> dict[str, str]:
    """The environment that makes a local instance's worker processes ~40 MB lighter each
    (eventing.workers.ray_setup), or, with ``windows``, has them import numpy and pyarrow ahead; empty when
    EVENTING_RAY_LIGHT_WORKERS=0 or another set-up hook is set."""
    from eventing.workers.ray_setup import SETUP_HOOK, SETUP_HOOK_ENV, WINDOWS_ENV

    if os.environ.get("EVENTING_RAY_LIGHT_WORKERS") == "0" or os.environ.get(SETUP_HOOK_ENV):
        return {}
    return {SETUP_HOOK_ENV: SETUP_HOOK, **({WINDOWS_ENV: "1"} if windows else {})}


POOL_ADOPT_TIMEOUT_S = 5.0
ADDRESS_CHECK_TIMEOUT_S = 3.0


def project_modules() -> list[str]:
    """The folders of this project's packages, for Ray's ``runtime_env`` ``py_modules``."""
    root = Path(__file__).resolve().parents[2]
    return [str(root / name) for name in PROJECT_PACKAGES]


def check_ray_address(address: str, timeout: float = ADDRESS_CHECK_TIMEOUT_S) -> None:
    """Fail fast (one line, a few seconds) when nothing listens at a Ray address; ``ray.init`` itself
    would retry for a minute or more. ``auto`` and ``ray://`` addresses are left to Ray."""
    if address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise EventingError(
            f"--ray-address {address!r} is not HOST:PORT; give the head node's address, e.g. 127.0.0.1:6379 "
            "(printed by `ray start --head`)"
        )
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise EventingError(
            f"no Ray cluster answers at {address} ({exc.strerror or exc}); start one with "
            f"`ray start --head --port={port}` there, or fix --ray-address / $EVENTING_RAY_ADDRESS"
        ) from None


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def fill_pool(address: str, workers: int) -> int:
    """Start pooled worker processes on the kept instance at `address` until it has `workers` of them, each
    with the worker's modules imported; returns how many it has."""
    import ray

    init_ray(join_local=address)
    try:
        names = {n for n in ray.util.list_named_actors() if n.startswith(POOL_PREFIX)}
        cls = ray.remote(num_cpus=0, max_restarts=0)(PooledWorkerHost)
        started: list[Any] = []
        for i in range(workers * 2):
            if len(names) >= workers:
                break
            name = f"{POOL_PREFIX}{i}"
            if name not in names:
                names.add(name)
                started.append(cls.options(name=name, namespace=POOL_NAMESPACE, lifetime="detached").remote())
        ray.get([a.ready.remote() for a in started])
        return len(names)
    finally:
        ray.shutdown()
