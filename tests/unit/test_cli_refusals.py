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
