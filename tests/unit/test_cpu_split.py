"""scripts/cpu_split.py: a process's CPU is counted in the group its command line names."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cpu_split.py"


def _script():
    spec = importlib.util.spec_from_file_location("cpu_split", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads /proc")
def test_a_busy_process_is_counted_in_the_group_its_command_line_names():
    cpu_split = _script()
    # Command lines that name the service and the bench: the first spins, the second sleeps.
    spinning = subprocess.Popen([sys.executable, "-c", "while True: pass", "-m eventing"])
    sleeping = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "scripts/bench_x.py"])
    try:
        deadline = time.monotonic() + 10  # a process's command line is empty until it has started
        while cpu_split._group(str(sleeping.pid)) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        while cpu_split._group(str(spinning.pid)) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cpu_split._group(str(sleeping.pid)) == "bench (writers)"
        used, idle, cores = cpu_split.split(0.5)
    finally:
        for proc in (spinning, sleeping):
            proc.kill()
            proc.wait()
    assert used["service (eventing run, serve)"] > 0.2
    assert 0 <= idle <= cores
