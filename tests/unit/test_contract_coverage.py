"""The contract suites call every method of the interfaces they stand for: every member of the bucket
protocols (eventing/storage/protocol.py) in tests/unit/test_bucket_contract.py, every member of the
metadata store's (metadata/protocol.py) in tests/unit/test_metadata_contract.py. Whatever a layer calls on
a bucket or a store is a member of those protocols (mypy holds the callers to them), so a method added to a
protocol without a contract test fails here, naming it."""

from __future__ import annotations

import ast
from pathlib import Path

from eventing.storage import protocol as bucket_protocol
from eventing.storage.protocol import FileBucket
from metadata import protocol as metadata_protocol
from metadata.protocol import MetadataStore, WindowStateStore

UNIT = Path(__file__).parent


def _members(protocol: type) -> set[str]:
    """The methods and properties a protocol names, with those of the protocols it combines."""
    names: set[str] = set()
    for klass in protocol.__mro__:
        if klass.__module__ not in (bucket_protocol.__name__, metadata_protocol.__name__):
            continue
        for name, value in vars(klass).items():
            if (not name.startswith("_") or name in ("__enter__", "__exit__")) and (
                callable(value) or isinstance(value, property)
            ):
                names.add(name)
    return names


def _called(suite: Path) -> set[str]:
    """The attributes a test module reaches, and the context manager methods when it uses one in `with`."""
    tree = ast.parse(suite.read_text())
    called = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    if any(isinstance(node, ast.With) for node in ast.walk(tree)):
        called |= {"__enter__", "__exit__"}
    return called


def test_the_bucket_contract_suite_calls_every_member_of_the_bucket_protocols():
    members = _members(FileBucket)
    assert {"high_seqnos", "prefetch", "apply_effects", "change_documents", "dump_rows", "name"} <= members
    assert sorted(members - _called(UNIT / "test_bucket_contract.py")) == []


def test_the_metadata_contract_suite_calls_every_member_of_the_store_protocols():
    members = _members(MetadataStore) | _members(WindowStateStore)
    assert {"commit", "claim_timers", "find_dlq_rows", "window_states", "load"} <= members
    assert sorted(members - _called(UNIT / "test_metadata_contract.py")) == []
