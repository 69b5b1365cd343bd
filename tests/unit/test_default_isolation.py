"""A machine's default isolation (eventing.workers.sandbox.default): a function deployed by an admin
without an `isolation` setting runs unconfined unless the service's environment sets
EVENTING_DEFAULT_ISOLATION=sandbox (then sandboxed where the machine can sandbox); a non-admin's always runs
sandboxed; and `eventing status` names the unconfined functions in one line (`"unconfined"` in `--json`).
The suite pins the setting to the product's default (tests/conftest.py); these tests set it themselves."""

from __future__ import annotations

import json

import pytest

from eventing.cli import main
from eventing.core.definition import FunctionDefinition
from eventing.errors import ConfigError
from eventing.storage.bucket import LocalBucket
from eventing.testing import deploy_function
from eventing.workers.sandbox import confine as sandbox_confine
from eventing.workers.sandbox import landlock as sandbox_landlock
from eventing.workers.sandbox.default import DEFAULT_ISOLATION_ENV, default_isolation, isolation_of
from metadata.factory import open_store

UNAVAILABLE = sandbox_landlock.sandbox_unavailable()
needs_sandbox = pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))
NO_LANDLOCK = "sandboxed functions need Landlock ABI 4+ (Linux 6.7+); this kernel has ABI 0"
ADMIN, USER = {"user": "a", "admin": True}, {"user": "u", "admin": False}


@pytest.fixture(autouse=True)
def product_default(monkeypatch):
    monkeypatch.delenv(DEFAULT_ISOLATION_ENV, raising=False)


def _defn(name: str, **extra) -> FunctionDefinition:
    return FunctionDefinition.from_dict({"name": name, "source_bucket": "src", **extra})


def _cannot_sandbox(monkeypatch) -> None:
    # Every module that bound the name at its import: the host's is imported here first, so a later test
    # does not find this one's stand-in bound for good.
    from eventing.workers.sandbox import host as sandbox_host

    for module in (sandbox_landlock, sandbox_confine, sandbox_host):
        monkeypatch.setattr(module, "sandbox_unavailable", lambda: NO_LANDLOCK)


def test_an_admins_function_runs_unconfined_by_default_and_a_non_admins_sandboxed():
    assert default_isolation() == "none"
    for deployed_by in (None, ADMIN):  # the local CLI, an admin over HTTP
        assert isolation_of(_defn("f"), deployed_by) == "none"
        assert isolation_of(_defn("f", isolation="sandbox"), deployed_by) == "sandbox"
    assert isolation_of(_defn("f"), USER) == "sandbox"
    assert isolation_of(_defn("f", isolation="none"), USER) == "sandbox"  # never unconfined for a non-admin


@needs_sandbox
def test_the_machines_default_can_be_the_sandbox(monkeypatch):
    monkeypatch.setenv(DEFAULT_ISOLATION_ENV, "sandbox")
    assert default_isolation() == "sandbox"
    for deployed_by in (None, ADMIN):
        assert isolation_of(_defn("f"), deployed_by) == "sandbox"
        assert isolation_of(_defn("f", isolation="none"), deployed_by) == "none"  # an admin's explicit choice


def test_a_machine_that_cannot_sandbox_keeps_them_unconfined_whatever_its_default(monkeypatch):
    _cannot_sandbox(monkeypatch)
    monkeypatch.setenv(DEFAULT_ISOLATION_ENV, "sandbox")
    assert default_isolation() == "none"
    assert isolation_of(_defn("f"), None) == "none"
    assert isolation_of(_defn("f", isolation="sandbox"), None) == "sandbox"  # asked for: refused at deploy
    assert isolation_of(_defn("f"), USER) == "sandbox"


def test_the_machines_default_is_none_or_sandbox_and_nothing_else(monkeypatch):
    monkeypatch.setenv(DEFAULT_ISOLATION_ENV, "none")
    assert isolation_of(_defn("f"), None) == "none"
    monkeypatch.setenv(DEFAULT_ISOLATION_ENV, "off")
    with pytest.raises(ConfigError, match=f"{DEFAULT_ISOLATION_ENV} is 'off'; use one of 'none', 'sandbox'"):
        default_isolation()


def test_deploy_says_in_one_line_that_a_function_runs_unconfined_where_the_machine_cannot_sandbox(
    data_dir, capsys, monkeypatch
):
    _cannot_sandbox(monkeypatch)
    monkeypatch.setenv(DEFAULT_ISOLATION_ENV, "sandbox")  # asked for by default, which this machine cannot
    LocalBucket.create(data_dir, "src")
    handler = tmp_handler(data_dir)
    for name, extra in (("fn_default", {}), ("fn_none", {"isolation": "none"})):
        path = tmp_definition(data_dir, name, handler, extra)
        capsys.readouterr()
        assert main(["--data-dir", data_dir, "deploy", path]) == 0
        err = capsys.readouterr().err
        if extra:  # an admin's explicit choice: nothing to say
            assert err == ""
        else:
            (line,) = err.strip().splitlines()
            assert line.startswith(f"note: function '{name}' runs unconfined (isolation none), this machine ")
            assert NO_LANDLOCK in line


def tmp_handler(data_dir: str) -> str:
    import os

    path = os.path.join(data_dir, "handler.py")
    with open(path, "w") as f:
        f.write("def on_update(doc, meta):\n    pass\n")
    return path


def tmp_definition(data_dir: str, name: str, handler: str, extra: dict) -> str:
    import os

    path = os.path.join(data_dir, f"{name}.json")
    with open(path, "w") as f:
        json.dump({"name": name, "source_bucket": "src", "handler": handler, **extra}, f)
    return path


def _status(capsys, data_dir: str, *flags: str) -> str:
    open_store(data_dir).close()
    capsys.readouterr()
    assert main(["--data-dir", data_dir, "status", *flags]) == 0
    return capsys.readouterr().out


def _deploy_three(data_dir: str) -> None:
    LocalBucket.create(data_dir, "src")
    handler = "def on_update(doc, meta):\n    pass\n"
    for defn in (_defn("fn_default"), _defn("fn_none", isolation="none"), _defn("fn_gone", isolation="none")):
        deploy_function(data_dir, defn, handler)
    assert main(["--data-dir", data_dir, "undeploy", "fn_gone"]) == 0


@needs_sandbox
def test_status_names_in_one_line_the_functions_that_run_unconfined(data_dir, capsys, monkeypatch):
    _deploy_three(data_dir)
    lines = [line for line in _status(capsys, data_dir).splitlines() if "unconfined" in line]
    assert len(lines) == 1 and "fn_default, fn_none" in lines[0] and "fn_gone" not in lines[0], lines
    assert '"isolation": "sandbox"' in lines[0]
    shown = json.loads(_status(capsys, data_dir, "--json"))
    assert shown["unconfined"] == ["fn_default", "fn_none"]
    monkeypatch.setenv(DEFAULT_ISOLATION_ENV, "sandbox")  # the machine's default: only the explicit none left
    lines = [line for line in _status(capsys, data_dir).splitlines() if "unconfined" in line]
    assert len(lines) == 1 and "fn_none" in lines[0] and "fn_default" not in lines[0], lines
    shown = json.loads(_status(capsys, data_dir, "--json"))
    assert shown["unconfined"] == ["fn_none"]
    assert {v["name"]: v["isolation"] for v in shown["functions"]}["fn_default"] == "sandbox"


def test_status_names_every_function_when_the_machine_cannot_sandbox(data_dir, capsys, monkeypatch):
    _cannot_sandbox(monkeypatch)
    _deploy_three(data_dir)
    lines = [line for line in _status(capsys, data_dir).splitlines() if "unconfined" in line]
    assert len(lines) == 1 and "fn_default, fn_none" in lines[0] and "cannot sandbox" in lines[0], lines
    assert json.loads(_status(capsys, data_dir, "--json"))["unconfined"] == ["fn_default", "fn_none"]


PROBE = """
def on_update(doc, meta):
    try:
        open(STORE, "rb").read(1)
        out[meta.id] = {"store": "read"}
    except OSError as exc:
        out[meta.id] = {"store": type(exc).__name__}
"""


@needs_sandbox
@pytest.mark.parametrize(
    ("extra", "default", "outcome"),
    [
        ({}, None, "read"),
        ({}, "sandbox", "PermissionError"),
        ({"isolation": "sandbox"}, None, "PermissionError"),
        ({"isolation": "none"}, "sandbox", "read"),
    ],
)
def test_a_function_opens_the_metadata_store_only_where_it_runs_unconfined(
    data_dir, monkeypatch, extra, default, outcome
):
    import os

    if default is not None:
        monkeypatch.setenv(DEFAULT_ISOLATION_ENV, default)
    LocalBucket.create(data_dir, "src").upsert("k1", {"v": 1})
    store = os.path.join(data_dir, "metadata.sqlite3")
    open_store(data_dir).close()
    assert os.path.exists(store)
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_probe",
            "source_bucket": "src",
            "bindings": [{"alias": "out", "bucket": "probe_out", "access": "rw"}],
            "constants": {"STORE": store},
            **extra,
        }
    )
    deploy_function(data_dir, defn, PROBE)
    argv = ["--data-dir", data_dir, "run", "--until-caught-up", "--executor", "in-process", "--quiet"]
    assert main(argv) == 0
    assert LocalBucket.open(data_dir, "probe_out").get("k1") == {"store": outcome}
