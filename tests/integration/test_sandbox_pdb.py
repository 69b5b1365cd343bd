"""`eventing debug` on a sandboxed function: under `--pdb` the handler runs under pdb in its sandboxed child,
whose commands come from the debugger's standard input and whose prompts reach its terminal through the
host, and a quit discards the call's writes; a trace shows each event as the child makes it, so a long
call shows its progress and Ctrl-C ends the session mid-call. The stream keeps the mutation either way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from eventing.cli.debug import EXIT_HANDLER_FAILED
from eventing.storage.factory import create_bucket, open_bucket
from eventing.workers.sandbox.landlock import sandbox_unavailable

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sandbox_unavailable() is not None, reason=str(sandbox_unavailable())),
]

HANDLER = """
import time


def on_update(doc, meta):
    seen = dst.get("alpha")
    if doc.get("slow"):
        log("sleeping in the sandbox")
        time.sleep(60)
    dst[meta.id] = {"rev": doc["rev"], "was": seen}
"""


def _eventing(data_dir: str, *args: str, stdin: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "EVENTING_DEFAULT_ISOLATION": "none"}  # the function asks for the sandbox itself
    return subprocess.run(
        [sys.executable, "-m", "eventing", *args, "--data-dir", data_dir],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def _deploy_sandboxed(data_dir: str, folder, name: str, handler: str, **extra) -> None:
    """Deploy `name` from a handler file and a definition file, as a user would, asking for the sandbox."""
    (folder / "h.py").write_text(handler)
    definition = {"name": name, "source_bucket": "src", "handler": str(folder / "h.py"), **extra}
    (folder / "fn.json").write_text(json.dumps({**definition, "isolation": "sandbox"}))
    deployed = _eventing(data_dir, "deploy", str(folder / "fn.json"), stdin="")
    assert deployed.returncode == 0, deployed.stderr


@pytest.fixture()
def sandboxed(data_dir, tmp_path):
    create_bucket(data_dir, "src").upsert("gamma", {"rev": 3})
    create_bucket(data_dir, "dst").upsert("alpha", {"rev": 0})
    _deploy_sandboxed(
        data_dir, tmp_path, "fn_d", HANDLER, bindings=[{"alias": "dst", "bucket": "dst", "access": "rw"}]
    )
    return data_dir


def test_pdb_drives_a_sandboxed_handler_from_the_debuggers_terminal(sandboxed):
    commands = "p doc['rev'] * 100\nnext\nnext\np seen\ncontinue\n"
    debug = ("debug", "fn_d", "--key", "gamma", "--pdb", "--apply", "--json")
    done = _eventing(sandboxed, *debug, stdin=commands)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["mode"] == "pdb" and report["outcome"] == "ok" and report["applied"] is True
    assert "(Pdb) 300" in done.stderr  # the child evaluated the command and its answer reached the terminal
    assert "(Pdb) {'rev': 0}" in done.stderr  # a local set by the handler, read through its binding
    assert open_bucket(sandboxed, "dst").get("gamma") == {"rev": 3, "was": {"rev": 0}}


def test_a_pdb_quit_in_the_sandbox_discards_the_writes_and_end_of_input_quits(sandboxed):
    debug = ("debug", "fn_d", "--key", "gamma", "--pdb", "--apply", "--json")
    quit_ = _eventing(sandboxed, *debug, stdin="quit\n")
    assert quit_.returncode == 0, quit_.stderr
    report = json.loads(quit_.stdout)
    assert (report["outcome"], report["writes"], report["applied"]) == ("quit", [], False)
    ended = _eventing(sandboxed, "debug", "fn_d", "--key", "gamma", "--pdb", stdin="")
    assert ended.returncode == 0, ended.stderr
    assert "pdb quit before the handler returned" in ended.stdout
    assert open_bucket(sandboxed, "dst").get("gamma") is None


def test_a_sandboxed_trace_shows_each_event_as_it_happens_and_ctrl_c_ends_it(sandboxed):
    open_bucket(sandboxed, "src").upsert("slow", {"rev": 1, "slow": True})
    session = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "eventing",
            "debug",
            "fn_d",
            "--key",
            "slow",
            "--apply",
            "--data-dir",
            sandboxed,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "EVENTING_DEFAULT_ISOLATION": "none", "PYTHONUNBUFFERED": "1"},
    )
    try:
        seen = []
        deadline = time.monotonic() + 60
        assert session.stdout is not None
        while not any("sleeping in the sandbox" in line for line in seen):
            line = session.stdout.readline()
            assert line and time.monotonic() < deadline, seen
            seen.append(line)
        assert session.poll() is None  # the read and the log line came while the handler still runs
        assert any("read    dst['alpha']" in line for line in seen), seen
        session.send_signal(signal.SIGINT)
        _, err = session.communicate(timeout=30)
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()
    assert session.returncode == 130, err
    assert "was not consumed" in err and "Traceback" not in err
    assert open_bucket(sandboxed, "dst").get("slow") is None  # interrupted before it returned: not applied


def test_pdb_prompts_share_the_terminal_with_the_trace_in_text_mode(sandboxed):
    done = _eventing(sandboxed, "debug", "fn_d", "--key", "gamma", "--pdb", stdin="p doc\ncontinue\n")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "(Pdb) {'rev': 3}" in out and "on_update returned" in out, out
    assert out.index("calling on_update") < out.index("(Pdb)") < out.index("write   dst['gamma']"), out
    assert open_bucket(sandboxed, "dst").get("gamma") is None  # shown, not applied


def test_a_terminal_that_cannot_print_pdbs_output_fails_the_call_instead_of_hanging(sandboxed):
    env = {**os.environ, "EVENTING_DEFAULT_ISOLATION": "none", "PYTHONIOENCODING": "ascii"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "eventing",
            "debug",
            "fn_d",
            "--key",
            "gamma",
            "--pdb",
            "--data-dir",
            sandboxed,
        ],
        input="p 'caf\\xe9'\ncontinue\n",
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == EXIT_HANDLER_FAILED, (done.stdout, done.stderr)  # not a hang (timeout)
    assert "result: error: " in done.stdout and "UnicodeEncodeError" in done.stdout, done.stdout
    assert "Traceback" not in done.stderr  # the call's error is the result; the session itself ends cleanly


FORGER = """
import gc


def on_update(doc, meta):
    line = next(o for o in gc.get_objects() if type(o).__name__ == "_Line")  # the child's own line
    line.call("debug_event", {"event": "call"})  # a trace event of no known shape
"""


def test_a_handler_that_forges_a_trace_event_fails_its_call_and_the_session_ends(data_dir, tmp_path):
    create_bucket(data_dir, "src").upsert("k1", {"rev": 1})
    _deploy_sandboxed(data_dir, tmp_path, "fn_f", FORGER)
    done = _eventing(data_dir, "debug", "fn_f", "--key", "k1", "--json", stdin="")
    assert done.returncode == EXIT_HANDLER_FAILED, done.stderr
    report = json.loads(done.stdout)
    assert report["outcome"] == "error" and "sent a trace event that is not one" in report["error"], report
