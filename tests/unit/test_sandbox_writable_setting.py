"""`sandbox_writable` in a definition: absolute paths only, kept as given (normalized), left out of a
definition without it; only a full admin may save it, and a sandbox honours it only while an admin (or the
local CLI) deployed the function; `eventing status` says which sandboxed functions have one, and where."""

from __future__ import annotations

import json

import pytest

from eventing.cli import main
from eventing.control.lifecycle import save_function
from eventing.core.definition import FunctionDefinition
from eventing.errors import ConfigError
from eventing.storage.factory import create_bucket
from eventing.testing import deploy_function
from eventing.workers.sandbox.default import granted_writes
from eventing.workers.sandbox.landlock import sandbox_unavailable

BASE = {"name": "fn", "source_bucket": "src", "bindings": []}


def test_paths_are_kept_normalized_and_a_definition_without_them_reads_as_before():
    defn = FunctionDefinition.from_dict({**BASE, "sandbox_writable": ["/var/log/fn/", "/tmp/a/../b"]})
    assert defn.sandbox_writable == ("/var/log/fn", "/tmp/b")
    assert FunctionDefinition.from_dict(defn.to_dict()) == defn
    assert "sandbox_writable" not in FunctionDefinition.from_dict(BASE).to_dict()


@pytest.mark.parametrize("paths", [["logs"], ["/"], "/var/log", [""], [3]])
def test_anything_but_a_list_of_absolute_paths_below_the_root_is_one_line(paths):
    with pytest.raises(ConfigError, match="sandbox_writable of function 'fn'"):
        FunctionDefinition.from_dict({**BASE, "sandbox_writable": paths})


class _User:
    def __init__(self, admin: bool):
        self.user, self.is_admin = "ann", admin

    def check_bindings(self, definition: FunctionDefinition) -> None:
        pass

    def check_manages(self, name: str, keyspace) -> None:
        pass


def test_only_a_full_admin_may_save_a_grant(data_dir):
    create_bucket(data_dir, "src")
    defn = FunctionDefinition.from_dict({**BASE, "sandbox_writable": ["/var/log/fn"]})
    source = "def on_update(doc, meta):\n    pass\n"
    with pytest.raises(ConfigError, match="only a full admin may set it"):
        save_function(data_dir, defn, source, saved_by=_User(admin=False))
    assert save_function(data_dir, defn, source, saved_by=_User(admin=True)).definition[
        "sandbox_writable"
    ] == ["/var/log/fn"]


def test_a_sandbox_honours_a_grant_only_while_an_admin_deployed_the_function():
    defn = FunctionDefinition.from_dict({**BASE, "sandbox_writable": ["/var/log/fn"]})
    assert granted_writes(defn, None) == ("/var/log/fn",)  # the local CLI
    assert granted_writes(defn, {"user": "root", "admin": True}) == ("/var/log/fn",)
    assert granted_writes(defn, {"user": "ann", "admin": False}) == ()


@pytest.mark.skipif(
    sandbox_unavailable() is not None, reason="deploying a sandboxed function needs the sandbox"
)
def test_status_says_which_sandboxed_functions_write_outside_their_sandbox_and_where(
    data_dir, capsys, tmp_path
):
    create_bucket(data_dir, "src")
    handler = "def on_update(doc, meta):\n    pass\n"
    logs = tmp_path / "logs"  # beside the data directory, not around it
    logs.mkdir()
    granted = FunctionDefinition.from_dict(
        {**BASE, "name": "fn_logs", "isolation": "sandbox", "sandbox_writable": [str(logs)]}
    )
    deploy_function(data_dir, granted, handler)
    deploy_function(data_dir, FunctionDefinition.from_dict({**BASE, "isolation": "sandbox"}), handler)
    capsys.readouterr()
    assert main(["--data-dir", data_dir, "status"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "sandbox_writable" in line]
    assert lines == [f"  sandboxed, writing outside their sandbox too (sandbox_writable): fn_logs ({logs})"]
    assert main(["--data-dir", data_dir, "status", "--json"]) == 0
    views = {v["name"]: v for v in json.loads(capsys.readouterr().out)["functions"]}
    assert views["fn_logs"]["sandbox_writable"] == [str(logs)] and views["fn"]["sandbox_writable"] == []


def test_only_a_full_admin_may_save_a_window_sink_path(data_dir, tmp_path):
    """The service writes a window's results where its sink's path says (any folder or SQLite file it can
    write): a function manager could otherwise have it write into the metadata store or any folder."""
    create_bucket(data_dir, "src")
    window = {"kind": "tumbling", "size": "1m", "time_field": "ts", "aggregates": ["count"]}
    source = '"""Window-only."""\n'
    for path in (str(tmp_path / "results.sqlite3"), "metadata.sqlite3"):
        defn = FunctionDefinition.from_dict(
            {**BASE, "window": {**window, "sink": {"kind": "sqlite", "path": path}}}
        )
        with pytest.raises(ConfigError, match="window.sink.path.*only a full admin may set it"):
            save_function(data_dir, defn, source, saved_by=_User(admin=False))
        saved = save_function(data_dir, defn, source, saved_by=_User(admin=True))
        assert saved.definition["window"]["sink"]["path"] == path
    plain = FunctionDefinition.from_dict({**BASE, "window": window})
    assert save_function(data_dir, plain, source, saved_by=_User(admin=False)).definition["window"]


def test_a_window_sink_path_is_used_only_while_an_admin_saved_or_deployed_the_function(data_dir, tmp_path):
    """A definition that holds a sink path from before the save check (or an admin's, deployed by a
    function manager) writes its results to its own area while a non-admin last saved or deployed it."""
    from eventing.windows.runtime.emission import make_sink
    from eventing.windows.runtime.row_writer import RowLayout
    from metadata.factory import open_store

    create_bucket(data_dir, "src")
    given = str(tmp_path / "results.sqlite3")
    window = {
        "kind": "tumbling",
        "size": "1m",
        "time_field": "ts",
        "aggregates": ["count"],
        "sink": {"kind": "sqlite", "path": given},
    }
    defn = FunctionDefinition.from_dict({**BASE, "window": window})
    save_function(data_dir, defn, '"""Window-only."""\n', saved_by=_User(admin=True))
    layout = RowLayout.for_definition("fn", window)
    assert str(make_sink(data_dir, "fn", layout).path) == given

    with open_store(data_dir) as store:
        store.set_deployed_by("fn", {"user": "ann", "admin": False, "at": 0.0})
    assert str(make_sink(data_dir, "fn", layout).path) != given
    assert "windows" in str(make_sink(data_dir, "fn", layout).path)
