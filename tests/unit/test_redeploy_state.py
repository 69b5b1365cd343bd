"""What a deployment starts from: state an earlier deployment left behind (timeout dead letters, replay
marks, counters) never makes a fresh deployment skip or double a mutation (docs/guarantees.md, 'What each
deployment starts from'). In-process executor, real SQLite, driven through the CLI as a user would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eventing.cli import main
from eventing.storage.bucket import LocalBucket
from metadata.factory import open_store

LOOPING = """
def on_update(doc, meta):
    if doc.get("loop"):
        while True:
            pass
    if doc.get("bad"):
        raise ValueError("bad document " + meta.id)
    dst[meta.id] = doc
"""

FIXED = """
def on_update(doc, meta):
    dst[meta.id] = doc
"""


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def dd(data_dir):
    return ["--data-dir", data_dir]


def write_function(tmp_path: Path, handler: str) -> Path:
    (tmp_path / "h.py").write_text(handler)
    spec = {
        "name": "fl",
        "source_bucket": "src",
        "handler": "h.py",
        "worker_count": 1,
        "execution_timeout": "300ms",
        "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
    }
    path = tmp_path / "fl.json"
    path.write_text(json.dumps(spec))
    return path


def setup(capsys, dd, tmp_path: Path, rows: list[dict]) -> Path:
    for bucket in ("src", "dst"):
        assert cli(capsys, "bucket", "create", bucket, *dd)[0] == 0
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cli(capsys, "bucket", "load", "src", "--file", str(tmp_path / "in.jsonl"), *dd)[0] == 0
    return write_function(tmp_path, LOOPING)


def run(capsys, dd) -> int:
    return cli(capsys, "run", "--until-caught-up", "--executor", "in-process", *dd)[0]


def dst_keys(data_dir: str) -> list[str]:
    with LocalBucket.open(data_dir, "dst") as bucket:
        return sorted(bucket.keys())


def redeploy_fixed(capsys, dd, tmp_path: Path) -> None:
    write_function(tmp_path, FIXED)
    assert cli(capsys, "undeploy", "fl", *dd)[0] == 0
    assert cli(capsys, "create", str(tmp_path / "fl.json"), *dd)[0] == 0
    assert cli(capsys, "deploy", "fl", *dd)[0] == 0


def test_a_mutation_that_timed_out_is_handled_by_a_fresh_deployment_of_the_fixed_handler(
    capsys, dd, data_dir, tmp_path
):
    rows = [{"key": "a", "doc": {"x": 1}}, {"key": "b", "doc": {"loop": True}}, {"key": "c", "doc": {"x": 3}}]
    defn = setup(capsys, dd, tmp_path, rows)
    assert cli(capsys, "deploy", str(defn), *dd)[0] == 0
    assert run(capsys, dd) == 3  # a run that dead-lettered something says so
    assert dst_keys(data_dir) == ["a", "c"]
    redeploy_fixed(capsys, dd, tmp_path)
    assert run(capsys, dd) == 0
    assert dst_keys(data_dir) == ["a", "b", "c"]


def test_a_mutation_that_fails_under_two_deployments_counts_the_same_in_stats_and_the_dlq(
    capsys, dd, data_dir, tmp_path
):
    rows = [{"key": "a", "doc": {"x": 1}}, {"key": "b", "doc": {"bad": True}}]
    defn = setup(capsys, dd, tmp_path, rows)
    assert cli(capsys, "deploy", str(defn), *dd)[0] == 0
    assert run(capsys, dd) == 3
    assert cli(capsys, "undeploy", "fl", *dd)[0] == 0
    assert cli(capsys, "deploy", "fl", *dd)[0] == 0
    assert run(capsys, dd) == 3
    with open_store(data_dir) as store:
        letters = store.find_dlq_rows("fl", include_replayed=True)
        generation = store.get_function("fl").generation
        errors = store.counters("fl").get("dlq_error", 0)
    assert [(r.key, r.attempts, r.generation) for r in letters] == [("b", 2, generation)]
    assert errors == sum(r.attempts for r in letters) == 2


def test_a_letter_replayed_once_and_failing_again_after_a_redeploy_is_replayed_again(
    capsys, dd, data_dir, tmp_path
):
    """The replay marks of the first replay must not make the second look like a duplicate."""
    rows = [{"key": "b", "doc": {"bad": True}}]
    defn = setup(capsys, dd, tmp_path, rows)
    assert cli(capsys, "deploy", str(defn), *dd)[0] == 0
    assert run(capsys, dd) == 3
    write_function(tmp_path, FIXED)
    assert cli(capsys, "pause", "fl", *dd)[0] == 0
    assert cli(capsys, "create", str(tmp_path / "fl.json"), *dd)[0] == 0
    assert cli(capsys, "dlq", "replay", "fl", "--all", *dd)[0] == 0
    assert dst_keys(data_dir) == ["b"]
    with LocalBucket.open(data_dir, "dst") as bucket:
        bucket.delete("b")  # someone removes the effect; the next failure and replay must write it again
    assert cli(capsys, "undeploy", "fl", *dd)[0] == 0
    write_function(tmp_path, LOOPING)
    assert cli(capsys, "create", str(tmp_path / "fl.json"), *dd)[0] == 0
    assert cli(capsys, "deploy", "fl", *dd)[0] == 0
    assert run(capsys, dd) == 3  # fails again under the new deployment: the letter comes back
    assert dst_keys(data_dir) == []
    write_function(tmp_path, FIXED)
    assert cli(capsys, "pause", "fl", *dd)[0] == 0
    assert cli(capsys, "create", str(tmp_path / "fl.json"), *dd)[0] == 0
    code, out, err = cli(capsys, "dlq", "replay", "fl", "--all", "--json", *dd)
    assert code == 0, err
    assert dst_keys(data_dir) == ["b"]
