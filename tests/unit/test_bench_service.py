"""scripts/bench_service.c, the HTTP service of scripts/bench_concurrency.py: every answer comes its delay
after the request arrived, on kept-alive connections, for pipelined requests and bodies split across
reads too, and many connections wait at once (not one after another)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "scripts" / "bench_service.c"
DELAY_S = 0.05
ANSWER = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"ok":true}'


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler: scripts/bench_concurrency.py uses its asyncio service instead")
    binary = tmp_path_factory.mktemp("service") / "bench_service"
    subprocess.run([compiler, "-O2", "-o", str(binary), str(SOURCE)], check=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(binary), str(port), str(DELAY_S * 1000)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
        yield port
    finally:
        proc.terminate()
        proc.wait()


def _read(conn: socket.socket, size: int) -> bytes:
    conn.settimeout(5)  # a service that never answers fails the test instead of holding up the suite
    data = b""
    while len(data) < size:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_each_answer_comes_its_delay_after_the_request_on_a_kept_connection(service):
    with socket.create_connection(("127.0.0.1", service)) as conn:
        for i in range(3):
            started = time.monotonic()
            conn.sendall(b"GET /doc?id=%d HTTP/1.1\r\nHost: x\r\n\r\n" % i)
            assert _read(conn, len(ANSWER)) == ANSWER
            assert DELAY_S <= time.monotonic() - started < DELAY_S + 0.25


def test_a_body_split_across_reads_and_pipelined_requests_are_answered_in_turn(service):
    with socket.create_connection(("127.0.0.1", service)) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        started = time.monotonic()
        conn.sendall(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01234")
        time.sleep(0.01)
        conn.sendall(b"56789GET /b HTTP/1.1\r\nHost: x\r\n\r\n")  # the body's rest, then a second request
        assert _read(conn, len(ANSWER)) == ANSWER
        first = time.monotonic() - started
        assert _read(conn, len(ANSWER)) == ANSWER
        second = time.monotonic() - started
        # The first waits from its body's end; the second from the first's answer (one request at a time).
        assert first >= DELAY_S + 0.01 and second >= 2 * DELAY_S + 0.01


def test_connection_close_is_answered_then_closed(service):
    with socket.create_connection(("127.0.0.1", service)) as conn:
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = _read(conn, 1 << 16)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b"\r\nConnection: close\r\n" in answer
    assert answer.endswith(b'{"ok":true}')


def test_many_connections_wait_at_once(service):
    conns = [socket.create_connection(("127.0.0.1", service)) for _ in range(40)]
    try:
        started = time.monotonic()
        for conn in conns:
            conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert all(_read(conn, len(ANSWER)) == ANSWER for conn in conns)
        assert time.monotonic() - started < 10 * DELAY_S  # not 40 delays one after another
    finally:
        for conn in conns:
            conn.close()


def test_the_bench_runs_its_workers_in_process_and_reports_the_cpu_a_call(capsys):
    """`--executor in-process`: the same runs, the workers as threads of the bench's process, each run with
    that process's CPU a call (the figure docs/benchmarks.md compares JavaScript and Python by)."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location(
        "bench_concurrency", SOURCE.with_name("bench_concurrency.py")
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    argv = ["--executor", "in-process", "--workers", "1", "--concurrency", "4", "--call-ms", "2"]
    argv += ["--mutations", "300", "--documents", "60", "--baseline-mutations", "40", "--json"]
    assert bench.main(argv) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["executor"] == "in-process" and out["ledger_ok"] and out["order_violations"] == 0
    assert out["cpu_us_per_call"] > 0 and out["throughput"] > 0
