"""`eventing store copy --from A --to B`: a deployment's whole state moved from one store to another (a data
directory to a PostgreSQL server, or back), so a deployment that started embedded carries on where it
stopped: every bucket with its log, seqnos, cas, tombstones, high seqnos, effect marks and collections;
the metadata store (functions and their states, checkpoints and epochs, dead letters, timers, counters,
users, nodes, settings, window state); the windows' files and default results; the application logs.

The copy is made while no service runs on the source (refused otherwise) into a store that holds no
function, user or bucket yet; it reads each table from one snapshot. The source is left as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eventing.core.wording import counted
from eventing.errors import ConfigError, LifecycleError, NotFoundError
from eventing.storage.dumps import TABLES as BUCKET_TABLES
from eventing.storage.state import StateLike, as_state

FILE_FOLDERS = ("incoming", "accepted", "held", "adjusted")  # staging is a Spark job's, made again


def copy_store(
    source: StateLike, target: StateLike, *, on_step: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Copy `source`'s whole state into the empty `target` (see the module docstring); returns what went."""
    from eventing.control.lifecycle import SERVICE_STALE_S
    from metadata.sql.store import SqlMetadataStore

    src, dst = as_state(source), as_state(target)
    say = on_step or (lambda _line: None)
    if src == dst:
        raise ConfigError(f"--from and --to are both {src.shown}; copy into another store")
    if not src.exists():
        raise NotFoundError(f"there is no eventing state at {src.shown} to copy; check --from")
    src_store, dst_store = src.metadata, dst.metadata
    for store, where in ((src_store, src.shown), (dst_store, dst.shown)):
        if not isinstance(_backend(store), SqlMetadataStore):
            raise ConfigError(
                f"the metadata store of {where} is not SQLite or PostgreSQL (Couchbase's is copied "
                "with Couchbase's own tools); unset EVENTING_METADATA_URL"
            )
    services = src_store.live_services(SERVICE_STALE_S)
    if services:
        raise LifecycleError(
            f"an eventing service runs on {src.shown} ({', '.join(services)}); stop it "
            "(Ctrl-C on `eventing run`) before copying, so the copy is one consistent state"
        )
    if dst.bucket_names():
        raise ConfigError(
            f"{dst.shown} already holds buckets ({', '.join(dst.bucket_names())}); a copy goes into "
            "an empty store"
        )
    functions = src_store.list_functions()
    _refuse_flushes_cut_short(src, functions)

    copied: dict[str, Any] = {"from": src.shown, "to": dst.shown, "buckets": {}, "functions": len(functions)}
    for name in src.bucket_names():
        with src.open_bucket(name) as bucket:
            meta = bucket.dump_meta()
            with dst.create_bucket(name, partitions=meta.partitions) as made:
                made.load_dump(meta, ((table, bucket.dump_rows(table)) for table in BUCKET_TABLES))
            copied["buckets"][name] = bucket.stats().get("mutations")
        say(f"bucket {name}: {counted(copied['buckets'][name] or 0, 'mutation')}")
    from metadata.sql.dump import dump_tables, load_tables

    src_store.window_states()  # (its table is made on first use)
    dst_store.window_states()
    copied["metadata_rows"] = load_tables(_backend(dst_store), dump_tables(_backend(src_store)))
    say(
        f"metadata store: {len(functions)} function{'s' if len(functions) != 1 else ''}, "
        f"{counted(sum(copied['metadata_rows'].values()), 'row')}"
    )
    copied["window_files"] = _copy_windows(src, dst, functions)
    copied["log_lines"] = _copy_logs(src, dst, functions)
    say(f"windows' files: {copied['window_files']}; application log lines: {copied['log_lines']:,}")
    return copied


def _backend(store: Any) -> Any:
    """The store itself behind a state's shared handle (one connection of this thread)."""
    inner = getattr(store, "_store", None)
    return inner() if callable(inner) else store


def _refuse_flushes_cut_short(src: Any, functions: list) -> None:
    """A partitioned bucket's partitions each keep the marks of the effects they received; a copy merges
    them, which is exact unless a flush was cut short between partitions (a mark past the checkpoint in
    one partition only). Then the function must first run until it catches up."""
    for record in functions:
        checkpoints = src.metadata.checkpoints(record.name)
        if not checkpoints:
            continue
        buckets = {b.get("bucket") for b in record.definition.get("bindings", []) if isinstance(b, dict)}
        for name in sorted(n for n in buckets if n and src.has_bucket(n)):
            with src.open_bucket(name) as bucket:
                if getattr(bucket, "parts", None) is None:
                    continue
                lowest = bucket.effect_marks(record.name)
                highest: dict[int, int] = {}
                for rows in bucket.dump_rows("marks"):
                    highest.update(
                        {vb: seqno for function, vb, _epoch, seqno in rows if function == record.name}
                    )
            for vb, seqno in highest.items():
                cp = checkpoints.get(vb)
                if cp is not None and seqno > cp.seqno and lowest.get(vb, (0, 0))[1] != seqno:
                    raise LifecycleError(
                        f"function '{record.name}' stopped in the middle of applying its effects to bucket "
                        f"'{name}' (vBucket {vb}); run it until it catches up (`eventing run "
                        "--until-caught-up`), then copy"
                    )


def _copy_windows(src: Any, dst: Any, functions: list) -> int:
    """The windowed functions' files (row batches, partials, held and adjusted rows) and default results."""
    from eventing.windows.runtime.emission import make_sink
    from eventing.windows.runtime.paths import window_area
    from eventing.windows.runtime.row_writer import RowLayout

    count = 0
    for record in functions:
        window = record.definition.get("window")
        if window is None:
            continue
        source, target = window_area(src, record.name), window_area(dst, record.name)
        for folder in FILE_FOLDERS:
            for name in source.list(folder):
                target.write(f"{folder}/{name}", source.read(f"{folder}/{name}"))
                count += 1
        layout = RowLayout.for_definition(record.name, window)
        if layout.spec.sink.path is not None:
            continue  # the user's own output: not part of the store
        results, written = make_sink(src, record.name, layout), None
        written = sorted(results.written_windows(record.name))
        if written:
            substream = layout.spec.substream_key if len(written[0]) == 3 else None
            make_sink(dst, record.name, layout).write(
                record.name, results.read(record.name), windows=written, substream=substream
            )
    return count


def _copy_logs(src: Any, dst: Any, functions: list) -> int:
    lines = 0
    for record in functions:
        kept = src.app_logs.tail(record.name, 10_000_000)
        if not kept:
            continue
        writer = dst.app_logs.writer(record.name)
        try:
            writer.write_lines(kept)
        finally:
            writer.close()
        lines += len(kept)
    return lines
