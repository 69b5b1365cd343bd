"""CLI defects a new user met: `--json --version`, `eventing stats` for every function, identifiers printed
without thousands separators, the rate of a short run, and the two watermarks of `eventing windows --json`
named."""

from __future__ import annotations

import json
import re

import pytest

from eventing import __version__
from eventing.cli import main
from eventing.cli.output import table
from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.ops.stats import function_stats
from eventing.ops.windows import window_status
from eventing.storage.bucket import LocalBucket
from eventing.testing import deploy_function
from eventing.workers.executor import InProcessExecutor
from metadata.factory import open_store
from sharding.vbucket import vbucket_of

FAILING = "def on_update(doc, meta):\n    raise ValueError('no luck')\n"
PASSING = "def on_update(doc, meta):\n    pass\n"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def dd(data_dir):
    return ["--data-dir", data_dir]


def two_functions(data_dir: str, documents: int = 30) -> None:
    source = LocalBucket.create(data_dir, "src")
    for i in range(documents):
        source.upsert(f"k{i}", {"n": i})
    deploy_function(
        data_dir, FunctionDefinition.from_dict({"name": "fn_ok", "source_bucket": "src"}), PASSING
    )
    deploy_function(
        data_dir, FunctionDefinition.from_dict({"name": "fn_bad", "source_bucket": "src"}), FAILING
    )
    EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()


@pytest.mark.parametrize("argv", [["--json", "--version"], ["--version", "--json"]])
def test_json_version_is_json(capsys, argv):
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0 and json.loads(out) == {"version": __version__}


def test_version_without_json_stays_text(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["--version"])
    assert caught.value.code == 0 and capsys.readouterr().out.strip() == f"eventing {__version__}"


def test_stats_without_a_name_lists_every_function(capsys, dd, data_dir):
    two_functions(data_dir)
    code, out, err = run_cli(capsys, "stats", *dd)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["function", "state", "seen"]
    rows = {line.split()[0]: line.split() for line in lines[2:] if line.startswith("fn_")}
    assert set(rows) == {"fn_ok", "fn_bad"}
    assert rows["fn_ok"][1:5] == ["deployed", "30", "30", "0"]  # seen, success, failure
    assert rows["fn_bad"][1:7] == ["deployed", "30", "0", "30", "0", "30"]  # ..., timeout, dead letters
    listed = json.loads(run_cli(capsys, "stats", "--json", *dd)[1])
    assert [s["function"] for s in listed] == sorted(s["function"] for s in listed)
    bad = {s["function"]: s for s in listed}["fn_bad"]
    assert bad == function_stats(data_dir, "fn_bad")


def test_stats_without_a_name_and_no_function_says_how_to_deploy(capsys, dd, data_dir):
    LocalBucket.create(data_dir, "src")
    open_store(data_dir).close()
    code, out, _ = run_cli(capsys, "stats", *dd)
    assert code == 0 and "no functions" in out
    assert json.loads(run_cli(capsys, "stats", "--json", *dd)[1]) == []


def test_identifiers_are_plain_integers_and_counts_keep_separators():
    text = table(["vb", "seqno", "key", "attempts"], [[1105, 123456, "k", 12345]])
    row = text.splitlines()[2].split()
    assert row == ["1105", "123456", "k", "12,345"]
    text = table(["vb", "checkpoint", "high seqno", "backlog"], [[1023, 1500, 2500, 1000]])
    assert text.splitlines()[2].split() == ["1023", "1500", "2500", "1,000"]


def test_dlq_list_prints_vbuckets_and_seqnos_without_separators(capsys, dd, data_dir):
    source = LocalBucket.create(data_dir, "src")
    deploy_function(
        data_dir, FunctionDefinition.from_dict({"name": "fn_bad", "source_bucket": "src"}), FAILING
    )
    # A key of a vBucket above 999 with more than 999 mutations: both printed with a comma before.
    key = next(k for k in (f"d{i}" for i in range(10_000)) if vbucket_of(k) >= 1000)
    for i in range(1001):
        source.upsert(key, {"n": i})
    EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    code, out, err = run_cli(capsys, "dlq", "list", "fn_bad", *dd)
    assert code == 0, err
    last = out.splitlines()[-2].split()  # the table's last row; the line after it counts the rows
    assert re.fullmatch(r"1\d\d\d", last[0]) and last[1] == "1001", out[-500:]


def test_a_sub_second_run_reports_its_real_rate_in_the_summary_and_in_stats(capsys, dd, data_dir):
    source = LocalBucket.create(data_dir, "src")
    for i in range(2000):
        source.upsert(f"k{i}", {"n": i})
    deploy_function(
        data_dir, FunctionDefinition.from_dict({"name": "fn_ok", "source_bucket": "src"}), PASSING
    )
    summary = EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    progress = summary.functions["fn_ok"]
    assert progress.handled == 2000
    assert progress.rate_mps >= progress.handled / summary.seconds * 0.9  # at least the whole run's average
    stats = function_stats(data_dir, "fn_ok")
    assert stats["throughput_of"] == "last run" and stats["throughput_mps"] > 0
    assert stats["throughput_mps"] == stats["last_run"]["mutations_per_s"]
    # Two rates, each named with the time it is over: the start-up is in `seconds`, not in `busy_s`.
    run = stats["last_run"]
    assert run["handled"] == 2000 and 0 <= run["busy_s"] <= run["seconds"]
    # handled / seconds, with `seconds` shown to 0.01 s
    assert run["handled_per_s"] * run["seconds"] == pytest.approx(2000, abs=run["handled_per_s"] * 0.005 + 1)
    assert run["mutations_per_s"] >= run["handled_per_s"]
    capsys.readouterr()
    assert main(["--data-dir", data_dir, "stats", "fn_ok"]) == 0
    shown = capsys.readouterr().out
    assert f"last_run: handled=2000 in seconds={run['seconds']} (start to stop, start-up included)" in shown
    assert f"busy_s={run['busy_s']} (first batch to last): mutations_per_s={run['mutations_per_s']}" in shown
    # Paused, it handles nothing, whatever its last run did.
    lifecycle.pause(data_dir, "fn_ok", wait_s=5)
    paused = function_stats(data_dir, "fn_ok")
    assert (paused["throughput_mps"], paused["throughput_of"]) == (0.0, None)


def test_windows_json_names_each_watermark(capsys, dd, data_dir):
    LocalBucket.create(data_dir, "src")
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_w",
            "source_bucket": "src",
            "window": {
                "kind": "tumbling",
                "size": "1m",
                "boundary": "event_time",
                "time_field": "ts",
                "aggregates": [{"op": "count"}],
                "out_of_order_tolerance": "5s",
                "late_arrival_tolerance": "5s",
            },
        }
    )
    deploy_function(data_dir, defn, "")
    status = window_status(data_dir, "fn_w")
    assert status["watermark_of"] == "vbuckets"
    assert status["watermark_is"].startswith("closing watermark: the least of the active vBuckets'")
    assert "greatest watermark" in status["arrival_policies"]["watermark_is"]
    assert "do not close" in status["arrival_policies"]["watermark_is"]
