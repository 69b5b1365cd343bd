"""Shared fixtures: a fresh data directory per test; one Ray instance and one Spark session per test
session."""

from __future__ import annotations

import gc
import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# A machine's default isolation for admins' functions (eventing.workers.sandbox.default) is pinned to the
# product's default, whatever the shell running the suite sets: most tests' handlers write call logs into the
# test's own folder and their faults are injected into the worker in this process, which a sandboxed handler
# cannot reach. Tests ask for the sandbox with `"isolation": "sandbox"`; the tests of the default set it
# themselves (tests/unit/test_default_isolation.py).
os.environ["EVENTING_DEFAULT_ISOLATION"] = "none"
# Hypothesis runs the "hypothesis" entry points of every installed package when it is imported: trio's (a
# dependency of selenium) imports trio and registers its random generator, which makes Hypothesis collect
# and search the whole heap; no test uses trio, and each process importing Hypothesis (the xdist processes,
# and the main one at the end of the run, its heap full of reports) saved from ~0.15 s to over a second.
os.environ.setdefault("HYPOTHESIS_NO_PLUGINS", "1")


def pytest_collection_finish(session):
    """What collection made (the modules, the items, their marks: about half of a test process's objects)
    lives until the end: it is moved out of the garbage collector's reach, so that each of the process's
    full collections does not go through it again."""
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    """Soak variants run only when `-m` names them (scripts/soak.sh): the `-m 'not soak'` of addopts is
    replaced by any `-m` given on the command line, so `-m "not integration"` would run them too."""
    if "soak" in (config.getoption("markexpr") or ""):
        return
    soak = [item for item in items if item.get_closest_marker("soak")]
    if soak:
        config.hook.pytest_deselected(items=soak)
        items[:] = [item for item in items if not item.get_closest_marker("soak")]


# How often a running service looks at what changed around it: unit tests wait on those looks (a pause, a
# node's health, the dead-letter counts of the progress, a standby's look at the leader's lease) far more
# than on work. They check what the service does, not how soon, so they run it with short looks; the
# integration tests keep the product's pace.
QUICK_POLLS = {
    "eventing.control.service.STATE_POLL_S": 0.05,
    "eventing.control.service.DEAD_LETTERS_EVERY_S": 0.05,
    "eventing.control.service.HEALTH_POLL_S": 0.05,
    "eventing.control.service.STANDBY_POLL_S": 0.05,
    # how long a PostgreSQL store's notification sender trusts what it read of who listens
    "eventing.storage.postgres.wake.INTEREST_REFRESH_S": 0.2,
}


@pytest.fixture(autouse=True)
def quick_polls(request, monkeypatch):
    if request.node.get_closest_marker("integration") is None:
        for target, value in QUICK_POLLS.items():
            monkeypatch.setattr(target, value)


# Tests of these modules share nothing with each other (each docs page runs in a fresh copy of the checkout):
# with `--dist loadscope` they are spread one by one over the xdist processes.
SPREAD_MODULES = ("tests/integration/test_docs_examples.py",)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadscope` (the integration run of scripts/test.sh): a module's tests go to one process, as its
    clusters, services and Spark sessions are started once per module (pytest-xdist would split a module by
    its classes), except the modules of SPREAD_MODULES. (`--dist loadgroup` does not work with pytest 9:
    xdist marks a group in `item._nodeid`, which pytest no longer reads.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return nodeid if module in SPREAD_MODULES else module

    return ModuleScheduling(config, log)


@pytest.fixture
def data_dir(tmp_path) -> str:
    path = tmp_path / "data"
    path.mkdir()
    return str(path)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance for the whole session (start-up costs seconds; keep it out of each test)."""
    import ray

    from eventing.workers.executor import init_ray

    init_ray(num_cpus=2)
    yield ray
    ray.shutdown()


@pytest.fixture
def ray_executor(ray_session):
    from eventing.workers.executor import RayExecutor

    return RayExecutor()


@pytest.fixture(params=["in-process", pytest.param("ray", marks=pytest.mark.integration)])
def executor_kind(request) -> str:
    """The executor a scenario runs on, each scenario once per kind (as bytewax runs each test under run_main
    and cluster_main): "in-process" in the unit run, "ray" (marked integration) in the integration run."""
    return request.param


@pytest.fixture
def executor(executor_kind, request):
    """An executor of `executor_kind`: InProcessExecutor, or a RayExecutor on the session's Ray instance."""
    if executor_kind == "ray":
        return request.getfixturevalue("ray_executor")
    from eventing.workers.executor import InProcessExecutor

    return InProcessExecutor()


@pytest.fixture(scope="session")
def spark():
    """The process's one SparkSession (local[2]) for the whole session: a cold start costs ~10 s. The
    runtime's window coordinators pick up the same session through get_spark()."""
    from eventing.windows.spark.spark_session import get_spark, stop_spark

    session = get_spark("local[2]")
    yield session
    stop_spark()


@pytest.fixture(scope="session")
def pg_server():
    """One throwaway PostgreSQL server per test process (eventing.testing.postgres), started on first use.
    Tests that need PostgreSQL fail (never skip) where it cannot start: CI installs it (scripts/setup.sh)."""
    from eventing.testing.postgres import ThrowawayPostgres

    server = ThrowawayPostgres()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server, request) -> str:
    """A fresh, empty database on the session's server: its URL (postgresql://postgres@127.0.0.1:PORT/DB)."""
    import re
    import uuid

    name = re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:40] + "_" + uuid.uuid4().hex[:8]
    return pg_server.create_database(name)


@pytest.fixture(params=["directory", "postgresql"])
def window_files(request, monkeypatch) -> str:
    """Where the windowed functions of this test keep their files and default sink: "directory" (under the
    data directory, as always) or "postgresql" (every `State.file_area` of a data directory is the files
    table of a fresh database on the session's PostgreSQL server, so the window runtime's files and its
    default sink are there, while the metadata and buckets stay in the data directory; in-process only)."""
    if request.param == "postgresql":
        from eventing.storage.postgres.file_area import PostgresArea
        from eventing.storage.state import DirectoryState

        url = request.getfixturevalue("pg_url")
        monkeypatch.setattr(DirectoryState, "file_area", lambda self, root: PostgresArea.open(url, root))
    return request.param


@pytest.fixture(scope="session")
def pg_shared_database(pg_server) -> str:
    """One database of the session's server that tests share, each in a schema of its own (pg_schema_url)."""
    return pg_server.create_database("shared")


@pytest.fixture
def pg_schema_url(pg_shared_database, request) -> str:
    """A fresh, empty schema of the session's shared database: its store URL (…/shared?schema=NAME). Creating
    it costs well under a millisecond where a database costs ~0.5 s, so suites that run every test on
    PostgreSQL (the metadata contract) use this; the store creates the schema on first use."""
    import re
    import uuid

    name = re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:40] + "_" + uuid.uuid4().hex[:8]
    return f"{pg_shared_database}?schema={name}"
