"""The table formats that cross the aggregation boundary: row batches workers write, result tables sinks
store.

Row batch: one row per mutation of a windowed function, ``vb int32, seqno int64, key string,
event_time timestamp[us, UTC], arrival_ms int64`` (when the source assigned the seqno, epoch ms; 0 when
unknown), then the function's group-by columns (string) and value columns (float64,
nullable). A row is identified by ``(vb, seqno)``: readers drop duplicates on that pair, so a batch written
again after a crash (under the same or a new name) never counts twice. Batches are Parquet for Spark
(``write_row_batch``) or Arrow IPC for a Python reader (``write_row_spool``, the worker-to-coordinator
hand-off); ``read_row_batch`` reads both. ``write_row_file``, ``write_parquet_file`` and ``read_row_file``
do the same in a file area (``eventing.storage.file_area``), memory-mapping a local folder's files. An Arrow
row file ends with a checksum trailer, ``EVROWCRC`` and the CRC-32 (4 bytes, big-endian) of the Arrow IPC
bytes before it, so a damaged file is refused with its name rather than read as other numbers (Arrow itself
checks only the file's structure); files written before the trailer existed are read as they are.

Result table: ``window_start_ms int64, window_end_ms int64``, the group-by columns, then one column per
aggregate (``count`` int64, the others float64). The group-by column names ride in the schema metadata so a
sink can order and key results without being told.
"""

from __future__ import annotations

import errno
import json
import os
import re
import uuid
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np
import pyarrow as pa

from eventing.errors import StoreCorruptError, StoreError
from metadata.sqlite_io import private_folder

if TYPE_CHECKING:
    from eventing.storage.file_area import FileArea

AggregateOp = Literal["count", "sum", "avg", "min", "max"]
# (op, value field or None, output column name); the field may be None only for count, meaning count(*).
# What Spark computes over a row column: (op, row column, result name). The declared form is
# eventing.windows.semantics.Aggregate (op over a document field); RowLayout.aggregates maps one to the other.
AggregateColumn = tuple[AggregateOp, str | None, str]
AGGREGATE_OPS: frozenset[str] = frozenset({"count", "sum", "avg", "min", "max"})

ROW_ID_COLUMNS = ("vb", "seqno")
EVENT_TIME = "event_time"
ARRIVAL = "arrival_ms"
EVENT_TIME_TYPE = pa.timestamp("us", tz="UTC")
WINDOW_START = "window_start_ms"
WINDOW_END = "window_end_ms"
GROUP_BY_METADATA_KEY = b"eventing.group_by"
ROW_SPOOL_SUFFIX = ".arrow"
_CHECKSUM_MAGIC = b"EVROWCRC"
_TRAILER_BYTES = len(_CHECKSUM_MAGIC) + 4
_MAX_MS_AS_US = (2**63 - 1) // 1000

_BASE_FIELDS = (
    pa.field("vb", pa.int32(), nullable=False),
    pa.field("seqno", pa.int64(), nullable=False),
    pa.field("key", pa.string(), nullable=False),
    pa.field(EVENT_TIME, EVENT_TIME_TYPE, nullable=False),
    pa.field(ARRIVAL, pa.int64(), nullable=False),
)
_BASE_NAMES = frozenset(f.name for f in _BASE_FIELDS)
# Spark and our own readers skip names starting with "." or "_", so a half-written temp file is invisible.
_BATCH_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=-]{0,199}$")


def _check_names(kind: str, names: Sequence[str], reserved: frozenset[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{kind} name {name!r} must be a non-empty string")
        if name in reserved:
            raise ValueError(f"{kind} name {name!r} is reserved by the row format; rename it")
        if name in seen:
            raise ValueError(f"{kind} name {name!r} is given twice; each column needs a unique name")
        seen.add(name)


def row_schema(group_by: Sequence[str], value_fields: Sequence[str]) -> pa.Schema:
    """Arrow schema of a function's row batches: the row id and event time, then group and value columns."""
    _check_names("group-by/value column", [*group_by, *value_fields], _BASE_NAMES)
    return pa.schema(
        [
            *_BASE_FIELDS,
            *(pa.field(name, pa.string()) for name in group_by),
            *(pa.field(name, pa.float64()) for name in value_fields),
        ]
    )


def build_row_batch(
    schema: pa.Schema,
    *,
    vb: Sequence[int] | pa.Array,
    seqno: Sequence[int] | pa.Array,
    key: Sequence[str] | pa.Array,
    event_time_ms: Sequence[int] | pa.Array,
    columns: Mapping[str, Sequence[str | float | None]] | None = None,
    arrival_ms: Sequence[int] | pa.Array | None = None,
) -> pa.Table:
    """Build a row batch from lists, numpy arrays or Arrow arrays; event times are epoch milliseconds (UTC).

    Group and value columns missing from ``columns`` are filled with nulls; arrival times (epoch ms, when
    the source assigned the mutation's seqno) default to 0, unknown.
    """
    columns = dict(columns or {})
    unknown = set(columns) - set(schema.names)
    if unknown:
        raise ValueError(f"columns {sorted(unknown)} are not in the row schema {schema.names}")
    n = len(vb)
    arrays: list[pa.Array] = [
        _array(vb, pa.int32()),
        _array(seqno, pa.int64()),
        _array(key, pa.string()),
        _event_times(event_time_ms),
        pa.array(np.zeros(n, np.int64)) if arrival_ms is None else _array(arrival_ms, pa.int64()),
    ]
    for field in list(schema)[len(_BASE_FIELDS) :]:
        values = columns.get(field.name)
        arrays.append(pa.nulls(n, field.type) if values is None else _array(values, field.type))
    lengths = {len(a) for a in arrays}
    if len(lengths) != 1:
        raise ValueError(
            f"row batch columns have different lengths {sorted(lengths)}; give one value per row"
        )
    return pa.Table.from_arrays(arrays, schema=schema)


def _array(values: Sequence[object] | pa.Array, type_: pa.DataType) -> pa.Array:
    if isinstance(values, pa.Array):
        return values if values.type == type_ else values.cast(type_)
    return pa.array(values, type_)


# Columns built from their buffers. pyarrow.array() looks for pandas types in whatever it is given, so
# its first call in a process imports pandas (~0.15 s); a window worker builds its rows with these instead.


def numpy_column(values: Any, type_: pa.DataType, valid: Any = None) -> pa.Array:
    """A numpy array of ``type_``'s width (int32, int64, float64; a timestamp's int64) as an Arrow array;
    ``valid``: a bool array, False where the value is null."""
    data = np.ascontiguousarray(values)
    if valid is None:
        return pa.Array.from_buffers(type_, len(data), [None, pa.py_buffer(data)], null_count=0)
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    nulls = len(data) - int(np.count_nonzero(valid))
    return pa.Array.from_buffers(type_, len(data), [bitmap, pa.py_buffer(data)], null_count=nulls)


def float_column(values: list[float | None]) -> pa.Array:
    """Floats and Nones as a float64 array (None: null)."""
    if None not in values:
        return numpy_column(np.array(values, np.float64), pa.float64())
    valid = np.array(values, dtype=object) != None  # noqa: E711 - elementwise
    data = np.array(values, np.float64)  # None reads as NaN, masked by `valid`
    data[~valid] = 0.0
    return numpy_column(data, pa.float64(), valid)


def string_column(values: list[str | None]) -> pa.Array:
    """Strings and Nones as a string array (None: null): joined and encoded in one go, the offsets from
    their lengths (in characters where the text is ASCII, else each one encoded)."""
    valid = None
    strings = cast("list[str]", values)
    if None in values:
        valid = np.array(values, dtype=object) != None  # noqa: E711 - elementwise
        strings = ["" if v is None else v for v in values]
    text = "".join(strings)
    if text.isascii():
        data = text.encode()
        lengths = np.fromiter(map(len, strings), np.int64, len(strings))
    else:
        encoded = [v.encode() for v in strings]
        data = b"".join(encoded)
        lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
    if len(data) > np.iinfo(np.int32).max:
        return pa.array(values, pa.string())  # over a string array's 2 GiB: Arrow says so
    offsets = np.zeros(len(values) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:], dtype=np.int32)
    bitmap = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    nulls = 0 if valid is None else len(values) - int(np.count_nonzero(valid))
    return pa.StringArray.from_buffers(len(values), pa.py_buffer(offsets), pa.py_buffer(data), bitmap, nulls)


def _event_times(event_time_ms: Sequence[int] | pa.Array) -> pa.Array:
    """Epoch ms as the row batches' microsecond timestamps: multiplied in numpy (~5x faster than Arrow's
    checked cast) when no value can overflow, else cast with Arrow's overflow check. An array already
    of the row batches' timestamp type is taken as it is."""
    if isinstance(event_time_ms, pa.Array) and event_time_ms.type == EVENT_TIME_TYPE:
        return event_time_ms
    ms = np.array(event_time_ms, dtype=np.int64)
    if len(ms) and -_MAX_MS_AS_US <= ms.min() and ms.max() <= _MAX_MS_AS_US:
        return pa.array(ms * 1000, EVENT_TIME_TYPE)
    return pa.array(ms, pa.int64()).cast(pa.timestamp("ms", tz="UTC")).cast(EVENT_TIME_TYPE)


def _checked_rows(table: pa.Table) -> pa.Table:
    if ARRIVAL not in table.schema.names:  # written before rows carried arrival times: unknown (0)
        table = table.append_column(ARRIVAL, pa.array(np.zeros(table.num_rows, np.int64)))
    for field in _BASE_FIELDS:
        if field.name not in table.schema.names:
            raise ValueError(f"row batch has no {field.name!r} column; build it with row_schema()")
    ts_type = table.schema.field(EVENT_TIME).type
    if not pa.types.is_timestamp(ts_type) or ts_type.tz is None:
        # A naive timestamp reaches Spark as TIMESTAMP_NTZ, which withWatermark rejects.
        raise ValueError(
            f"row batch column 'event_time' is {ts_type}; it must be timestamp('us', tz='UTC') "
            "(build it with build_row_batch() or cast it)"
        )
    if ts_type != EVENT_TIME_TYPE:
        table = table.set_column(
            table.schema.get_field_index(EVENT_TIME), EVENT_TIME, table[EVENT_TIME].cast(EVENT_TIME_TYPE)
        )
    for field in _BASE_FIELDS:
        if table[field.name].null_count:
            raise ValueError(
                f"row batch column {field.name!r} has nulls; every row needs vb, seqno, key, event_time"
            )
    base = [f.name for f in _BASE_FIELDS]
    table = table.select([*base, *(name for name in table.schema.names if name not in _BASE_NAMES)])
    checked = pa.schema([*_BASE_FIELDS, *list(table.schema)[len(_BASE_FIELDS) :]])
    # A table built on the row schema (a worker's) is already checked: no cast, no pyarrow.compute import.
    return table if table.schema.equals(checked) else table.cast(checked)


def batch_file_name(batch_name: str, suffix: str = ".parquet") -> str:
    """File name of a batch: the name plus ``suffix``; names that readers would skip are refused."""
    name = batch_name if batch_name.endswith(suffix) else f"{batch_name}{suffix}"
    if not _BATCH_NAME.match(name):
        raise ValueError(
            f"row batch name {batch_name!r} must start with a letter or digit and use only letters, digits "
            "and _ . = - (names starting with '.' or '_' are skipped by Spark)"
        )
    return name


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_parquet(table: pa.Table, path: Path, *, overwrite: bool) -> bool:
    """Write ``table`` as Parquet to ``path`` so that readers see the whole file or nothing
    (``atomic_write``)."""
    import pyarrow.parquet as pq

    return atomic_write(path, lambda tmp: pq.write_table(table, tmp), overwrite=overwrite)


def atomic_write(path: Path, write: Callable[[Path], object], *, overwrite: bool) -> bool:
    """Have ``write`` fill a file that readers see at ``path`` whole or not at all.

    The file is written under a hidden temporary name, flushed to disk, then moved into place in one step.
    With ``overwrite=False`` an existing file wins and the call returns False (``os.link`` refuses to
    replace, so two concurrent writers cannot both succeed).
    """
    return atomic_write_many([(path, write)], overwrite=overwrite) == 1


def atomic_write_many(files: Sequence[tuple[Path, Callable[[Path], object]]], *, overwrite: bool) -> int:
    """``atomic_write`` for many files at once; returns how many were placed. Each file is still whole or
    absent, but they are written side by side and their directories flushed once at the end, not once per
    file (a window sink writes a file per window)."""
    staged = [(path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp"), path) for path, _ in files]
    try:
        return _write_and_place(staged, files, overwrite=overwrite)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT) and "No space left" not in str(exc):
            raise
        folder = staged[0][1].parent
        raise StoreError(
            f"cannot write {staged[0][1] if len(staged) == 1 else f'{len(staged)} files in {folder}'}: the "
            f"disk is full ({exc.strerror or exc}); free space on the file system of {folder} (see `df "
            f"{folder}`), then run the command again (nothing was checkpointed past what is on disk)"
        ) from None


def _write_and_place(
    staged: list[tuple[Path, Path]],
    files: Sequence[tuple[Path, Callable[[Path], object]]],
    *,
    overwrite: bool,
) -> int:
    try:
        jobs = [(tmp, write) for (tmp, _), (_, write) in zip(staged, files, strict=True)]
        if len(jobs) == 1:
            _write_synced(jobs[0])
        elif jobs:
            # Parquet encoding and fsync release the GIL: a few threads write a window sink's files at once.
            with ThreadPoolExecutor(min(4, len(jobs))) as pool:
                list(pool.map(_write_synced, jobs))
        placed = sum(_place(tmp, path, overwrite=overwrite) for tmp, path in staged)
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
    for directory in {path.parent for _, path in staged}:
        _fsync_dir(directory)
    return placed


def _write_synced(job: tuple[Path, Callable[[Path], object]]) -> None:
    tmp, write = job
    write(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())


def _place(tmp: Path, path: Path, *, overwrite: bool) -> bool:
    if overwrite:
        os.replace(tmp, path)
        return True
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        # No hard links on this file system: check-then-rename, first writer wins unless two race.
        if path.exists():
            return False
        os.replace(tmp, path)
    return True


def write_row_batch(directory: str | os.PathLike[str], batch_name: str, table: pa.Table) -> Path:
    """Write one row batch atomically as ``<directory>/<batch_name>.parquet`` and return its path.

    A crash leaves either the whole file or none (only a hidden temp file, which readers skip). Writing the
    same batch again replaces it with the same rows; rows written under two names are deduplicated by
    ``(vb, seqno)`` when read, so replays after a crash never double count.
    """
    path = Path(directory) / batch_file_name(batch_name)
    private_folder(path.parent)
    atomic_write_parquet(_checked_rows(table), path, overwrite=True)
    return path


def write_row_spool(directory: str | os.PathLike[str], batch_name: str, table: pa.Table) -> Path:
    """Write one row batch atomically as ``<directory>/<batch_name>.arrow``: an uncompressed Arrow IPC file,
    for a reader in Python. Writing it costs a fraction of Parquet (no encoding, ~20 ms a million rows) and
    reading it is a memory map, so the worker-to-coordinator hand-off uses it; Parquet stays for what
    Spark reads. The files live until the coordinator consumes them, a poll later."""
    path = Path(directory) / batch_file_name(batch_name, ROW_SPOOL_SUFFIX)
    private_folder(path.parent)
    checked = _checked_rows(table)

    data = _checksummed(checked)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(data)

    atomic_write(path, write, overwrite=True)
    return path


def encode_row_spool(table: pa.Table) -> bytes:
    """The bytes ``write_row_spool`` would write for ``table``: what a worker without the data directory
    sends to the data service, which writes them durably under the same name."""
    return _checksummed(_checked_rows(table)).tobytes()


def _checksummed(checked: pa.Table) -> memoryview:
    """The Arrow IPC file of ``checked`` followed by its checksum trailer (see the module's docstring)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, checked.schema) as writer:
        writer.write_table(checked)
    body = sink.getvalue()
    crc = zlib.crc32(body)
    out = bytearray(body.size + _TRAILER_BYTES)
    out[: body.size] = memoryview(body)
    out[body.size :] = _CHECKSUM_MAGIC + crc.to_bytes(4, "big")
    return memoryview(out)


def read_row_batch(path: str | os.PathLike[str]) -> pa.Table:
    """A row batch written by ``write_row_spool`` (``.arrow``) or ``write_row_batch`` (``.parquet``).

    A file that is cut short, overwritten or fails its checksum raises StoreCorruptError naming it and the
    way out; a missing file raises FileNotFoundError."""
    import pyarrow.parquet as pq

    try:
        if os.fspath(path).endswith(ROW_SPOOL_SUFFIX):
            # Mapped, not copied. The map lives as long as the table's buffers do.
            return _spool_table(pa.memory_map(os.fspath(path)).read_buffer(), os.fspath(path))
        return pq.read_table(path)
    except FileNotFoundError:
        raise
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise damaged_row_file_error(path, exc) from None


def read_row_file(area: FileArea, name: str, *, function: str | None = None) -> pa.Table:
    """``read_row_batch`` of the file ``name`` of a file area: memory-mapped where the area is a folder of
    this machine, else its bytes read whole. ``function`` names the function in a damaged file's message."""
    import pyarrow.parquet as pq

    local = area.local_path(name)
    if local is not None:
        return read_row_batch(local)
    data = area.read(name)
    shown = area.describe(name)
    try:
        if name.endswith(ROW_SPOOL_SUFFIX):
            return _spool_table(pa.py_buffer(data), shown, function)
        return pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise damaged_row_file_error(shown, exc, function) from None


def _spool_table(data: pa.Buffer, shown: str, function: str | None = None) -> pa.Table:
    """The table of an Arrow row file's bytes, its checksum trailer checked when it has one."""
    tail = data.slice(max(0, data.size - _TRAILER_BYTES)).to_pybytes()
    if tail[: len(_CHECKSUM_MAGIC)] == _CHECKSUM_MAGIC:
        data = data.slice(0, data.size - _TRAILER_BYTES)
        if zlib.crc32(data) != int.from_bytes(tail[len(_CHECKSUM_MAGIC) :], "big"):
            raise damaged_row_file_error(shown, "its checksum does not match its contents", function)
    return pa.ipc.open_file(data).read_all()


def write_row_file(area: FileArea, folder: str, batch_name: str, table: pa.Table) -> str:
    """``write_row_spool`` into a file area: the Arrow row file ``<folder>/<batch_name>.arrow``, written
    whole and durably; returns its name in the area."""
    name = f"{folder}/{batch_file_name(batch_name, ROW_SPOOL_SUFFIX)}"
    area.write(name, _checksummed(_checked_rows(table)))
    return name


def write_parquet_file(area: FileArea, name: str, table: pa.Table) -> None:
    """``table`` as the Parquet file ``name`` of a file area, written whole and durably."""
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    area.write(name, memoryview(sink.getvalue()))


def damaged_row_file_error(
    path: str | os.PathLike[str], detail: object, function: str | None = None
) -> StoreCorruptError:
    """One line for a window row file that cannot be read: the file, and the way out (its rows are lost
    with it, so the function's windows are computed afresh from the source by a new deployment)."""
    file = Path(path)
    if function is None:
        in_windows = file.parent.parent.parent.name == "windows"  # <data_dir>/windows/<fn>/<folder>/<file>
        function = file.parent.parent.name if in_windows else "FN"
    return StoreCorruptError(
        f"window row file {path} is damaged ({' '.join(str(detail).split())}); delete it, then undeploy and "
        f"deploy function '{function}' again (`eventing undeploy {function}`, `eventing deploy DEFINITION`) "
        "so that its windows are computed afresh from the source; see 'Faults and recovery' in "
        "docs/operations.md"
    )


def check_aggregates(aggregates: Sequence[AggregateColumn], group_by: Sequence[str]) -> list[str]:
    """Validate aggregate specs and return the value fields they read, in first-use order."""
    if not aggregates:
        raise ValueError("no aggregates given; ask for at least one, e.g. ('count', None, 'n')")
    _check_names("group-by column", group_by, frozenset({WINDOW_START, WINDOW_END}))
    _check_names("aggregate", [a[2] for a in aggregates], frozenset({WINDOW_START, WINDOW_END, *group_by}))
    fields: list[str] = []
    for op, field, name in aggregates:
        if op not in AGGREGATE_OPS:
            raise ValueError(f"aggregate {name!r} uses unknown op {op!r}; use one of {sorted(AGGREGATE_OPS)}")
        if field is None and op != "count":
            raise ValueError(f"aggregate {name!r} ({op}) needs a value field; only count may omit it")
        if field is not None and field not in fields:
            fields.append(field)
    return fields


def result_schema(group_by: Sequence[str], aggregates: Sequence[AggregateColumn]) -> pa.Schema:
    """Arrow schema of window results, with the group-by column names in the schema metadata."""
    check_aggregates(aggregates, group_by)
    return pa.schema(
        [
            pa.field(WINDOW_START, pa.int64(), nullable=False),
            pa.field(WINDOW_END, pa.int64(), nullable=False),
            *(pa.field(name, pa.string()) for name in group_by),
            *(pa.field(name, pa.int64() if op == "count" else pa.float64()) for op, _, name in aggregates),
        ],
        metadata={GROUP_BY_METADATA_KEY: json.dumps(list(group_by)).encode()},
    )


def result_group_by(schema: pa.Schema) -> list[str]:
    """Group-by columns of a result table: from its metadata, else every string column (results built by
    hand)."""
    raw = (schema.metadata or {}).get(GROUP_BY_METADATA_KEY)
    if raw is not None:
        return list(json.loads(raw))
    return [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]


def sort_results(table: pa.Table) -> pa.Table:
    """Order results by window, then group values (a null group value sorts after every string)."""
    import pyarrow.compute as pc

    keys = [(WINDOW_START, "ascending"), (WINDOW_END, "ascending")]
    keys += [(name, "ascending") for name in result_group_by(table.schema)]
    return table.take(pc.sort_indices(table, sort_keys=keys))
