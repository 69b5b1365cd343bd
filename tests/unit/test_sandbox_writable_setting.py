"""`sandbox_writable` in a definition: absolute paths only, kept as given (normalized), left out of a
definition without it; only a full admin may save it, and a sandbox honours it only while an admin (or the
local CLI) deployed the function."""

from __future__ import annotations

import pytest

from eventing.control.lifecycle import save_function
from eventing.core.definition import FunctionDefinition
from eventing.errors import ConfigError
from eventing.storage.factory import create_bucket
from eventing.workers.sandbox.host import granted_writes

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
