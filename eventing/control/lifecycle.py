"""Function lifecycle operations shared by the CLI and scripts: save, deploy, pause, resume, undeploy,
delete, export, status. States live in the metadata store, so a command here and a running service
in another process agree (see docs/architecture.md, 'Function states')."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Protocol

from eventing.core.couchbase_format import from_couchbase, is_couchbase_function, to_couchbase
from eventing.core.definition import Boundary, FunctionDefinition, load_definition_file
from eventing.core.keyspaces import Keyspace
from eventing.core.secrets import mask_definition, restore_secrets
from eventing.errors import ConfigError, LifecycleError, NotFoundError, fix
from eventing.execution.loader import validate_handler
from eventing.execution.static_check import check_handler_source
from eventing.storage.keyspace import check_keyspace_exists, collection_id
from eventing.storage.protocol import BucketDocuments
from eventing.storage.state import StateLike, as_state
from eventing.windows.runtime.paths import reset_windows
from eventing.workers.sandbox.default import isolation_of
from metadata import TIMER_VB_BASE, FunctionRecord, FunctionState, MetadataStore
from sharding import NUM_VBUCKETS

# A running `eventing run` writes a heartbeat every STATE_POLL_S (0.5 s, eventing.control.service); a command
# that sees none this recent completes a pause or undeploy itself, since no worker is holding vBuckets.
SERVICE_STALE_S = 5.0

# Each deployment's epochs start at generation << 32, so workers of an older deployment stay fenced.
EPOCH_SHIFT = 32


class Saver(Protocol):
    """Who saves, deploys or resumes a function through the REST API (eventing.http.auth.Identity); None
    stands for the local CLI and the Python API, trusted as an admin."""

    @property
    def user(self) -> str: ...

    @property
    def is_admin(self) -> bool: ...

    def check_bindings(self, definition: FunctionDefinition) -> None:
        """Raise unless this caller may read (and write) every bucket binding of `definition`."""

    def check_manages(self, name: str, keyspace: Keyspace) -> None:
        """Raise unless this caller manages functions whose source is `keyspace`."""


def _validate(state: StateLike, defn: FunctionDefinition, source: str, deployed_by: dict | None) -> None:
    """Import the handler module (its top-level code runs) and check its entry points: in a sandboxed
    child when the function runs sandboxed (eventing.workers.sandbox), else here. Only deploy and resume
    import a handler; saving checks it without running it (check_handler_source)."""
    if isolation_of(defn, deployed_by) == "sandbox":
        from eventing.workers.sandbox.default import granted_writes
        from eventing.workers.sandbox.host import validate_sandboxed

        validate_sandboxed(state, defn, source, granted_writes(defn, deployed_by))
        return
    validate_handler(
        defn.name,
        source,
        [b.alias for b in defn.bindings],
        defn.constants,
        windowed=defn.window is not None,
        language=defn.language,
    )


def batch_refused_by(defn: FunctionDefinition) -> str | None:
    """The setting of `defn` that on_batch(batch) cannot take, named for the error (None: none)."""
    if defn.concurrency > 1:
        return f"concurrency {defn.concurrency}"
    if defn.previous_version:
        return "previous_version"
    return None


def save_function(
    state: StateLike, defn: FunctionDefinition, source: str, *, saved_by: Saver | None = None
) -> FunctionRecord:
    """Create or update a function definition (and its handler source) without deploying it. None of the
    handler's code runs here: it is checked statically (check_handler_source) and imported at deploy.

    `saved_by` (None: the local CLI, trusted as an admin) must hold a role for every bucket binding; a
    URL binding's stored secret kept with the mask (`*****`) follows a non-admin's edit only while the
    binding's url, auth and verify_tls stay as stored; and a non-admin's save marks the function's code
    as a non-admin's (`deployed_by`), so nothing runs it unsandboxed before an admin deploys or resumes it."""
    state = as_state(state)
    check_handler_source(
        defn.name,
        source,
        windowed=defn.window is not None,
        language=defn.language,
        batch_refused_by=batch_refused_by(defn),
    )
    trusted = saved_by is None or saved_by.is_admin
    if not trusted and defn.sandbox_writable:
        raise ConfigError(
            f"function '{defn.name}' sets sandbox_writable, which opens folders outside its sandbox to its "
            "handler: only a full admin may set it; remove it, or ask an admin to save the function"
        )
    sink = (defn.window or {}).get("sink")
    if not trusted and isinstance(sink, dict) and sink.get("path") is not None:
        raise ConfigError(
            f"function '{defn.name}' sets window.sink.path, a place anywhere the service may write where it "
            "puts the window results: only a full admin may set it; remove it (the results then go to the "
            "function's own window area), or ask an admin to save the function"
        )
    if saved_by is not None:
        saved_by.check_manages(defn.name, defn.source_keyspace)
        saved_by.check_bindings(defn)
    for bucket in dict.fromkeys([defn.source_bucket, *(b.bucket for b in defn.bindings)]):
        with state.open_bucket(bucket) as opened:  # unknown bucket -> clear error now, not at run time
            # and an unknown scope or collection of the source or a binding (a wildcard source: its scope)
            for keyspace in [defn.source_keyspace, *(b.keyspace for b in defn.bindings)]:
                if keyspace.bucket == bucket:
                    check_keyspace_exists(opened, keyspace)
            _refuse_mirror_writes(opened, defn)
    if defn.window is not None:
        from eventing.windows.semantics import WindowSpec

        try:
            WindowSpec.from_dict(defn.window)
        except ValueError as exc:
            raise ConfigError(f"window of function '{defn.name}': {exc}") from None
    with _store(state) as store:
        stored = _stored(store, defn.name)
        if stored is not None and saved_by is not None:  # the function as stored is the caller's to change
            saved_by.check_manages(defn.name, FunctionDefinition.from_dict(stored.definition).source_keyspace)
        definition = restore_secrets(defn.to_dict(), stored.definition if stored else None, trusted=trusted)
        if stored is not None and stored.state is FunctionState.PAUSED:
            _refuse_source_change(stored, definition)
        if trusted:
            return store.put_function(defn.name, definition, source)
        assert saved_by is not None
        mark = {"user": saved_by.user, "admin": False, "at": time.time(), "saved": True}
        if (
            stored is None
        ):  # a new function: nothing runs an undeployed one before its deploy records its deployer
            store.put_function(defn.name, definition, source)
            store.set_deployed_by(defn.name, mark)
            return store.get_function(defn.name)
        # Marked first, so no moment has a non-admin's code stored as an admin's; a refused save puts it back.
        store.set_deployed_by(defn.name, mark)
        try:
            return store.put_function(defn.name, definition, source)
        except BaseException:
            store.set_deployed_by(defn.name, stored.deployed_by)
            raise


def _refuse_mirror_writes(bucket: BucketDocuments, defn: FunctionDefinition) -> None:
    """ConfigError naming the binding, its collection and the fix when a read-write binding of `defn` names a
    collection of `bucket` that mirrors a table: its documents are written by its mirror alone. (A binding
    over several collections, `scope.*`, may write its others; its writes into a mirror are refused as they
    are made, and the mutation is dead-lettered.)"""
    mirrors: dict[int, str] | None = None
    for b in defn.bindings:
        if b.access != "rw" or b.bucket != bucket.name or b.keyspace.is_wildcard or b.keyspace.is_default:
            continue
        mirrors = bucket.mirrors() if mirrors is None else mirrors
        shown = mirrors.get(collection_id(bucket, b.keyspace))
        if shown is not None:
            raise ConfigError(
                f"binding '{b.alias}' of function '{defn.name}' is read-write on '{b.keyspace}', which "
                f"mirrors {shown} and is written by the mirror alone; bind it read-only (access 'r')"
            )


def check_mirror_bindings(state: StateLike, defn: FunctionDefinition) -> None:
    """_refuse_mirror_writes for every bucket `defn` binds read-write (at deploy and resume: a collection
    may have become a mirror since the definition was saved)."""
    for name in dict.fromkeys(b.bucket for b in defn.bindings if b.access == "rw"):
        with as_state(state).open_bucket(name) as opened:
            _refuse_mirror_writes(opened, defn)


def _stored(store: MetadataStore, name: str) -> FunctionRecord | None:
    try:
        return store.get_function(name)
    except NotFoundError:
        return None


def _refuse_source_change(stored: FunctionRecord, definition: dict[str, Any]) -> None:
    """A paused function resumes from checkpoints of its source bucket's vBuckets, so a new source would
    make them meaningless (the service would refuse to run it)."""
    old, new = stored.definition["source_bucket"], definition["source_bucket"]
    if old != new:
        raise LifecycleError(
            f"cannot change the source bucket of function '{stored.name}' from '{old}' to '{new}': the "
            "source of a paused function cannot change, its checkpoints belong to the old source; undeploy "
            "it, then deploy the new definition"
        )


def save_from_file(state: StateLike, path: str | Path) -> FunctionRecord:
    defn, source = load_definition_file(path)
    return save_function(state, defn, source)


def deploy(state: StateLike, name: str, boundary: Boundary | None = None) -> FunctionRecord:
    """undeployed -> deploying -> deployed: checkpoints start at the feed boundary."""
    state = as_state(state)
    with _store(state) as store:
        record = store.get_function(name)
        defn = FunctionDefinition.from_dict(record.definition).with_boundary(boundary)
        if isolation_of(defn, record.deployed_by) == "sandbox":
            from eventing.workers.sandbox.landlock import sandbox_unavailable

            why = sandbox_unavailable()
            if why:  # never run it unsandboxed instead
                raise ConfigError(f"function '{name}' must run sandboxed and cannot be deployed here: {why}")
        check_mirror_bindings(state, defn)
        _validate(state, defn, record.source, record.deployed_by)
        if record.state is FunctionState.UNDEPLOYED and boundary is not None:
            record = store.put_function(name, defn.to_dict(), record.source)  # remember the chosen boundary
        if record.state is not FunctionState.DEPLOYING:  # DEPLOYING: a deploy that crashed halfway; finish it
            record = store.transition(name, FunctionState.DEPLOYING, "deploy", bump_generation=True)
        try:
            with state.open_bucket(defn.source_bucket) as source:
                highs = source.high_seqnos() if defn.boundary == "from_now" else [0] * NUM_VBUCKETS
                source_uuid = source.uuid
            epoch_base = record.generation << EPOCH_SHIFT
            store.init_checkpoints(name, dict(enumerate(highs)), source_uuid, epoch_base)
            _resolve_letters_handled_again(store, name, record.generation, highs)
            store.drop_timers(name)  # left by a deploy that crashed halfway
            reset_windows(state, store, name)  # window state and unaggregated rows start afresh too
            for b in defn.bindings:
                if b.access == "rw":
                    with state.open_bucket(b.bucket) as bucket:
                        bucket.drop_effect_marks(name)  # a new deployment's effects start afresh
                        bucket.fence(name, dict.fromkeys(range(TIMER_VB_BASE + NUM_VBUCKETS), epoch_base))
            run_on_deploy(state, store, record, "deploy")
        except Exception:
            store.drop_checkpoints(name)
            store.drop_timers(name)
            store.transition(name, FunctionState.UNDEPLOYED, "deploy")
            raise
        return store.transition(name, FunctionState.DEPLOYED, "deploy")


def _resolve_letters_handled_again(
    store: MetadataStore, name: str, generation: int, starts: list[int]
) -> None:
    """Dead letters of earlier deployments whose mutation this deployment handles again (after its feed
    boundary) are resolved, shown as replayed at the deploy: the new deployment's handler decides their
    fate (a new failure brings the letter back), so a later `dlq replay --all` cannot apply their effects a
    second time. Letters before the boundary, and timer callbacks' (timers start afresh), stay pending."""
    again = [
        (row.vb, row.seqno)
        for row in store.find_dlq_rows(name)
        if row.generation < generation and row.vb < NUM_VBUCKETS and row.seqno > starts[row.vb]
    ]
    if again:
        store.mark_replayed(name, again)


def run_on_deploy(state: StateLike, store: MetadataStore, record: FunctionRecord, reason: str) -> None:
    """Run the handler's `on_deploy(action)`, if it defines one, once, before any mutation (Couchbase 8.0).

    Its binding writes apply exactly once per deployment (deploy) or per pause (resume): they are marked
    under `<function>#on_deploy:<generation>:<reason>:<ms>` (a deploy or resume retried after a crash has
    the same name and applies nothing twice). Timers it creates become durable here. A failure or a
    timeout raises LifecycleError naming the error; the caller keeps the function undeployed or paused.
    """
    from eventing.core.mutation import OP_UPDATE, Mutation
    from eventing.execution.runner import HandlerCall, writes_by_bucket
    from eventing.handler import DeployAction
    from eventing.storage.origins import deployment_origin
    from eventing.storage.values import EffectGroup
    from eventing.workers.sandbox.host import SandboxedRunner, open_runner

    # A sandboxed function's on_deploy runs in a sandboxed child; its writes and timers come back here.
    runner = open_runner(state, record.name, record)
    try:
        delay = int(time.time() - record.updated_at) if reason == "resume" else 0
        if isinstance(runner, SandboxedRunner):
            found, failure = runner.on_deploy(reason, delay)
            if not found:
                return
        else:
            fn = runner.module.__dict__.get("on_deploy")
            if fn is None:
                return
            m = Mutation(0, 1, "", OP_UPDATE, 0, None, None, 0, 0)
            runner.timers.lookup = lambda callback, reference: store.get_timer(
                record.name, callback, reference
            )
            failure = runner.call(
                m,
                HandlerCall("on_update", fn, (DeployAction(reason, delay),), None),
                timeout_s=runner.timeout_s,
            )
        if failure is not None:
            raise LifecycleError(
                f"on_deploy of function '{record.name}' failed ({failure.error or failure.status}); the "
                f"function stays {'undeployed' if reason == 'deploy' else 'paused'}; fix the handler and "
                f"{reason} again"
            )
        namespace = f"{record.name}#on_deploy:{record.generation}:{reason}:{int(record.updated_at * 1000)}"
        for bucket, writes in writes_by_bucket(runner.take_writes()):
            bucket.apply_effects(
                namespace,
                [EffectGroup(0, 0, writes, conditional=True)],
                origin=deployment_origin(record.name, record.generation),
            )
        if runner.timers.kept:
            epochs = {vb: cp.epoch for vb, cp in store.checkpoints(record.name).items()}
            store.commit(record.name, epochs, {}, timer_changes=list(runner.timers.kept))
    finally:
        runner.close()


def pause(state: StateLike, name: str, *, wait_s: float = 60.0) -> FunctionRecord:
    """deployed -> pausing -> paused: workers checkpoint and stop; resume continues after the checkpoints."""
    with _store(state) as store:
        store.transition(name, FunctionState.PAUSING, "pause")
        return _finish(store, name, FunctionState.PAUSED, "pause", wait_s)


def resume(state: StateLike, name: str) -> FunctionRecord:
    """paused -> deployed; `on_deploy(action)` runs first (a failure keeps the function paused)."""
    with _store(state) as store:
        record = store.get_function(name)
        if record.state is FunctionState.PAUSED:
            check_mirror_bindings(state, FunctionDefinition.from_dict(record.definition))
            run_on_deploy(state, store, record, "resume")
        return store.transition(name, FunctionState.DEPLOYED, "resume")


def undeploy(state: StateLike, name: str, *, wait_s: float = 60.0) -> FunctionRecord:
    """deployed|paused -> undeploying -> undeployed: workers stop, checkpoints are dropped."""
    with _store(state) as store:
        store.transition(name, FunctionState.UNDEPLOYING, "undeploy")
        return _finish(store, name, FunctionState.UNDEPLOYED, "undeploy", wait_s)


def delete(state: StateLike, name: str) -> None:
    with _store(state) as store:
        store.delete_function(name)


def _finish(
    store: MetadataStore, name: str, target: FunctionState, action: str, wait_s: float
) -> FunctionRecord:
    """Wait for a running service to complete a transition, or complete it here if none runs."""
    deadline = time.monotonic() + wait_s
    while store.live_services(SERVICE_STALE_S):
        record = store.get_function(name)
        if record.state is target:
            return record
        if time.monotonic() > deadline:
            raise LifecycleError(
                f"function '{name}' is still {record.state.value} after {wait_s:.0f}s; the running service "
                "will finish it; check {fix}",
                fix=fix("status"),
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


def export_function(state: StateLike, name: str, *, with_secrets: bool = False) -> dict[str, Any]:
    """The definition with its handler source; URL binding secrets masked (`*****`) unless with_secrets."""
    with _store(state) as store:
        record = store.get_function(name)
    definition = record.definition if with_secrets else mask_definition(record.definition)
    return {**definition, "handler_source": record.source}


def import_definitions(state: StateLike, data: Any, *, saved_by: Saver | None = None) -> list[FunctionRecord]:
    items = data if isinstance(data, list) else [data]
    out = []
    for item in items:
        if is_couchbase_function(item):  # saved as it is; import_functions also carries out its status
            converted = from_couchbase(item)
            out.append(save_function(state, converted.definition, converted.source, saved_by=saved_by))
            continue
        if not isinstance(item, dict) or "handler_source" not in item:
            raise ConfigError(
                "an exported function must be a JSON object with 'handler_source' (or Couchbase's "
                "export, with appname, appcode and depcfg)"
            )
        out.append(
            save_function(
                state, FunctionDefinition.from_dict(item), item["handler_source"], saved_by=saved_by
            )
        )
    return out


def import_functions(
    state: StateLike,
    data: Any,
    *,
    deploying: Callable[[str], AbstractContextManager[Any]] | None = None,
    saved_by: Saver | None = None,
) -> tuple[list[FunctionRecord], list[str]]:
    """Import functions in either format, detected per function: this project's export, or Couchbase's
    (one function or a list), whose deployment_status/processing_status are then carried out (deploy, pause,
    resume or undeploy, at the function's dcp_stream_boundary). All are converted and checked before any is
    saved. Returns the records and the warnings naming what Couchbase's format had that does nothing here.
    `deploying(name)` wraps each deploy and resume (the REST API records the caller and checks its roles);
    `saved_by` is who saves them (see save_function)."""
    items = data if isinstance(data, list) else [data]
    plans: list[tuple[FunctionDefinition, str, str | None]] = []
    warnings: list[str] = []
    for item in items:
        if is_couchbase_function(item):
            converted = from_couchbase(item)
            plans.append((converted.definition, converted.source, converted.state))
            warnings.extend(converted.warnings)
        elif isinstance(item, dict) and "handler_source" in item:
            plans.append((FunctionDefinition.from_dict(item), item["handler_source"], None))
        else:
            raise ConfigError(
                "an exported function must be a JSON object with 'handler_source' (or Couchbase's "
                "export, with appname, appcode and depcfg)"
            )
    for (
        defn,
        source,
        _,
    ) in plans:  # refused before any is saved: a role short of a binding, a handler that cannot load
        if saved_by is not None:
            saved_by.check_bindings(defn)
        check_handler_source(
            defn.name,
            source,
            windowed=defn.window is not None,
            language=defn.language,
            batch_refused_by=batch_refused_by(defn),
        )
    out = []
    for defn, source, wanted in plans:
        record = save_function(state, defn, source, saved_by=saved_by)
        if wanted is not None:
            record = set_state(state, defn.name, wanted, deploying=deploying)
        out.append(record)
    return out, warnings


def set_state(
    state: StateLike,
    name: str,
    target: str,
    *,
    boundary: Boundary | None = None,
    wait_s: float = 60.0,
    deploying: Callable[[str], AbstractContextManager[Any]] | None = None,
) -> FunctionRecord:
    """Bring a function to `target` (deployed, paused or undeployed) the way Couchbase's deployment_status and
    processing_status do: deploy, pause, resume or undeploy as its state needs (an undeployed function asked
    to be paused is deployed, then paused); nothing when it is there already."""
    guard = deploying or (lambda _name: nullcontext())
    with _store(state) as store:
        now = store.get_function(name).state
    if target == "undeployed":
        if now in (FunctionState.DEPLOYED, FunctionState.PAUSED):
            return undeploy(state, name, wait_s=wait_s)
    elif target in ("deployed", "paused"):
        if now is FunctionState.UNDEPLOYED:
            with guard(name):
                record = deploy(state, name, boundary)
            now = record.state
        if target == "deployed" and now is FunctionState.PAUSED:
            with guard(name):
                return resume(state, name)
        if target == "paused" and now is FunctionState.DEPLOYED:
            return pause(state, name, wait_s=wait_s)
    else:
        raise ConfigError(f"state {target!r} of function '{name}' is not one of deployed, paused, undeployed")
    with _store(state) as store:
        return store.get_function(name)


def export_couchbase(
    state: StateLike, name: str, *, with_secrets: bool = False
) -> tuple[dict[str, Any], list[str]]:
    """The function in Couchbase's export format (JavaScript functions only), and the warnings naming what
    the format cannot carry; URL binding secrets masked (`*****`) unless with_secrets."""
    with _store(state) as store:
        record = store.get_function(name)
    definition = record.definition if with_secrets else mask_definition(record.definition)
    return to_couchbase(definition, record.source, record.state.value)


class _store:
    """`with _store(state) as store:` the state's metadata store for one operation (the state keeps it
    open)."""

    def __init__(self, state: StateLike):
        self.store = as_state(state).metadata

    def __enter__(self) -> MetadataStore:
        return self.store

    def __exit__(self, *exc: object) -> None:
        pass
