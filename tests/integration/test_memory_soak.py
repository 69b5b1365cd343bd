"""Service and worker memory stays flat as runs get longer: 10M mutations against 1M
(scripts/bench_memory.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.soak]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_rss_flat_from_1m_to_10m_mutations(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "bench_memory.py"),
            "--mutations",
            "1000000",
            "10000000",
            "--work-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
        timeout=3600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    print(result.stdout)
    small, large = json.loads(result.stdout.strip().splitlines()[-1])["curve"]
    # Ten times the mutations over the same documents: the same memory, within noise (allocator, GC timing).
    for part in ("service_mb", "workers_mb"):
        assert large[part] <= small[part] * 1.15 + 30, (part, small, large)
