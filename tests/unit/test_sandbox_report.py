"""`eventing status` says in one line what a sandboxed handler is confined by on this machine, and where the
kernel cannot provide a part: no sandbox at all without Landlock ABI 4 or seccomp filters (and deploying a
function that must run sandboxed is refused), device ioctls left open below Landlock ABI 5. The kernel's
answers are replaced here to see each line; the sandbox itself runs in tests/integration/test_sandbox*.py."""

from __future__ import annotations

import json

import pytest

from eventing.cli import main
from eventing.workers.sandbox import confine as sandbox_confine
from eventing.workers.sandbox import landlock as sandbox_landlock
from eventing.workers.sandbox import seccomp as sandbox_seccomp
from metadata.factory import open_store


def _status(capsys, data_dir: str, *flags: str) -> str:
    open_store(data_dir).close()  # a data directory with its metadata store
    assert main(["--data-dir", data_dir, "status", *flags]) == 0
    return capsys.readouterr().out


def test_status_names_what_the_sandbox_confines(data_dir, capsys):
    if sandbox_landlock.sandbox_unavailable() is not None:
        pytest.skip(str(sandbox_landlock.sandbox_unavailable()))
    lines = [line for line in _status(capsys, data_dir).splitlines() if line.startswith("sandbox: ")]
    assert len(lines) == 1
    assert f"Landlock ABI {sandbox_landlock.landlock_abi()}" in lines[0] and "seccomp" in lines[0]
    assert json.loads(_status(capsys, data_dir, "--json"))["sandbox"] == lines[0][len("sandbox: ") :]


@pytest.mark.parametrize(
    "abi, says",
    [
        (
            0,
            "unavailable: sandboxed functions need Landlock ABI 4+ (Linux 6.7+); this kernel has no Landlock",
        ),
        (3, "unavailable: sandboxed functions need Landlock ABI 4+ (Linux 6.7+); this kernel has ABI 3"),
        (4, "this kernel's Landlock leaves ioctl on devices open (ABI 5, Linux 6.10, confines it)"),
    ],
)
def test_status_says_where_the_kernel_falls_short(data_dir, capsys, monkeypatch, abi, says):
    monkeypatch.setattr(sandbox_landlock, "landlock_abi", lambda: abi)
    monkeypatch.setattr(sandbox_confine, "landlock_abi", lambda: abi)
    monkeypatch.setattr(sandbox_seccomp, "seccomp_unavailable", lambda: None)
    lines = [line for line in _status(capsys, data_dir).splitlines() if line.startswith("sandbox: ")]
    assert len(lines) == 1 and says in lines[0], lines


def test_no_seccomp_filter_means_no_sandbox(monkeypatch):
    monkeypatch.setattr(sandbox_landlock, "landlock_abi", lambda: 6)
    monkeypatch.setattr(
        sandbox_seccomp,
        "seccomp_unavailable",
        lambda: "this kernel has no seccomp filters (CONFIG_SECCOMP_FILTER)",
    )
    assert sandbox_confine.sandbox_report() == (
        "unavailable: sandboxed functions need a system call filter: this kernel has no seccomp filters "
        "(CONFIG_SECCOMP_FILTER)"
    )


def test_status_names_the_functions_that_run_unconfined(data_dir, capsys):
    from eventing.core.definition import FunctionDefinition
    from eventing.storage.bucket import LocalBucket
    from eventing.testing import deploy_function

    LocalBucket.create(data_dir, "src")
    handler = "def on_update(doc, meta):\n    pass\n"
    for name, extra in (("fn_open", {}), ("fn_shut", {"isolation": "sandbox"}), ("fn_off", {})):
        defn = FunctionDefinition.from_dict({"name": name, "source_bucket": "src", **extra})
        deploy_function(data_dir, defn, handler)
    assert main(["--data-dir", data_dir, "undeploy", "fn_off"]) == 0
    capsys.readouterr()
    lines = [line for line in _status(capsys, data_dir).splitlines() if "unconfined" in line]
    assert (
        len(lines) == 1 and "fn_open" in lines[0] and "fn_shut" not in lines[0] and "fn_off" not in lines[0]
    )
    views = json.loads(_status(capsys, data_dir, "--json"))["functions"]
    assert {v["name"]: v["isolation"] for v in views} == {
        "fn_open": "none",
        "fn_shut": "sandbox",
        "fn_off": "none",
    }
