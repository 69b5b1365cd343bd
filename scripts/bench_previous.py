"""Cost of previous_version (meta.previous): one in-process worker handles the same mutations with the
setting off and on, and the source is loaded with and without the log's key index it needs.

Last line JSON: handling rates off/on and their ratio, load rates without/with the index and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from eventing.control import lifecycle  # noqa: E402
from eventing.core.definition import FunctionDefinition  # noqa: E402
from eventing.storage import loadgen  # noqa: E402
from eventing.storage.bucket import LocalBucket  # noqa: E402
from eventing.storage.writes import chunked  # noqa: E402
from eventing.workers.worker import WorkerCore, WorkerSpec  # noqa: E402
from metadata.factory import open_store  # noqa: E402
from sharding import NUM_VBUCKETS  # noqa: E402

HANDLER = """
seen = {}

def on_update(doc, meta):
    seen[meta.id] = meta.previous is not None
"""


def load(data_dir: str, mutations: int, documents: int, index: bool) -> float:
    bucket = LocalBucket.create(data_dir, "src")
    if index:
        bucket.ensure_key_index()
    start = time.perf_counter()
    for chunk in chunked(loadgen.generate(documents, mutations, seed=5, delete_ratio=0.0), 20_000):
        bucket.write(chunk)
    return mutations / (time.perf_counter() - start)


def handle(data_dir: str, previous: bool) -> float:
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_prev",
            "source_bucket": "src",
            "batch_size": 2000,
            "previous_version": previous,
            "checkpoint_interval": "1h",
        }
    )
    lifecycle.save_function(data_dir, defn, HANDLER)
    lifecycle.deploy(data_dir, "fn_prev")
    store = open_store(data_dir)
    generation = store.get_function("fn_prev").generation
    core = WorkerCore(WorkerSpec(data_dir, "fn_prev", generation, "n/w0", tuple(range(NUM_VBUCKETS))))
    start = time.perf_counter()
    handled = 0
    while True:
        report = core.step(budget=2000)
        handled += report.handled
        if report.caught_up:
            break
    elapsed = time.perf_counter() - start
    core.stop()
    core.close()
    lifecycle.undeploy(data_dir, "fn_prev")
    return handled / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mutations", type=int, default=200_000)
    parser.add_argument("--documents", type=int, default=20_000)
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="bench-prev-", ignore_cleanup_errors=True) as plain_dir,
        tempfile.TemporaryDirectory(prefix="bench-prev-ix-", ignore_cleanup_errors=True) as indexed_dir,
    ):
        load_plain = load(plain_dir, args.mutations, args.documents, False)
        load_indexed = load(indexed_dir, args.mutations, args.documents, True)
        off = handle(plain_dir, False)
        on = handle(indexed_dir, True)
    print(f"load: {load_plain:,.0f}/s without the key index, {load_indexed:,.0f}/s with it")
    print(
        f"handle: {off:,.0f}/s previous_version off, {on:,.0f}/s on (cold cache: {args.documents:,} log "
        "lookups)"
    )
    print(
        json.dumps(
            {
                "handle_off_mps": round(off),
                "handle_on_mps": round(on),
                "handle_ratio": round(on / off, 3),
                "load_plain_mps": round(load_plain),
                "load_indexed_mps": round(load_indexed),
                "load_ratio": round(load_indexed / load_plain, 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
