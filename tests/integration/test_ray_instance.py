"""`eventing ray start|stop|status` on a real Ray instance: `eventing run` joins it (and says so), the
ledger check passes for runs that join it, and `ray stop` ends exactly its processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eventing.storage.bucket import LocalBucket
from eventing.testing import check_ledger, deploy_function, ledger_definition, load_source
from eventing.workers import ray_instance

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def cli(data_dir: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, "-m", "eventing", "--data-dir", data_dir, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def pooled_workers(instance) -> set[int]:
    return {
        pid for pid in ray_instance._processes(instance) if "PooledWorkerHost" in ray_instance.cmdline(pid)
    }


def test_runs_join_the_kept_instance_and_stop_ends_only_its_processes(tmp_path):
    data_dir = str(tmp_path / "d")
    source = load_source(data_dir, 200, 3000, seed=3)
    deploy_function(data_dir, ledger_definition("fn_a", "src", "ledger", workers=2))
    assert json.loads(cli(data_dir, "ray", "status", "--json").stdout)["running"] is False

    started = cli(data_dir, "ray", "start", "--num-cpus", "2", "--workers", "2", "--json")
    assert started.returncode == 0, started.stderr
    instance = ray_instance.running(data_dir)
    assert instance is not None and json.loads(started.stdout)["address"] == instance.address
    try:
        pooled = pooled_workers(instance)
        assert len(pooled) == 2  # waiting before any run
        again = json.loads(cli(data_dir, "ray", "start", "--json").stdout)
        assert again["already_running"] is True and again["pid"] == instance.pid

        run = cli(data_dir, "run", "--until-caught-up", "--json")
        assert run.returncode == 0, run.stderr
        result = json.loads(run.stdout)
        assert result["functions"]["fn_a"]["handled"] == 3000
        assert result["startup"]["joined_ray_instance"] is True
        assert result["startup"]["first_handler_call_s"] > 0
        for i in range(50):  # more mutations for a second run, which joins the same instance again
            source.upsert(f"late::{i}", {"rev": 1})
        text = cli(data_dir, "run", "--until-caught-up").stdout
        assert "50 mutations handled" in text and "joined the `eventing ray start` instance" in text, text
        assert check_ledger(source, LocalBucket.open(data_dir, "ledger")).ok
        assert (
            pooled_workers(instance) == pooled
        )  # both runs adopted the same worker processes and gave them back
        assert ray_instance._processes(instance), "the instance's processes are found by pid"
    finally:
        stopped = cli(data_dir, "ray", "stop", "--json")
    assert json.loads(stopped.stdout)["stopped"] is True
    assert ray_instance._processes(instance) == set()
    assert ray_instance.running(data_dir) is None
    assert "no Ray instance" in cli(data_dir, "ray", "stop").stdout
