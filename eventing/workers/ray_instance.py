"""A Ray instance kept running for one data directory (`eventing ray start`), which `eventing run` joins
instead of starting its own: joining takes ~0.1 s, starting ~2.5 s, often most of a short run.

The instance is ``ray start --head --block`` in a session of its own, started with what the workers need
(this project on PYTHONPATH, as a run's own instance has) and a private temp folder, so ``ray.init()``
elsewhere on the machine never finds it by accident. ``<data-dir>/ray-instance.json`` records its address,
pid and temp folder; ``eventing ray stop`` ends exactly its processes, by pid (every process whose arguments
name its temp folder, and everything below its ``ray start``), never other Ray instances of the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from eventing.errors import EventingError

STATE_FILE = "ray-instance.json"
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RayInstance:
    address: str  # "127.0.0.1:PORT", what `eventing run` joins
    pid: int  # the `ray start --block` process
    temp_dir: str
    num_cpus: int
    started_at: float


def state_path(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / STATE_FILE


def running(data_dir: str | os.PathLike[str]) -> RayInstance | None:
    """The data directory's instance if it is up (its process alive and its head answering), else None."""
    try:
        instance = RayInstance(**json.loads(state_path(data_dir).read_text()))
    except (OSError, ValueError, TypeError):
        return None
    if not _alive(instance.pid) or not _answers(instance.address):
        return None
    return instance


def start(data_dir: str | os.PathLike[str], *, num_cpus: int | None = None, workers: int = 4) -> RayInstance:
    """Start the data directory's instance, or return the one already up, with `workers` worker processes
    waiting in its pool (eventing.workers.executor.PooledWorkerHost): runs adopt them instead of starting
    processes, and more join the pool when a run needs them."""
    found = running(data_dir)
    if found is not None:
        return found
    from eventing.workers.ray_session import light_worker_env

    root = str(Path(__file__).resolve().parents[2])  # the folder holding eventing/, metadata/, sharding/
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        **light_worker_env(),
    }
    cpus = num_cpus or os.cpu_count() or 2
    temp_dir = tempfile.mkdtemp(prefix="eventing-ray-", dir="/tmp")  # Ray's socket paths stay short
    port = free_port()
    ray_cli = str(Path(sys.executable).with_name("ray"))
    args = [
        ray_cli,
        "start",
        "--head",
        f"--port={port}",
        f"--num-cpus={cpus}",
        f"--temp-dir={temp_dir}",
        "--include-dashboard=false",
        "--disable-usage-stats",
        "--block",
    ]
    log_path = Path(temp_dir) / "ray-start.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    instance = RayInstance(f"127.0.0.1:{port}", process.pid, temp_dir, cpus, time.time())
    deadline = time.monotonic() + START_TIMEOUT_S
    while "block forever" not in log_path.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            text = log_path.read_text(errors="replace").strip().splitlines()
            _end(instance)
            raise EventingError(
                f"`ray start` did not bring up a Ray instance ({text[-1] if text else 'no output'}); "
                "see `ray start --help`, or run without `eventing ray start` (each run starts its own)"
            )
        time.sleep(0.1)
    if workers > 0:
        from eventing.workers.ray_session import fill_pool

        try:
            fill_pool(instance.address, workers)
        except Exception as exc:  # noqa: BLE001 - an instance that cannot host workers is no use: end it
            _end(instance)
            raise EventingError(
                f"the new Ray instance could not start worker processes ({exc}); see `ray start --help`"
            ) from None
    state_path(data_dir).write_text(json.dumps(asdict(instance)))
    return instance


def stop(data_dir: str | os.PathLike[str]) -> RayInstance | None:
    """End the data directory's instance (every one of its processes, by pid); None if none was recorded."""
    try:
        instance = RayInstance(**json.loads(state_path(data_dir).read_text()))
    except (OSError, ValueError, TypeError):
        return None
    _end(instance)
    state_path(data_dir).unlink(missing_ok=True)
    return instance


def _end(instance: RayInstance) -> None:
    for _ in range(3):
        pids = _processes(instance)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.3)
    shutil.rmtree(instance.temp_dir, ignore_errors=True)


def _processes(instance: RayInstance) -> set[int]:
    """Its `ray start`, everything below it, and any process whose arguments name its temp folder (workers
    whose raylet died first), with everything below those."""
    roots = {pid for pid in all_pids() if instance.temp_dir in cmdline(pid)}
    if _alive(instance.pid):
        roots.add(instance.pid)
    pids = set(roots)
    for root in roots:
        pids |= descendants(root)
    pids.discard(os.getpid())
    return pids


# -- processes (also used by eventing.testing.cluster) --------------------------------------------------


def all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def descendants(root: int) -> set[int]:
    """Every process below `root` (children, their children, ...), by /proc."""
    children: dict[int, list[int]] = {}
    for pid in all_pids():
        children.setdefault(parent(pid), []).append(pid)
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _answers(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return True
    except (OSError, ValueError):
        return False
