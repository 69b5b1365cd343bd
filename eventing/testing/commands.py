"""`eventing` commands as a user runs them, for tests: one-shot commands and long-running ones (`eventing
run`, `eventing serve`) in subprocesses of their own, in a working directory of the test's choosing, each
ended by its pid; and a steady load of Data API writes whose every answer is recorded.

    cmd = Commands(cwd=empty_folder, env={"EVENTING_STORE": url})
    done = cmd("bucket", "create", "src")           # subprocess.CompletedProcess (text)
    serve = cmd.start("serve", "--port", str(port))  # an EventingProcess; serve.wait_port(port)
    with DataApiWriters(port, "src", threads=2) as load:
        ...                                          # load.acked: {key: value} of every 2xx answer
    serve.stop()                                     # SIGTERM, then the exit code
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the folder holding eventing/


class Commands:
    """Runs `python -m eventing ...` in `cwd` with `env` added to this process's environment (the checkout
    on PYTHONPATH, so the working directory can be any folder)."""

    def __init__(
        self, cwd: str | os.PathLike[str], env: dict[str, str] | None = None, *, logs: str | None = None
    ):
        self.cwd = str(cwd)
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
            **(env or {}),
        }
        self.logs = Path(logs) if logs else None

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "eventing", *args]

    def __call__(
        self, *args: str, timeout: float = 120, env: dict[str, str] | None = None, input: str | None = None
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.argv(*args),
            cwd=self.cwd,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
        )

    def ok(self, *args: str, **kwargs) -> str:
        """Run a command that must succeed; its stdout."""
        done = self(*args, **kwargs)
        assert done.returncode == 0, (
            f"eventing {' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        )
        return done.stdout

    def start(self, *args: str, env: dict[str, str] | None = None, name: str = "process") -> EventingProcess:
        return EventingProcess(self.argv(*args), self.cwd, {**self.env, **(env or {})}, self.logs, name)


class EventingProcess:
    """A long-running command (its stdout and stderr in files under `logs`, else in memory)."""

    def __init__(self, argv: list[str], cwd: str, env: dict[str, str], logs: Path | None, name: str):
        self.name = name
        if logs is not None:
            logs.mkdir(parents=True, exist_ok=True)
            self.out_path, self.err_path = logs / f"{name}.out", logs / f"{name}.err"
        else:
            import tempfile

            folder = Path(tempfile.mkdtemp(prefix="eventing-proc-"))
            self.out_path, self.err_path = folder / f"{name}.out", folder / f"{name}.err"
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.proc = subprocess.Popen(
                argv, cwd=cwd, env=env, stdout=out, stderr=err, start_new_session=True
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> tuple[str, str]:
        return (self.out_path.read_text(errors="replace"), self.err_path.read_text(errors="replace"))

    def wait_port(self, port: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return
            except OSError:
                if not self.alive():
                    out, err = self.output()
                    raise AssertionError(
                        f"{self.name} ended (exit {self.proc.returncode}): {out[-2000:]}{err[-3000:]}"
                    ) from None
                time.sleep(0.1)
        raise AssertionError(f"{self.name}: nothing listens on port {port} after {timeout:.0f}s")

    def stop(self, timeout: float = 90, sig: int = signal.SIGTERM) -> int:
        """SIGTERM (`eventing run`: a clean stop after a checkpoint), or `sig`; then its exit code."""
        if self.alive():
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not stop within {timeout:.0f}s of SIGTERM") from None

    def kill(self) -> None:
        """kill -9 of the process (only it: its Ray workers are its Ray instance's)."""
        if self.alive():
            self.proc.kill()
        self.proc.wait(30)

    def describe(self) -> str:
        out, err = self.output()
        return f"{self.name} (exit {self.proc.poll()}):\n{out[-3000:]}\n{err[-5000:]}"


def data_api_path(keyspace: str, key: str) -> str:
    bucket, _, rest = keyspace.partition(".")
    scope, _, collection = rest.partition(".")
    return (
        f"/v1/buckets/{bucket}/scopes/{scope or '_default'}/collections/{collection or '_default'}"
        f"/documents/{key}"
    )


class DataApiWriters:
    """Threads that PUT documents through the Data API one after the other (each its own keys, `w<t>-<n>`),
    until the block ends; every answer is counted by status. `acked`: the value of every key that got a 2xx,
    which must be there afterwards; `unavailable`: the answers 503, with their Retry-After header."""

    def __init__(
        self,
        port: int,
        keyspace: str,
        *,
        threads: int = 2,
        timeout_s: float = 120,
        user: tuple[str, str] | None = None,
    ):
        self.port, self.keyspace, self.timeout_s = port, keyspace, timeout_s
        self.headers = {"Content-Type": "application/json"}
        if user is not None:
            self.headers["Authorization"] = "Basic " + base64.b64encode(":".join(user).encode()).decode()
        self.statuses: Counter[int] = Counter()
        self.acked: dict[str, dict] = {}
        self.unavailable: list[dict[str, str]] = []  # headers of each 503
        self.refusals: list[str] = []  # and its body
        self.errors: list[str] = []  # answers other than 2xx and 503, and failures to connect
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(t,), daemon=True) for t in range(threads)]

    @property
    def written(self) -> int:
        return len(self.acked)

    def __enter__(self) -> DataApiWriters:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout_s + 10)

    def _run(self, t: int) -> None:
        n = 0
        conn: http.client.HTTPConnection | None = None
        while not self._stop.is_set():
            key = f"w{t}-{n}"
            value = {"t": t, "n": n}
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout_s)
                conn.request(
                    "PUT", data_api_path(self.keyspace, key), body=json.dumps(value), headers=self.headers
                )
                answer = conn.getresponse()
                body = answer.read()
                headers = {k.lower(): v for k, v in answer.getheaders()}
            except (OSError, http.client.HTTPException) as exc:
                with self._lock:
                    self.errors.append(f"{key}: {type(exc).__name__}: {exc}")
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.05)
                continue
            with self._lock:
                self.statuses[answer.status] += 1
                if 200 <= answer.status < 300:
                    self.acked[key] = value
                elif answer.status == 503:
                    self.unavailable.append(headers)
                    self.refusals.append(body.decode(errors="replace"))
                else:
                    self.errors.append(f"{key}: {answer.status} {body[:300]!r}")
            if answer.status == 503:
                time.sleep(0.05)
                continue  # the same key again
            n += 1
        if conn is not None:
            conn.close()


class KvClient:
    """Couchbase's KV protocol (memcached binary) at its simplest, for tests of the KV port: a login by SASL
    PLAIN, a bucket selected, and SETs whose status is returned as the server sent it."""

    HEADER = struct.Struct(">BBHBBHIIQ")
    HELLO, SASL_AUTH, SELECT_BUCKET, SET = 0x1F, 0x21, 0x89, 0x01
    XERROR, COLLECTIONS = 0x07, 0x12

    def __init__(
        self,
        port: int,
        user: str,
        password: str,
        bucket: str,
        timeout_s: float = 60,
        *,
        collections: bool = False,
    ):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.opaque = 0
        features = (self.XERROR, self.COLLECTIONS) if collections else (self.XERROR,)
        self.call(self.HELLO, b"test", value=b"".join(f.to_bytes(2, "big") for f in features))
        status, body = self.call(self.SASL_AUTH, b"PLAIN", value=f"\0{user}\0{password}".encode())
        assert status == 0, f"KV login refused: {status:#x} {body!r}"
        status, body = self.call(self.SELECT_BUCKET, bucket.encode())
        assert status == 0, f"KV bucket {bucket} refused: {status:#x} {body!r}"

    def call(
        self, opcode: int, key: bytes, *, extras: bytes = b"", value: bytes = b"", datatype: int = 0
    ) -> tuple[int, bytes]:
        """One request; (status, value of the answer)."""
        self.opaque += 1
        body = extras + key + value
        self.sock.sendall(
            self.HEADER.pack(0x80, opcode, len(key), len(extras), datatype, 0, len(body), self.opaque, 0)
            + body
        )
        header = self._read(24)
        _magic, _op, key_len, extras_len, _dt, status, total, _opaque, _cas = self.HEADER.unpack(header)
        answer = self._read(total)
        return status, answer[extras_len + key_len :]

    def set(self, key: str, document: dict, *, collection_id: int | None = None) -> tuple[int, bytes]:
        """A SET of `key` (in collection `collection_id`, as LEB128 before the key, with collections
        agreed)."""
        stored = key.encode() if collection_id is None else _leb128(collection_id) + key.encode()
        return self.call(
            self.SET,
            stored,
            extras=struct.pack(">II", 0x02000006, 0),
            value=json.dumps(document).encode(),
            datatype=0x01,
        )

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("the KV port closed the connection")
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()


def _leb128(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)
