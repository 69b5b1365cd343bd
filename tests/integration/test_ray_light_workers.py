"""Worker processes of a local Ray instance started by eventing are built without Ray's Arrow and Starlette
serializers (eventing.workers.ray_setup), and still import pyarrow and pass Arrow objects through Ray."""

from __future__ import annotations

import sys

import pytest

pytestmark = pytest.mark.integration


def test_a_worker_process_starts_without_pyarrow_and_still_uses_it(ray_session):
    ray = ray_session

    @ray.remote(num_cpus=0)
    class Probe:
        def loaded(self) -> list[str]:
            return [name for name in ("pyarrow", "numpy", "starlette") if name in sys.modules]

        def total(self, table) -> int:
            import pyarrow.compute as pc

            return pc.sum(table["a"]).as_py()

        def make(self, n: int):
            import pyarrow as pa

            return pa.table({"a": list(range(n))})

    probe = Probe.remote()
    assert ray.get(probe.loaded.remote()) == []
    import pyarrow as pa

    assert ray.get(probe.total.remote(pa.table({"a": [1, 2, 3]}))) == 6
    made = ray.get(probe.make.remote(1000))
    assert made.num_rows == 1000 and made.column("a").to_pylist()[-1] == 999
    ray.kill(probe)
