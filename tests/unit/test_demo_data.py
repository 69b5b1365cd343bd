"""`eventing demo` drops and recreates its buckets and functions, but only those an earlier demo made there:
a user's own `customers` or `fn_email` is replaced only with --reset, and a bucket that a deployed or paused
function of the user reads or writes is never dropped (the next `eventing run` would find its source
recreated)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventing.cli import demo, main
from eventing.storage.bucket import LocalBucket

SMALL = ["demo", "--executor", "in-process", "--documents", "40", "--mutations", "80", "--json"]
ROOT = Path(__file__).resolve().parents[2]
OTHER = "def on_update(doc, meta):\n    pass\n"


@pytest.fixture(autouse=True)
def no_spark_warm_up(monkeypatch):
    monkeypatch.setattr(demo, "_warm_spark", lambda: None)  # a JVM started for nothing in a test process


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_demo_runs_again_over_what_it_made_itself(capsys, data_dir):
    dd = ["--data-dir", data_dir]
    assert run_cli(capsys, *dd, *SMALL)[0] == 0
    assert run_cli(capsys, *dd, "undeploy", "fn_score")[0] == 0  # still the demo's own
    code, _, err = run_cli(capsys, *dd, *SMALL)
    assert code == 0, err


def test_the_demo_refuses_to_replace_a_users_own_buckets_and_functions(capsys, data_dir, tmp_path):
    dd = ["--data-dir", data_dir]
    mine = LocalBucket.create(data_dir, "customers")
    mine.upsert("mine", {"kept": True})
    mine.close()
    LocalBucket.create(data_dir, "emails").close()
    assert (
        run_cli(capsys, *dd, "deploy", str(ROOT / "functions" / "fn_email.json"))[0] == 0
    )  # deployed by the user

    for reset in ([], ["--reset"]):  # a bucket a deployed function uses: never dropped
        code, out, err = run_cli(capsys, *dd, *SMALL, *reset)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
        assert "bucket 'customers'" in err and "function 'fn_email'" in err and "undeploy it first" in err

    assert run_cli(capsys, *dd, "undeploy", "fn_email")[0] == 0
    code, out, err = run_cli(capsys, *dd, *SMALL)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert (
        f"would drop and replace bucket 'customers', bucket 'emails' and function 'fn_email' in {data_dir}"
        in err
    )
    assert "--data-dir" in err and "--reset" in err
    with LocalBucket.open(data_dir, "customers") as kept:
        assert kept.get("mine") == {"kept": True}

    code, _, err = run_cli(capsys, *dd, *SMALL, "--reset")  # said so: replaced
    assert code == 0, err
    with LocalBucket.open(data_dir, "customers") as replaced:
        assert replaced.get("mine") is None
    assert run_cli(capsys, *dd, *SMALL)[0] == 0  # now the demo's own


def test_the_demo_never_drops_a_bucket_another_deployed_function_writes(capsys, data_dir, tmp_path):
    dd = ["--data-dir", data_dir]
    assert run_cli(capsys, *dd, *SMALL)[0] == 0
    (tmp_path / "fn_mine.py").write_text(OTHER)
    (tmp_path / "fn_mine.json").write_text(
        '{"name": "fn_mine", "source_bucket": "customers", "handler": "fn_mine.py",'
        ' "bindings": [{"alias": "out", "bucket": "scores", "access": "rw"}]}'
    )
    assert run_cli(capsys, *dd, "deploy", str(tmp_path / "fn_mine.json"))[0] == 0
    assert run_cli(capsys, *dd, "pause", "fn_mine")[0] == 0
    for reset in ([], ["--reset"]):
        code, out, err = run_cli(capsys, *dd, *SMALL, *reset)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
        assert "function 'fn_mine' uses and is paused" in err and "eventing undeploy fn_mine" in err
    assert run_cli(capsys, *dd, "undeploy", "fn_mine")[0] == 0
    assert run_cli(capsys, *dd, *SMALL)[0] == 0  # the buckets are the demo's own: replaced without --reset
