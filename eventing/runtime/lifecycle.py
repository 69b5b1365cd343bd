"""Function lifecycle operations shared by the CLI and scripts: save, deploy, pause, resume, undeploy,
delete, export, status. States live in the metadata store, so a command here and a running service
in another process agree (DESIGN 3.6)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from eventing.core.definition import Boundary, FunctionDefinition, load_definition_file
from eventing.errors import ConfigError, LifecycleError
from eventing.runtime.loader import validate_handler
from eventing.storage.bucket import LocalBucket
from eventing.storage.metadata import open_metadata
from eventing.windows.runtime.paths import reset_windows
from metadata import TIMER_VB_BASE, FunctionRecord, FunctionState, MetadataStore
from sharding import NUM_VBUCKETS

# A running `eventing run` writes a heartbeat every STATE_POLL_S (0.5 s, eventing.runtime.service); a command that
# sees none this recent completes a pause or undeploy itself, since no worker is holding vBuckets.
SERVICE_STALE_S = 5.0

# Each deployment's epochs start at generation << 32, so workers of an older deployment stay fenced.
EPOCH_SHIFT = 32


def save_function(data_dir: str, defn: FunctionDefinition, source: str) -> FunctionRecord:
    """Create or update a function definition (and its handler source) without deploying it."""
    validate_handler(
        defn.name, source, [b.alias for b in defn.bindings], defn.constants, windowed=defn.window is not None
    )
    for bucket in dict.fromkeys([defn.source_bucket, *(b.bucket for b in defn.bindings)]):
        LocalBucket.open(data_dir, bucket).close()  # unknown bucket -> clear error now, not at run time
    if defn.window is not None:
        from eventing.windows.semantics import WindowSpec

        try:
            WindowSpec.from_dict(defn.window)
        except ValueError as exc:
            raise ConfigError(f"window of function '{defn.name}': {exc}") from None
    with _store(data_dir) as store:
        return store.put_function(defn.name, defn.to_dict(), source)


def save_from_file(data_dir: str, path: str | Path) -> FunctionRecord:
    defn, source = load_definition_file(path)
    return save_function(data_dir, defn, source)


def deploy(data_dir: str, name: str, boundary: Boundary | None = None) -> FunctionRecord:
    """undeployed -> deploying -> deployed: checkpoints start at the feed boundary."""
    with _store(data_dir) as store:
        record = store.get_function(name)
        defn = FunctionDefinition.from_dict(record.definition).with_boundary(boundary)
        validate_handler(
            name, record.source, [b.alias for b in defn.bindings], defn.constants, windowed=defn.window is not None
        )
        if record.state is FunctionState.UNDEPLOYED and boundary is not None:
            record = store.put_function(name, defn.to_dict(), record.source)  # remember the chosen boundary
        if record.state is not FunctionState.DEPLOYING:  # DEPLOYING: a deploy that crashed halfway; finish it
            record = store.transition(name, FunctionState.DEPLOYING, "deploy", bump_generation=True)
        try:
            source = LocalBucket.open(data_dir, defn.source_bucket)
            highs = source.high_seqnos() if defn.boundary == "from_now" else [0] * NUM_VBUCKETS
            epoch_base = record.generation << EPOCH_SHIFT
            store.init_checkpoints(name, dict(enumerate(highs)), source.uuid, epoch_base)
            store.drop_timers(name)  # left by a deploy that crashed halfway
            reset_windows(data_dir, store, name)  # window state and unaggregated rows start afresh too
            for b in defn.bindings:
                if b.access == "rw":
                    bucket = LocalBucket.open(data_dir, b.bucket)
                    bucket.drop_effect_marks(name)  # a new deployment's effects start afresh
                    bucket.fence(name, dict.fromkeys(range(TIMER_VB_BASE + NUM_VBUCKETS), epoch_base))
        except Exception:
            store.transition(name, FunctionState.UNDEPLOYED, "deploy")
            raise
        return store.transition(name, FunctionState.DEPLOYED, "deploy")


def pause(data_dir: str, name: str, *, wait_s: float = 60.0) -> FunctionRecord:
    """deployed -> pausing -> paused: workers checkpoint and stop; resume continues after the checkpoints."""
    with _store(data_dir) as store:
        store.transition(name, FunctionState.PAUSING, "pause")
        return _finish(store, name, FunctionState.PAUSED, "pause", wait_s)


def resume(data_dir: str, name: str) -> FunctionRecord:
    with _store(data_dir) as store:
        return store.transition(name, FunctionState.DEPLOYED, "resume")


def undeploy(data_dir: str, name: str, *, wait_s: float = 60.0) -> FunctionRecord:
    """deployed|paused -> undeploying -> undeployed: workers stop, checkpoints are dropped."""
    with _store(data_dir) as store:
        store.transition(name, FunctionState.UNDEPLOYING, "undeploy")
        return _finish(store, name, FunctionState.UNDEPLOYED, "undeploy", wait_s)


def delete(data_dir: str, name: str) -> None:
    with _store(data_dir) as store:
        store.delete_function(name)


def _finish(store: MetadataStore, name: str, target: FunctionState, action: str, wait_s: float) -> FunctionRecord:
    """Wait for a running service to complete a transition, or complete it here if none runs."""
    deadline = time.monotonic() + wait_s
    while store.live_services(SERVICE_STALE_S):
        record = store.get_function(name)
        if record.state is target:
            return record
        if time.monotonic() > deadline:
            raise LifecycleError(
                f"function '{name}' is still {record.state.value} after {wait_s:.0f}s; the running service "
                "will finish it; check `eventing status`"
            )
        time.sleep(0.1)
    return complete_transition(store, name, target, action)


def complete_transition(
    store: MetadataStore, name: str, target: FunctionState, action: str
) -> FunctionRecord:
    if target is FunctionState.UNDEPLOYED:
        store.drop_checkpoints(name)
        store.drop_timers(name)  # undeploy drops timers; pause keeps them
    return store.transition(name, target, action)


def export_function(data_dir: str, name: str) -> dict[str, Any]:
    with _store(data_dir, create=False) as store:
        record = store.get_function(name)
    return {**record.definition, "handler_source": record.source}


def import_definitions(data_dir: str, data: Any) -> list[FunctionRecord]:
    items = data if isinstance(data, list) else [data]
    out = []
    for item in items:
        if not isinstance(item, dict) or "handler_source" not in item:
            raise ConfigError("an exported function must be a JSON object with 'handler_source'")
        out.append(save_function(data_dir, FunctionDefinition.from_dict(item), item["handler_source"]))
    return out


class _store:
    """`with _store(dir) as store:` opens the metadata store for one command and closes it."""

    def __init__(self, data_dir: str, create: bool = True):
        self.store = open_metadata(data_dir, create=create)

    def __enter__(self) -> MetadataStore:
        return self.store

    def __exit__(self, *exc: object) -> None:
        self.store.close()
