"""A hostile handler run through the deployed sandbox tries every way out that a sandboxed handler once
had: other processes' command lines and environments in /proc, /etc/shadow, /root, another data
directory's buckets, the rest of the checkout, a subprocess or a fork, a Unix socket (stream or datagram)
of another process, a signal to its host, another process's priority, affinity or limits, a System V
message queue, TCP to a port that is no URL binding's, a netlink socket, shared anonymous memory or a
memfd (which RLIMIT_DATA does not count), 3 GB of memory, 9,000 open files, capabilities. It
records what it could do in its binding; each attempt must be refused, while what a handler needs (its own
/proc entry, the standard library, CA certificates, name resolution, time zones, its private folder) still
works. The same handler with "isolation": "none" succeeds at the attempts, so the refusals come from the
sandbox. On Ray, the probe also tries Ray's folders and the raylet's socket."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.core.mutation import OP_UPDATE, encode_document
from eventing.storage.factory import create_bucket, open_bucket
from eventing.storage.files import bucket_path
from eventing.storage.values import Write
from eventing.testing import deploy_function
from eventing.workers.executor import InProcessExecutor
from eventing.workers.sandbox.landlock import sandbox_unavailable

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sandbox_unavailable() is not None, reason=str(sandbox_unavailable())),
]

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HOSTILE = """
import os, socket, ssl, subprocess, tempfile, time


def attempt(fn):
    try:
        fn()
        return "ok"
    except BaseException as exc:  # MemoryError too
        return type(exc).__name__


def other_processes():
    others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
    for p in others:
        with open(f"/proc/{p}/cmdline", "rb") as f:
            f.read()
    assert others


def host_cmdline():
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        assert f.read()


def host_environ():
    with open(f"/proc/{os.getppid()}/environ", "rb") as f:
        assert f.read()


def shadow():
    with open("/etc/shadow", "rb") as f:
        assert f.read(1)


def root_home():
    os.listdir("/root")


def other_data():
    with open(OTHER_BUCKET, "rb") as f:
        assert f.read(16).startswith(b"SQLite format 3")


def checkout():
    with open(os.path.join(CHECKOUT, "pyproject.toml"), "rb") as f:
        assert f.read(1)


def system_tmp():
    os.listdir("/tmp")


def spawn():
    subprocess.run(["/bin/true"], check=True)


def fork():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def unix_stream():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(UNIX_STREAM)
    s.close()


def unix_datagram():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.sendto(b"x", UNIX_DATAGRAM)


def signal_host():
    os.kill(os.getppid(), 0)


def other_port():
    socket.create_connection(("127.0.0.1", OTHER_PORT), timeout=5).close()


def renice_other():
    os.setpriority(os.PRIO_PROCESS, SLEEPER, 19)


def pin_other():
    os.sched_setaffinity(SLEEPER, os.sched_getaffinity(0))


def limit_other():
    import resource

    resource.prlimit(SLEEPER, resource.RLIMIT_CORE, (0, 0))


def sysv_queue():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    queue = libc.msgget(0, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
    if queue < 0:
        raise OSError(ctypes.get_errno(), "msgget")
    libc.msgctl(queue, 0, None)  # IPC_RMID


def netlink():
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4)  # NETLINK_SOCK_DIAG: every socket of the host
    s.close()


def shared_memory():
    import mmap

    mmap.mmap(-1, 1 << 20, flags=mmap.MAP_SHARED).close()  # not counted by RLIMIT_DATA


def memfd():
    os.close(os.memfd_create("x"))


def memory():
    block = bytearray(3 << 30)
    block[-1] = 1


def open_files():
    fds = []
    try:
        for _ in range(9000):
            fds.append(os.open("/dev/null", os.O_RDONLY))
    finally:
        for fd in fds:
            os.close(fd)


def capabilities():
    with open("/proc/self/status") as f:
        effective = [line.split()[1] for line in f if line.startswith("CapEff:")][0]
    if int(effective, 16) == 0:
        raise PermissionError("no capabilities")


# what a handler needs, which must keep working
def own_proc():
    with open("/proc/self/status") as f:
        assert "Pid:" in f.read()


def certificates():
    paths = ssl.get_default_verify_paths()
    with open(paths.cafile or paths.openssl_cafile, "rb") as f:
        assert b"BEGIN CERTIFICATE" in f.read()
    ssl.create_default_context()


def resolve():
    assert socket.getaddrinfo("localhost", 80)


def time_zone():
    os.environ["TZ"] = "Europe/Paris"
    time.tzset()
    assert time.strftime("%Z", time.localtime(1_700_000_000)) == "CET"


def private_folder():
    fd, path = tempfile.mkstemp()
    os.write(fd, b"x")
    os.close(fd)
    os.unlink(path)


ESCAPES = {
    "other_processes": other_processes, "host_cmdline": host_cmdline, "host_environ": host_environ,
    "shadow": shadow, "root_home": root_home, "other_data": other_data,
    "checkout": checkout, "system_tmp": system_tmp, "spawn": spawn, "fork": fork, "unix_stream": unix_stream,
    "unix_datagram": unix_datagram, "signal_host": signal_host, "other_port": other_port,
    "renice_other": renice_other, "pin_other": pin_other, "limit_other": limit_other, "sysv_queue": sysv_queue,
    "capabilities": capabilities, "netlink": netlink, "shared_memory": shared_memory, "memfd": memfd,
}
NEEDS = {"own_proc": own_proc, "certificates": certificates, "resolve": resolve, "time_zone": time_zone,
         "private_folder": private_folder}
LIMITS = {"memory": memory, "open_files": open_files}


def on_update(doc, meta):
    probes = dict(ESCAPES, **NEEDS)
    if SANDBOXED:
        probes.update(LIMITS)  # unsandboxed, 3 GB would be taken
    out[meta.id] = {name: attempt(fn) for name, fn in probes.items()}
"""  # noqa: E501

ESCAPES = (
    "other_processes",
    "host_cmdline",
    "host_environ",
    "shadow",
    "root_home",
    "other_data",
    "checkout",
    "system_tmp",
    "spawn",
    "fork",
    "unix_stream",
    "unix_datagram",
    "signal_host",
    "other_port",
    "renice_other",
    "pin_other",
    "limit_other",
    "sysv_queue",
    "capabilities",
    "netlink",
    "shared_memory",
    "memfd",
)
NEEDS = ("own_proc", "certificates", "resolve", "time_zone", "private_folder")
DOCUMENTS = 3


@contextmanager
def _targets(tmp_path) -> Iterator[dict]:
    """What the hostile handler aims at, as its constants: a Unix stream socket and a Unix datagram socket
    (both open to anyone) and a TCP port of this process, and a process of this user (a sleeper, ended by
    its pid on leaving)."""
    import subprocess

    stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stream.bind(str(tmp_path / "stream.sock"))
    stream.listen(64)
    datagram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    datagram.bind(str(tmp_path / "datagram.sock"))
    for name in ("stream.sock", "datagram.sock"):
        os.chmod(tmp_path / name, 0o777)
    tcp = socket.create_server(("127.0.0.1", 0), backlog=64)
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        yield {
            "UNIX_STREAM": stream.getsockname(),
            "UNIX_DATAGRAM": datagram.getsockname(),
            "OTHER_PORT": tcp.getsockname()[1],
            "SLEEPER": sleeper.pid,
        }
    finally:
        sleeper.kill()
        sleeper.wait()
        for s in (stream, datagram, tcp):
            s.close()


def _deploy(
    data_dir: str, tmp_path, isolation: str, targets: dict, source: str = HOSTILE, **constants
) -> None:
    other = tmp_path / "other-data"
    create_bucket(str(other), "secrets").upsert("pw", {"pw": "hunter2"})
    create_bucket(data_dir, "src").write(
        [Write(f"k{i}", OP_UPDATE, encode_document({"v": i})) for i in range(DOCUMENTS)]
    )
    deploy_function(
        data_dir,
        FunctionDefinition.from_dict(
            {
                "name": "fn_hostile",
                "source_bucket": "src",
                "isolation": isolation,
                "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
                "constants": {
                    "SANDBOXED": isolation == "sandbox",
                    "OTHER_BUCKET": str(bucket_path(str(other), "secrets")),
                    "CHECKOUT": CHECKOUT,
                    **targets,
                    **constants,
                },
            }
        ),
        source,
    )


def _probe(data_dir: str, tmp_path, isolation: str) -> dict:
    with _targets(tmp_path) as targets:
        _deploy(data_dir, tmp_path, isolation, targets)
        summary = EventingService(
            data_dir, InProcessExecutor(), until_caught_up=True, functions=["fn_hostile"]
        ).run()
    assert summary.functions["fn_hostile"].handled == DOCUMENTS, summary
    docs = {key: doc for key, doc, _ in open_bucket(data_dir, "out").scan()}
    assert len(docs) == DOCUMENTS
    return docs


def test_a_sandboxed_handler_is_refused_every_way_out(data_dir, tmp_path):
    for key, doc in _probe(data_dir, tmp_path, "sandbox").items():
        escaped = {what: doc[what] for what in ESCAPES if doc[what] == "ok"}
        assert not escaped, f"{key}: these escapes worked inside the sandbox: {escaped}"
        assert doc["memory"] == "MemoryError", doc
        assert doc["open_files"] == "OSError", doc  # EMFILE: at most 256 descriptors
        broken = {what: doc[what] for what in NEEDS if doc[what] != "ok"}
        assert not broken, f"{key}: what a handler needs failed inside the sandbox: {broken}"


def test_the_same_handler_unsandboxed_gets_out(data_dir, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the unsandboxed side reads /etc/shadow and /root and holds capabilities only as root")
    for key, doc in _probe(data_dir, tmp_path, "none").items():
        refused = {what: doc[what] for what in (*ESCAPES, *NEEDS) if doc[what] != "ok"}
        assert not refused, (
            f"{key}: these failed without the sandbox, so the sandbox test proves nothing: {refused}"
        )


# -- on Ray: a Ray worker hosts the sandbox ------------------------------------------------------------------

RAY_HOSTILE = (
    HOSTILE
    + """

def ray_folder():
    os.listdir(RAY_TEMP)


def ray_log():
    with open(RAY_LOG, "rb") as f:
        f.read(1)


def raylet():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(RAYLET)
    s.close()


ESCAPES.update(ray_folder=ray_folder, ray_log=ray_log, raylet=raylet)
"""
)


def test_a_sandboxed_handler_on_a_ray_worker_is_refused_every_way_out(data_dir, tmp_path, ray_executor):
    import ray

    node = ray._private.worker.global_worker.node
    logs = os.path.join(node.get_session_dir_path(), "logs")
    log = next(
        os.path.join(logs, n) for n in sorted(os.listdir(logs)) if n.endswith((".out", ".err", ".log"))
    )
    with _targets(tmp_path) as targets:
        _deploy(
            data_dir,
            tmp_path,
            "sandbox",
            targets,
            RAY_HOSTILE,
            RAY_TEMP=node.get_temp_dir_path(),
            RAY_LOG=log,
            RAYLET=node.raylet_socket_name,
        )
        summary = EventingService(
            data_dir, ray_executor, until_caught_up=True, functions=["fn_hostile"]
        ).run()
    assert summary.functions["fn_hostile"].handled == DOCUMENTS, summary
    docs = {key: doc for key, doc, _ in open_bucket(data_dir, "out").scan()}
    assert len(docs) == DOCUMENTS
    for key, doc in docs.items():
        escaped = {
            what: doc[what] for what in (*ESCAPES, "ray_folder", "ray_log", "raylet") if doc[what] == "ok"
        }
        assert not escaped, f"{key}: these escapes worked inside the sandbox on Ray: {escaped}"
        assert doc["memory"] == "MemoryError" and doc["open_files"] == "OSError", doc
        broken = {what: doc[what] for what in NEEDS if doc[what] != "ok"}
        assert not broken, f"{key}: what a handler needs failed inside the sandbox on Ray: {broken}"
    with open(log, "rb") as f:  # readable outside the sandbox: the refusal above is the sandbox's
        f.read(1)


def test_eventing_run_on_ray_leaves_no_sandbox_folder(data_dir, tmp_path):
    """`eventing run --until-caught-up` on a Ray instance of its own, with two sandboxed workers: every
    sandbox's private folder (under the workers' temporary folder, here one of this test's) is gone when
    the command returns."""
    import subprocess
    import sys
    import tempfile

    from eventing.testing import LEDGER_HANDLER, check_ledger, ledger_definition, load_source

    source = load_source(data_dir, 50, 400, seed=3)
    deploy_function(
        data_dir,
        ledger_definition("fn_ledger", "src", "ledger", workers=2, batch_size=50, isolation="sandbox"),
        LEDGER_HANDLER,
    )
    workers_tmp = tempfile.mkdtemp(prefix="ev", dir="/tmp")  # short: Ray's socket paths live beneath TMPDIR
    env = {**os.environ, "TMPDIR": workers_tmp, "RAY_TMPDIR": tempfile.gettempdir()}
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "eventing",
                "--data-dir",
                data_dir,
                "run",
                "--until-caught-up",
                "--quiet",
                "--executor",
                "ray",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        report = check_ledger(source, open_bucket(data_dir, "ledger"))
        assert report.ok and report.handled == 400, report.summary()
        root = os.path.join(workers_tmp, "eventing-sandboxes")
        assert os.path.isdir(root), "the sandboxes did not run under the workers' temporary folder"
        assert os.listdir(root) == [], os.listdir(root)
    finally:
        import shutil

        shutil.rmtree(workers_tmp, ignore_errors=True)


HOST = """
import sys, time
from eventing.core.definition import FunctionDefinition
from eventing.workers.sandbox.host import _NoData, _Sandboxed
from eventing.workers.sandbox.scope import ScopedService

defn = FunctionDefinition.from_dict({"name": "fn_killed", "source_bucket": "src", "isolation": "sandbox"})
s = _Sandboxed()
s._start(defn.name, defn, ScopedService(defn.name, defn, _NoData()), private=[sys.argv[1]])
print(s.tmp, s.proc.pid, flush=True)
time.sleep(120)
"""


def test_the_folder_of_a_sandbox_whose_host_was_killed_goes_with_the_next_sandbox(
    data_dir, tmp_path, monkeypatch
):
    """A host killed with kill -9 leaves its sandbox's folder (its child ends with it); the next sandbox
    started on the machine removes it."""
    import signal
    import subprocess
    import sys
    import tempfile

    from eventing.testing import wait_for
    from eventing.workers.sandbox.host import validate_sandboxed

    host = subprocess.Popen(
        [sys.executable, "-c", HOST, data_dir],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    try:
        folder, child = host.stdout.readline().split()
        assert os.path.isdir(folder)
        os.kill(host.pid, signal.SIGKILL)
        host.wait()
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
    wait_for(
        lambda: not os.path.exists(f"/proc/{child}"), "the sandboxed child ends with its host", timeout=10
    )
    assert os.path.isdir(folder)  # nothing ran to remove it
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    defn = FunctionDefinition.from_dict({"name": "fn_next", "source_bucket": "src", "isolation": "sandbox"})
    validate_sandboxed(data_dir, defn, "def on_update(doc, meta):\n    pass\n")
    assert not os.path.exists(folder) and not os.path.exists(folder + ".lock")
    assert os.listdir(os.path.join(str(tmp_path), "eventing-sandboxes")) == []  # nor fn_next's
