"""The Python API: drive a deployment from Python as the CLI does (quix-streams' `Application`, bytewax's
`run_main`). Every method calls the same functions as the matching `eventing` command, with explicit
parameters instead of flags and environment variables.

    from eventing import Eventing

    app = Eventing("./.eventing", executor="in-process")
    app.create_bucket("customers"); app.create_bucket("emails")
    app.load("customers", documents=1_000, mutations=5_000, seed=1)
    app.deploy("functions/fn_email.json")
    summary = app.run(until_caught_up=True)
    print(app.stats("fn_email")["on_update_success"])

The CLI's demo (`eventing demo`) runs on this API.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

from eventing.control import lifecycle
from eventing.control.service import EventingService, RunSummary
from eventing.core.definition import Boundary, FunctionDefinition
from eventing.errors import ConfigError
from eventing.ops.stats import function_stats, vbucket_map
from eventing.ops.verify import VerifyReport, verify_function
from eventing.storage import loadgen
from eventing.storage.bucket import LocalBucket, Write, chunked
from eventing.windows.runtime.host import WindowOptions
from eventing.workers.executor import make_executor
from metadata import FunctionRecord

ExecutorKind = Literal["ray", "in-process"]


class Eventing:
    """One deployment: the buckets and metadata store under `data_dir`, run on Ray or in this process."""

    def __init__(
        self, data_dir: str | Path = ".eventing", *, executor: ExecutorKind = "ray", ray_address: str | None = None
    ):
        self.data_dir = str(data_dir)
        self.executor = executor
        self.ray_address = ray_address
        Path(self.data_dir).mkdir(parents=True, exist_ok=True)

    # -- buckets ----------------------------------------------------------------------------------------

    def create_bucket(self, name: str, *, exist_ok: bool = True, partitions: int = 1) -> LocalBucket:
        """The bucket `name`, created empty if it does not exist (`eventing bucket create`); ``partitions``
        spreads its vBuckets over that many files (docs/everyday-commands.md, "Partitioned buckets")."""
        return LocalBucket.create(self.data_dir, name, exist_ok=exist_ok, partitions=partitions)

    def bucket(self, name: str) -> LocalBucket:
        """An existing bucket; NotFoundError names the fix if there is none."""
        return LocalBucket.open(self.data_dir, name)

    def upsert(self, bucket: str, key: str, doc: dict[str, Any], *, expiry: int = 0) -> tuple[int, int]:
        """Create or replace one document (`eventing bucket upsert`); returns its (vBucket, seqno)."""
        return self.bucket(bucket).upsert(key, doc, expiry=expiry)

    def remove(self, bucket: str, key: str) -> tuple[int, int]:
        """Delete one document, a tombstone mutation (`eventing bucket delete`); returns its (vBucket, seqno)."""
        return self.bucket(bucket).delete(key)

    def write(self, bucket: str, writes: Iterable[Write]) -> int:
        """Append mutations in bulk (`eventing bucket load`; a Write holds the document as msgpack bytes,
        eventing.core.mutation.encode_document); returns how many were logged."""
        target = self.bucket(bucket)
        written = 0
        for chunk in chunked(writes, 20_000):
            written += sum(1 for r in target.write(chunk) if r is not None)
        return written

    def load(self, bucket: str, *, documents: int, mutations: int, seed: int = 0, prefix: str = "customer") -> int:
        """Faker-generated customer mutations, deterministic per seed (`eventing bucket load`)."""
        if documents < 1 or mutations < documents:
            raise ConfigError("mutations must be >= documents >= 1 (each document is created once first)")
        return self.write(bucket, loadgen.generate(documents, mutations, seed=seed, prefix=prefix))

    # -- functions --------------------------------------------------------------------------------------

    def deploy(
        self,
        definition: str | Path | FunctionDefinition | dict[str, Any],
        handler: str | None = None,
        *,
        boundary: Boundary | None = None,
    ) -> FunctionRecord:
        """Save and deploy a function: a definition file (its handler beside it), or a definition with the
        handler's source (`eventing deploy`)."""
        self.save(definition, handler)
        name = definition.name if isinstance(definition, FunctionDefinition) else (
            definition["name"] if isinstance(definition, dict) else _definition_name(definition)
        )
        return lifecycle.deploy(self.data_dir, name, boundary)

    def save(
        self, definition: str | Path | FunctionDefinition | dict[str, Any], handler: str | None = None
    ) -> FunctionRecord:
        """Create or update a function without deploying it (`eventing create`)."""
        if isinstance(definition, str | Path):
            if handler is not None:
                raise ConfigError("a definition file names its handler file; pass no handler source with it")
            return lifecycle.save_from_file(self.data_dir, definition)
        if handler is None:
            raise ConfigError("a definition given as data needs the handler's source code")
        defn = definition if isinstance(definition, FunctionDefinition) else FunctionDefinition.from_dict(definition)
        return lifecycle.save_function(self.data_dir, defn, handler)

    def pause(self, name: str, *, wait_s: float = 60.0) -> FunctionRecord:
        return lifecycle.pause(self.data_dir, name, wait_s=wait_s)

    def resume(self, name: str) -> FunctionRecord:
        return lifecycle.resume(self.data_dir, name)

    def undeploy(self, name: str, *, wait_s: float = 60.0) -> FunctionRecord:
        return lifecycle.undeploy(self.data_dir, name, wait_s=wait_s)

    def delete(self, name: str) -> None:
        lifecycle.delete(self.data_dir, name)

    # -- running and watching ---------------------------------------------------------------------------

    def run(
        self,
        *,
        until_caught_up: bool = True,
        functions: list[str] | None = None,
        on_progress: Callable[[RunSummary], None] | None = None,
        close_windows: bool = False,
        spark_master: str | None = None,
    ) -> RunSummary:
        """Run the deployed functions (`eventing run`); by default until the high seqnos seen at start are
        handled and checkpointed. Blocks; errors of a function are in the summary's `errors`. Windowed
        functions: `close_windows` closes every open window at the end of the input (with until_caught_up),
        `spark_master` sends merge jobs to a Spark cluster (default local[*])."""
        service = EventingService(
            self.data_dir,
            make_executor(self.executor, self.ray_address, self.data_dir),
            until_caught_up=until_caught_up,
            functions=functions,
            on_progress=on_progress,
            windows=WindowOptions(close_windows=close_windows, spark_master=spark_master),
        )
        return service.run()

    def stats(self, name: str) -> dict[str, Any]:
        """The `eventing stats --json` view of a function."""
        return function_stats(self.data_dir, name)

    def vbucket_map(self, name: str) -> dict[str, Any]:
        """The `eventing vbmap --json` view of a function."""
        return vbucket_map(self.data_dir, name)

    def windows(self, name: str, *, limit: int | None = None) -> dict[str, Any]:
        """A windowed function's results (`eventing windows --json`): one row per closed window and group,
        with the watermark, open and emitted windows and late rows; `limit` keeps the last N rows."""
        from eventing.ops.windows import window_report

        report = window_report(self.data_dir, name)
        if limit:
            report["results"] = report["results"][-limit:]
        return report

    def verify(self, name: str, *, ledger: str | None = None) -> VerifyReport:
        """Check a function against a ledger bucket (`eventing verify`)."""
        return verify_function(self.data_dir, name, ledger=ledger)


def _definition_name(path: str | Path) -> str:
    from eventing.core.definition import load_definition_file

    return load_definition_file(path)[0].name
