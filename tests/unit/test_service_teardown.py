"""The service releases what it holds once, in reverse order of acquisition, on every way out of run()."""

from __future__ import annotations

import pytest

from eventing.control.service import EventingService
from eventing.errors import EventingError
from eventing.workers.executor import InProcessExecutor
from metadata.factory import open_store


class RecordingExecutor(InProcessExecutor):
    """In-process workers; records the executor calls the service makes, and can refuse the placements."""

    def __init__(self, refuse_placements: bool = False) -> None:
        self.refuse_placements = refuse_placements
        self.calls: list[str] = []

    def check_placements(self, placements: dict[str, str | None]) -> None:
        self.calls.append("check_placements")
        if self.refuse_placements:
            raise EventingError("eventing node 'n1' is pinned to a Ray node this cluster lacks")

    def serve(self, data_dir: str) -> None:
        self.calls.append("serve")

    def close(self) -> None:
        self.calls.append("close")


def live_services(data_dir: str) -> list[str]:
    with open_store(data_dir) as store:
        return store.live_services(60.0)


def test_a_refused_placement_still_stops_the_data_service_and_unregisters_the_service(data_dir):
    executor = RecordingExecutor(refuse_placements=True)
    service = EventingService(data_dir, executor, until_caught_up=True)
    with pytest.raises(EventingError, match="pinned"):
        service.run()
    assert executor.calls == ["check_placements", "close"]
    assert live_services(data_dir) == []
    # The lease was given back: a second service on the data directory starts at once.
    assert not EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run().errors


def test_a_clean_run_serves_then_closes_the_executor_once(data_dir):
    executor = RecordingExecutor()
    summary = EventingService(data_dir, executor, until_caught_up=True).run()
    assert not summary.errors
    assert executor.calls == ["check_placements", "serve", "close"]
    assert live_services(data_dir) == []


def test_a_standby_stopped_before_taking_over_closes_the_executor_once(data_dir):
    executor = RecordingExecutor()
    service = EventingService(data_dir, executor, standby=True)
    service.stop()  # before run(): the standby never waits for the lease
    service.run()
    assert executor.calls == ["serve", "close"]  # its data service started ahead, then stopped
    assert live_services(data_dir) == []
