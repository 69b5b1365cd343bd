"""A real multi-node Ray cluster on one machine, for tests and benchmarks: a head node, more nodes that
may be unable to see chosen folders (as on another machine), and ending exactly the processes it started.

    cluster = LocalRayCluster()
    address = cluster.start()                          # "127.0.0.1:PORT", the head (2 CPUs)
    node = cluster.add_node("n2", hidden=[data_dir])   # a node that sees an empty folder at data_dir
    node.node_id                                       # its Ray node id (for `eventing node add
                                                       # --ray-node-id`)
    cluster.kill_node(node)                            # kill -9 of its raylet (failover tests)
    cluster.stop_node(node)                            # every process of that node, by pid
    cluster.stop()                                     # every process of this cluster, by pid

A hidden node is ``ray start --address ... --block`` under ``unshare --mount --propagation private`` with an
empty tmpfs mounted over each hidden folder (needs root, as in CI: ``LocalRayCluster.can_hide()``). Every
process of the cluster carries its private temp folder in its arguments or descends from a ``ray start``
this object ran; ``stop`` ends those and nothing else (never ``ray stop``, which ends every Ray on the
machine).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from eventing.workers.ray_instance import all_pids as _all_pids
from eventing.workers.ray_instance import cmdline as _cmdline
from eventing.workers.ray_instance import descendants as _descendants
from eventing.workers.ray_instance import free_port as _free_port

NODE_START_TIMEOUT_S = 60.0
_NODE_ID_LINE = re.compile(r"\[[^\]]* I (\d+) \d+\] \(raylet\) .*Setting node ID node_id=([0-9a-f]+)")


@dataclass
class RayNode:
    """One node of a LocalRayCluster."""

    name: str  # also a custom resource of the node ({name: 100}), so tasks can be placed on it
    process: subprocess.Popen
    hidden: tuple[str, ...] = ()
    node_id: str = ""  # the raylet's Ray node id
    raylet_pid: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def pid(self) -> int:
        """The node's `ray start --block` process: every other process of the node descends from it."""
        return self.process.pid


class LocalRayCluster:
    def __init__(self, temp_dir: str | None = None, *, head_cpus: int = 2, env: dict[str, str] | None = None):
        # Ray's socket paths must stay under ~107 characters: a short folder under /tmp.
        self.temp_dir = temp_dir or tempfile.mkdtemp(prefix="rc-", dir="/tmp")
        self.head_cpus = head_cpus
        self.port = 0
        self.nodes: list[RayNode] = []
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
        self._ray = str(Path(sys.executable).with_name("ray"))

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @staticmethod
    def can_hide() -> bool:
        """Hidden nodes need root (mount) and `unshare`."""
        return os.geteuid() == 0 and shutil.which("unshare") is not None

    # -- starting -----------------------------------------------------------------------------------

    def start(self, port: int | None = None) -> str:
        """Start the head node; returns its address."""
        self.port = port or _free_port()
        args = [
            self._ray,
            "start",
            "--head",
            f"--port={self.port}",
            f"--num-cpus={self.head_cpus}",
            f"--temp-dir={self.temp_dir}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            "--resources",
            json.dumps({"head": 100}),
            "--block",
        ]
        self._launch("head", args, ())
        return self.address

    def add_node(
        self,
        name: str,
        *,
        hidden: list[str] | tuple[str, ...] = (),
        num_cpus: int = 1,
        python: str | None = None,
    ) -> RayNode:
        """Join a node with resource ``{name: 100}``; each folder in ``hidden`` looks empty to it. ``python``:
        the interpreter the node (and so its workers) runs, e.g. one of another environment."""
        ray_cli = (
            [self._ray]
            if python is None
            else [
                python,
                "-c",
                "import sys; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; sys.exit(main())",
            ]
        )
        args = [
            *ray_cli,
            "start",
            f"--address={self.address}",
            f"--num-cpus={num_cpus}",
            "--resources",
            json.dumps({name: 100}),
            f"--temp-dir={self.temp_dir}",
            "--disable-usage-stats",
            "--block",
        ]
        return self._launch(name, args, tuple(os.path.abspath(h) for h in hidden))

    def _launch(self, name: str, args: list[str], hidden: tuple[str, ...]) -> RayNode:
        log = open(Path(self.temp_dir) / f"node-{name}.log", "wb")  # noqa: SIM115 - the node's lifetime
        if hidden:
            if not self.can_hide():
                raise RuntimeError("hidden nodes need root and `unshare` (mount namespaces)")
            mounts = " && ".join(f"mount -t tmpfs none {_quote(h)}" for h in hidden)
            command = [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "bash",
                "-c",
                f"{mounts} && exec {' '.join(_quote(a) for a in args)}",
            ]
        else:
            command = args
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        node = RayNode(name, process, hidden)
        self.nodes.append(node)
        self._wait_for_raylet(node)
        return node

    def _wait_for_raylet(self, node: RayNode) -> None:
        deadline = time.monotonic() + NODE_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if node.process.poll() is not None:
                text = (Path(self.temp_dir) / f"node-{node.name}.log").read_text(errors="replace")
                raise RuntimeError(f"Ray node {node.name} exited at start:\n{text[-2000:]}")
            # `ray start --block` says it blocks once the node has registered with the head.
            started = "block forever" in (Path(self.temp_dir) / f"node-{node.name}.log").read_text(
                errors="replace"
            )
            raylets = [p for p in _descendants(node.pid) if "raylet/raylet" in _cmdline(p)] if started else []
            if raylets:
                node_id = self._node_id_of(raylets[0])
                if node_id:
                    node.raylet_pid, node.node_id = raylets[0], node_id
                    return
            time.sleep(0.2)
        raise RuntimeError(f"Ray node {node.name} did not start within {NODE_START_TIMEOUT_S:.0f}s")

    def _node_id_of(self, raylet_pid: int) -> str:
        for log in Path(self.temp_dir).glob("session_*/logs/raylet*.out"):
            try:
                text = log.read_text(errors="replace")
            except OSError:
                continue
            for found in _NODE_ID_LINE.finditer(text):
                if int(found.group(1)) == raylet_pid:
                    return found.group(2)
        return ""

    def node(self, name: str) -> RayNode:
        return next(n for n in self.nodes if n.name == name)

    # -- ending -------------------------------------------------------------------------------------

    def kill_node(self, node: RayNode) -> None:
        """kill -9 of the node's raylet (as a machine failure looks to Ray); its other processes follow."""
        _kill(node.raylet_pid)

    def stop_node(self, node: RayNode) -> None:
        """End every process of one node (its `ray start` and all below it), by pid."""
        for pid in {node.pid, *_descendants(node.pid)}:
            _kill(pid)
        try:
            node.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.nodes.remove(node)

    def processes(self) -> set[int]:
        """Pids of every live process of this cluster: descendants of its `ray start`s and anything whose
        arguments name its temp folder (workers a dead raylet left behind)."""
        pids: set[int] = set()
        for node in self.nodes:
            pids.add(node.pid)
            pids |= _descendants(node.pid)
        for pid in _all_pids():
            if self.temp_dir in _cmdline(pid):
                pids.add(pid)
        pids.discard(os.getpid())
        return pids

    def stop(self) -> None:
        """End every process this cluster started, by pid, and remove its temp folder."""
        for _ in range(3):
            pids = self.processes()
            if not pids:
                break
            for pid in pids:
                _kill(pid)
            time.sleep(0.3)
        for node in self.nodes:
            try:
                node.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.nodes.clear()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> LocalRayCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def environment_without(packages: list[str], directory: str) -> str:
    """A Python environment at ``directory`` holding every package of this one except ``packages`` (links to
    them, so it takes a second): a node started with its interpreter lacks exactly those packages.
    Returns the interpreter's path."""
    import site
    import venv

    venv.EnvBuilder(with_pip=False, symlinks=True).create(directory)
    own = Path(site.getsitepackages()[0])
    target = Path(directory) / own.relative_to(sys.prefix)
    target.mkdir(parents=True, exist_ok=True)
    skipped = tuple(p.lower().replace("-", "_") for p in packages)
    for entry in own.iterdir():
        if not entry.name.lower().replace("-", "_").startswith(skipped):
            (target / entry.name).symlink_to(entry)
    return str(Path(directory) / "bin" / "python")


class LocalSparkCluster:
    """A Spark standalone cluster on one machine: a master and one worker, the worker optionally unable to
    see chosen folders (same unshare + tmpfs trick). ``start()`` returns the ``spark://`` master URL;
    ``stop()`` ends exactly the processes it started (and their children), by pid."""

    def __init__(self, work_dir: str | None = None, *, worker_cores: int = 1, worker_memory: str = "1g"):
        import pyspark

        self.spark_home = str(Path(pyspark.__file__).parent)
        self.work_dir = work_dir or tempfile.mkdtemp(prefix="sc-", dir="/tmp")
        self.worker_cores, self.worker_memory = worker_cores, worker_memory
        self.port = 0
        self.processes: list[subprocess.Popen] = []
        self.env = {
            **os.environ,
            "SPARK_HOME": self.spark_home,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
        }

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def start(self, *, hidden: list[str] | tuple[str, ...] = (), timeout: float = 90.0) -> str:
        self.port = _free_port()
        spark_class = str(Path(self.spark_home) / "bin" / "spark-class")
        self._launch(
            "master",
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--webui-port",
                str(_free_port()),
            ],
            (),
        )
        _wait_port(self.port, timeout)
        self._launch(
            "worker",
            [
                spark_class,
                "org.apache.spark.deploy.worker.Worker",
                self.master_url,
                "--cores",
                str(self.worker_cores),
                "--memory",
                self.worker_memory,
                "--work-dir",
                self.work_dir,
                "--webui-port",
                str(_free_port()),
            ],
            tuple(os.path.abspath(h) for h in hidden),
        )
        deadline = time.monotonic() + timeout
        log = Path(self.work_dir) / "spark-worker.log"
        while "Successfully registered with master" not in log.read_text(errors="replace"):
            if time.monotonic() > deadline or self.processes[-1].poll() is not None:
                raise RuntimeError(
                    f"Spark worker did not register:\n{log.read_text(errors='replace')[-2000:]}"
                )
            time.sleep(0.3)
        return self.master_url

    def _launch(self, name: str, args: list[str], hidden: tuple[str, ...]) -> None:
        log = open(Path(self.work_dir) / f"spark-{name}.log", "wb")  # noqa: SIM115 - the process's lifetime
        if hidden:
            mounts = " && ".join(f"mount -t tmpfs none {_quote(h)}" for h in hidden)
            args = [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "bash",
                "-c",
                f"{mounts} && exec {' '.join(_quote(a) for a in args)}",
            ]
        self.processes.append(
            subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        )

    def stop(self) -> None:
        pids: set[int] = set()
        for process in self.processes:
            pids.add(process.pid)
            pids |= _descendants(process.pid)
        for pid in pids:
            _kill(pid)
        for process in self.processes:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.processes.clear()
        shutil.rmtree(self.work_dir, ignore_errors=True)


class LocalSparkConnectServer(LocalSparkCluster):
    """A Spark Connect server on one machine (its jobs run in its own JVM, ``local[cores]``), optionally
    unable to see chosen folders (the same unshare + tmpfs trick). ``start()`` returns the ``sc://`` URL;
    ``stop()`` ends exactly the processes it started, by pid."""

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def start(self, *, hidden: list[str] | tuple[str, ...] = (), timeout: float = 120.0) -> str:
        self.port = _free_port()
        submit = str(Path(self.spark_home) / "bin" / "spark-submit")
        self._launch(
            "connect",
            [
                submit,
                "--class",
                "org.apache.spark.sql.connect.service.SparkConnectServer",
                "--name",
                "Spark Connect server",
                "--master",
                f"local[{self.worker_cores}]",
                "--driver-memory",
                self.worker_memory,
                "--conf",
                f"spark.connect.grpc.binding.port={self.port}",
                "--conf",
                "spark.connect.grpc.binding.address=127.0.0.1",
                "--conf",
                "spark.ui.enabled=false",
                "--conf",
                f"spark.sql.warehouse.dir={Path(self.work_dir) / 'warehouse'}",
            ],
            tuple(os.path.abspath(h) for h in hidden),
        )
        try:
            _wait_port(self.port, timeout, self.processes[-1])
        except RuntimeError as exc:
            log = (Path(self.work_dir) / "spark-connect.log").read_text(errors="replace")
            raise RuntimeError(f"Spark Connect server did not start ({exc}):\n{log[-2000:]}") from None
        return self.url


class ServiceProcess:
    """`python -m eventing run --ray-address … --json` in a subprocess, as a user runs it (its stderr in a
    log beside the data directory); ended by its pid."""

    def __init__(self, data_dir: str, address: str, *extra: str, log_name: str = "service"):
        root = str(Path(__file__).resolve().parents[2])  # the folder holding eventing/
        self.log = Path(data_dir).parent / f"{Path(data_dir).name}-{log_name}.log"
        env = {**os.environ, "PYTHONPATH": root, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "eventing",
                "--data-dir",
                data_dir,
                "run",
                "--ray-address",
                address,
                "--json",
                *extra,
            ],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self.log.open("w"),
            text=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 90) -> dict:
        """SIGTERM (a clean stop after a checkpoint); returns its JSON summary."""
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, (
            f"exit {self.proc.returncode}: {out[-2000:]}\n{self.log.read_text()[-3000:]}"
        )
        # Ray forwards its processes' messages to the driver's stdout too: the summary is the last JSON
        # object.
        start = out.rfind("\n{\n") + 1 if not out.startswith("{\n") else 0
        assert out[start:].strip(), (
            f"no summary on stdout: {out[-2000:]}\nlog: {self.log.read_text()[-3000:]}"
        )
        summary, _ = json.JSONDecoder().raw_decode(out[start:])
        return summary

    def kill(self) -> float:
        """kill -9; returns when it was dead."""
        self.end()
        return time.time()

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _wait_port(port: int, timeout: float, process: subprocess.Popen | None = None) -> None:
    """Until something listens on 127.0.0.1:port; RuntimeError after ``timeout`` or once ``process`` ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"the process ended (exit {process.returncode})") from None
            time.sleep(0.3)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f}s")


def descendants(pid: int) -> set[int]:
    """Pids of every live process below ``pid``."""
    return _descendants(pid)


# -- processes ----------------------------------------------------------------------------------------


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


__all__ = [
    "LocalRayCluster",
    "LocalSparkCluster",
    "LocalSparkConnectServer",
    "RayNode",
    "ServiceProcess",
    "descendants",
    "environment_without",
]
