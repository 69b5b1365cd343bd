"""User mistakes on the command line are refused with one `error:` line and exit 2, before anything is
changed: an unknown function given to `run --function`, a number too large for the store, a --store that
looks like a URL of another kind."""

from __future__ import annotations

import pytest

from eventing.cli import main
from eventing.core.definition import FunctionDefinition
from eventing.storage.bucket import LocalBucket
from eventing.testing import deploy_function

PASSING = "def on_update(doc, meta):\n    pass\n"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def dd(data_dir):
    return ["--data-dir", data_dir]


def one_function(data_dir: str, name: str = "fn_ok") -> None:
    LocalBucket.create(data_dir, "src").upsert("k", {"n": 1})
    deploy_function(data_dir, FunctionDefinition.from_dict({"name": name, "source_bucket": "src"}), PASSING)


@pytest.mark.parametrize("names", [["nosuch"], ["fn_ok", "nosuch"]])
def test_run_names_an_unknown_function_instead_of_running_nothing_or_dropping_it(capsys, dd, data_dir, names):
    one_function(data_dir)
    flags = [word for name in names for word in ("--function", name)]
    code, out, err = run_cli(capsys, *dd, "run", "--until-caught-up", "--executor", "in-process", *flags)
    assert code == 2 and out == ""
    assert err.strip() == "error: unknown function 'nosuch' (known: fn_ok); see `eventing list`"


@pytest.mark.parametrize(
    "how", [["--store", "foo://bar"], ["--data-dir", "s3://user:secret@host/x"], "env"], ids=str
)
def test_a_store_that_looks_like_another_kind_of_url_is_refused_not_made_a_folder(
    capsys, tmp_path, monkeypatch, how
):
    monkeypatch.chdir(tmp_path)
    if how == "env":
        monkeypatch.setenv("EVENTING_STORE", "foo://bar")
        how = []
    code, out, err = run_cli(capsys, *how, "bucket", "create", "q")
    assert code == 2 and out == "" and list(tmp_path.iterdir()) == []
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: store location ")
    assert "postgresql://" in err and "data directory" in err and "secret" not in err


def paused_function(capsys, dd, data_dir) -> None:
    one_function(data_dir)
    assert run_cli(capsys, *dd, "run", "--until-caught-up", "--executor", "in-process", "--quiet")[0] == 0
    assert run_cli(capsys, *dd, "pause", "fn_ok")[0] == 0


TOO_LARGE = "99999999999999999999"  # above SQLite's (and PostgreSQL's bigint) 64-bit integers


@pytest.mark.parametrize("when", [TOO_LARGE, "1e400", "nan", "-5", "0001-01-01T00:00:00Z", "253402300800000"])
def test_rewind_to_a_time_out_of_range_names_the_option_and_the_range(capsys, dd, data_dir, when):
    paused_function(capsys, dd, data_dir)
    code, out, err = run_cli(capsys, *dd, "rewind", "fn_ok", "--to-time", when)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith(
        f"error: --to-time {when} is out of range; give a time from 1970-01-01T00:00:00Z to "
    )
    code, out, _ = run_cli(capsys, *dd, "rewind", "fn_ok", "--to-time", "253402300799999")  # the last one
    assert code == 0 and "9999-12-31T23:59:59.99" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["rewind", "fn_ok", "--to-seqno", TOO_LARGE],
        ["bucket", "keys", "src", "--limit", TOO_LARGE],
        ["bucket", "scan", "src", "--limit", TOO_LARGE],
        ["bucket", "export", "src", "-o", "-", "--limit", TOO_LARGE],
        ["bucket", "upsert", "src", "k", "{}", "--expiry", TOO_LARGE],
        ["bucket", "load", "src", "--documents", TOO_LARGE, "--mutations", TOO_LARGE],
        ["dlq", "list", "fn_ok", "--limit", TOO_LARGE],
        ["dlq", "show", "fn_ok", "--vb", "1", "--seqno", TOO_LARGE],
        ["dlq", "purge", "fn_ok", "--vb", TOO_LARGE],
        ["checkpoints", "fn_ok", "--vb", TOO_LARGE],
    ],
    ids=lambda argv: " ".join(argv[:2] + argv[-2:-1]),
)
def test_numbers_too_large_for_the_store_are_usage_errors_not_tracebacks(capsys, dd, data_dir, argv):
    paused_function(capsys, dd, data_dir)
    with pytest.raises(SystemExit) as caught:
        main([*dd, *argv])
    out, err = capsys.readouterr()
    assert caught.value.code == 2 and out == "" and "Traceback" not in err
    assert "must be a whole number from " in err and f"to {2**63 - 1}, got '{TOO_LARGE}'" in err


def test_bucket_expire_of_a_collection_names_its_bucket(capsys, dd, data_dir):
    LocalBucket.create(data_dir, "shop").create_collection("s1", "c1")
    code, out, err = run_cli(capsys, *dd, "bucket", "expire", "shop.s1.c1")
    assert code == 2 and out == ""
    assert err.startswith("error: 'shop.s1.c1' is a collection;") and "`eventing bucket expire shop`" in err
    code, out, err = run_cli(capsys, *dd, "bucket", "expire", "nosuch.s1.c1")  # no such bucket either
    assert code == 2 and "unknown bucket 'nosuch.s1.c1'" in err
    assert run_cli(capsys, *dd, "bucket", "expire", "shop")[0] == 0


def test_node_add_with_an_empty_ray_node_id_is_refused(capsys, dd, data_dir):
    LocalBucket.create(data_dir, "src").close()
    code, out, err = run_cli(capsys, *dd, "node", "add", "n9", "--ray-node-id", " ")
    assert code == 2 and out == "" and "--ray-node-id is empty" in err
    code, out, err = run_cli(capsys, *dd, "node", "list", "--json")
    assert code == 0 and "n9" not in out
