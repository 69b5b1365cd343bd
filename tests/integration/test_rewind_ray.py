"""A rewind on real Ray workers: a paused function rewound to seqno 0 (effects kept) handles everything again
in separate worker processes, and the ledger shows every effect exactly once; with --reapply-effects the
effects apply a second time, as the command says."""

from __future__ import annotations

import json

import pytest

from eventing.cli import main
from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.testing import deploy_function, ledger_definition, load_source, read_call_log

pytestmark = pytest.mark.integration


def cli_json(capsys, *argv: str):
    code = main([*argv, "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else err


def test_a_rewind_on_ray_reruns_the_handlers_and_applies_no_effect_twice(
    data_dir, ray_executor, tmp_path, capsys
):
    calls = tmp_path / "calls.log"
    load_source(data_dir, 200, 2000, seed=5)
    deploy_function(data_dir, ledger_definition("fn_r", "src", "ledger", workers=2, call_log=str(calls)))
    EventingService(data_dir, ray_executor, until_caught_up=True).run()
    lifecycle.pause(data_dir, "fn_r")
    code, result = cli_json(capsys, "rewind", "fn_r", "--to-seqno", "0", "--data-dir", data_dir)
    assert code == 0 and result["mutations_again"] == 2000 and result["effects"] == "kept"
    lifecycle.resume(data_dir, "fn_r")
    summary = EventingService(data_dir, ray_executor, until_caught_up=True).run()
    assert summary.functions["fn_r"].handled == 2000
    assert sum(len(s) for s in read_call_log(calls).values()) == 4000  # every handler ran twice
    code, report = cli_json(capsys, "verify", "fn_r", "--data-dir", data_dir)
    assert code == 0 and report["handled"] == 2000 and report["duplicate_effects"] == []
    assert report["checkpoint_regressions"] == []

    lifecycle.pause(data_dir, "fn_r")
    code, result = cli_json(
        capsys, "rewind", "fn_r", "--to-seqno", "0", "--reapply-effects", "--data-dir", data_dir
    )
    assert code == 0 and result["effects"] == "reapplied"
    lifecycle.resume(data_dir, "fn_r")
    EventingService(data_dir, ray_executor, until_caught_up=True).run()
    code, report = cli_json(capsys, "verify", "fn_r", "--data-dir", data_dir)
    assert code == 1 and report["duplicate_writes"] == 2000
    assert any("--reapply-effects" in note for note in report["notes"])
