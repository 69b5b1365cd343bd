"""Worker side of windowed aggregation: one row per on_update mutation, stored before the checkpoint moves.

A row is ``vb, seqno, key, event_time`` (the document's time field, epoch ms UTC; for processing-time windows
the time the worker saw it, which the coordinator replaces by its own clock), ``arrival_ms`` (when the source
assigned the mutation's seqno: the coordinator judges the source's silence by it, see ``arrival_times``), the
group-by fields as strings and the aggregated fields as floats. ``WindowRowWriter`` buffers rows and writes
them as one batch file per checkpoint (``WorkerCore.commit`` flushes it before the metadata commit, the same
rule as binding effects), so a checkpoint never covers a row that is not stored durably. After a crash the
mutations after the checkpoint are handled again and their rows written again; the coordinator drops the
copies by ``(vb, seqno)``.

Batch files are Arrow IPC files (``eventing.windows.batches.write_row_file``) in ``incoming/`` of the
function's file area (``eventing.windows.runtime.paths.window_area``; a remote worker's goes through the
data service, ``eventing.storage.file_area.ServiceArea``), named
``g<generation>-<worker>-<incarnation>-<counter>.arrow``: the incarnation is new
for every start of a worker and the counter counts that incarnation's files from 0 without gaps, so the
coordinator can tell a file it has consumed (counter below its mark) from one still being written.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from eventing.core.mutation import Mutation
from eventing.errors import ConfigError
from eventing.storage.file_area import ServiceArea
from eventing.windows.runtime.paths import INCOMING, window_area, window_root
from eventing.windows.semantics import WindowConfigError, WindowSpec

if TYPE_CHECKING:
    import pyarrow as pa

    from eventing.storage.file_area import FileArea
    from eventing.storage.state import State
    from eventing.storage.values import PackedUpdates

# Spark's TIMESTAMP covers years 0001..9999; event times outside cannot be windowed.
MIN_EVENT_MS = -62_135_596_800_000
MAX_EVENT_MS = 253_402_300_799_999
# A worker writes its rows at every checkpoint; past this many buffered rows it writes early (always safe:
# early is still before the checkpoint). That bounds a worker's memory, and during a catch-up it hands the
# coordinator a file every ~0.1 s instead of one per checkpoint, so little is left for the last poll.
MAX_BUFFERED_ROWS = 50_000
BATCH_NAME = re.compile(r"^g(\d+)-(.+)-([0-9a-f]+)-(\d{9})\.arrow$")
BASE_COLUMNS = ("vb", "seqno", "key", "event_time", "arrival_ms")
_STRINGS = frozenset({str, type(None)})
_FLOATS = frozenset({float, type(None)})


def count_column(field: str) -> str:
    """Row column behind ``count(field)``: 1.0 where the field is present and not null, else null."""
    return f"{field}#present"


def substream_column(field: str) -> str:
    """Row column holding the substream key (``substream_key``) when it is not a group-by field too."""
    return f"{field}#substream"


@dataclass(frozen=True)
class RowLayout:
    """The columns a windowed function's rows carry and the aggregates Spark computes over them."""

    spec: WindowSpec
    group_by: tuple[str, ...]
    numeric_fields: tuple[str, ...]  # read as float for sum/avg/min/max
    counted_fields: tuple[str, ...]  # read as presence for count(field)

    @classmethod
    def for_spec(cls, spec: WindowSpec, *, function: str = "?") -> RowLayout:
        numeric: list[str] = []
        counted: list[str] = []
        for agg in spec.aggregates:
            if agg.field is None:
                continue
            target = counted if agg.op == "count" else numeric
            if agg.field not in target:
                target.append(agg.field)
        layout = cls(spec, tuple(spec.group_by), tuple(numeric), tuple(counted))
        try:
            layout.schema  # noqa: B018 - validates the column names
        except ValueError as exc:
            raise ConfigError(
                f"window of function '{function}' cannot be laid out as rows ({exc}); the row columns "
                f"{', '.join(BASE_COLUMNS)} are reserved, so group or aggregate by other field names"
            ) from None
        return layout

    @classmethod
    def for_definition(cls, function: str, window: dict[str, Any]) -> RowLayout:
        try:
            spec = WindowSpec.from_dict(window, function=function)
        except WindowConfigError as exc:
            raise ConfigError(str(exc)) from None
        return cls.for_spec(spec, function=function)

    @property
    def value_columns(self) -> tuple[str, ...]:
        return self.numeric_fields + tuple(count_column(f) for f in self.counted_fields)

    @property
    def substream_field(self) -> str | None:
        """The document field naming a row's substream when it is not a group-by field (its own column)."""
        key = self.spec.substream_key
        return None if key is None or key in self.group_by else key

    @property
    def substream_column(self) -> str | None:
        """The row column holding the substream key as a string (None: no substreams)."""
        key = self.spec.substream_key
        if key is None:
            return None
        return key if key in self.group_by else substream_column(key)

    @property
    def string_columns(self) -> tuple[str, ...]:
        """The group-by columns, then the substream column when it is not one of them."""
        extra = self.substream_field
        return self.group_by if extra is None else (*self.group_by, substream_column(extra))

    @cached_property
    def schema(self) -> pa.Schema:
        from eventing.windows.batches import row_schema

        return row_schema(self.string_columns, self.value_columns)

    @property
    def aggregates(self) -> list[tuple[Any, str | None, str]]:
        """``(op, row column, result name)`` for ``aggregate_windows``."""
        out: list[tuple[Any, str | None, str]] = []
        for agg in self.spec.aggregates:
            column = agg.field if agg.field is None or agg.op != "count" else count_column(agg.field)
            out.append((agg.op, column, agg.name))
        return out


def event_time_of(doc: Any, field: str) -> tuple[int | None, str]:
    """The document's event time in epoch ms, or None and why it cannot be used."""
    if not isinstance(doc, dict):
        return None, f"document is not a JSON object, so it has no event time field {field!r}"
    if field not in doc:
        return None, f"document has no event time field {field!r}; add it as epoch milliseconds (UTC)"
    value = doc[field]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None, (
            f"event time field {field!r} is {value!r} ({type(value).__name__}); it must be a number of "
            "epoch milliseconds (UTC)"
        )
    if isinstance(value, float):
        if not math.isfinite(value):
            return (
                None,
                f"event time field {field!r} is {value}; it must be a finite number of epoch milliseconds",
            )
        value = math.floor(value)
    if not MIN_EVENT_MS <= value <= MAX_EVENT_MS:
        return None, (
            f"event time field {field!r} is {value}, outside years 0001-9999 in epoch milliseconds; "
            "is it in seconds or microseconds instead of milliseconds?"
        )
    return int(value), ""


def _group_value(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    import json

    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _number(value: Any, counters: Counter[str]) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            pass
        else:
            if math.isfinite(number):
                return number
    counters["window_values_not_numeric"] += 1  # aggregates skip it, as SQL skips nulls
    return None


class WindowRowWriter:
    """Buffers the rows of one worker and writes them as atomic Arrow batch files into ``incoming/`` of the
    function's file area (``eventing.windows.runtime.paths.window_area``)."""

    def __init__(
        self,
        state: State | str | os.PathLike[str],
        function: str,
        generation: int,
        worker_id: str,
        layout: RowLayout,
        counters: Counter[str] | None = None,
        put_file: Callable[[str, bytes], None] | None = None,
        *,
        area: FileArea | None = None,
    ):
        self.layout = layout
        # A worker without the data directory hands each batch to the data service (put_file), which
        # writes it durably under the same name before the worker's checkpoint moves.
        if area is None:
            area = (
                ServiceArea(put_file, window_root(function))
                if put_file is not None
                else window_area(state, function)
            )
        self.area = area
        self.directory = area.local_path(INCOMING)  # None where the files are not on this machine
        self.counters = counters if counters is not None else Counter()
        slug = re.sub(r"[^A-Za-z0-9_.=]", "_", worker_id)
        incarnation = f"{time.time_ns():x}{os.getpid():x}"
        self.prefix = f"g{generation}-{slug}-{incarnation}"
        self.files_written = 0
        self.rejection = ""  # why the last add() refused its document
        self._event_time = layout.spec.boundary == "event_time"
        # Bulk reads give each arrival time past this spread; the arrival-time policies judge every row by
        # its own, so they read them all.
        self.arrival_gap_ms = 0 if layout.spec.uses_arrival_policies else layout.spec.arrival_gap_ms
        self._time_field = layout.spec.time_field or ""
        substream = () if layout.substream_field is None else (layout.substream_field,)
        self._fields = (*layout.group_by, *substream, *layout.numeric_fields, *layout.counted_fields)
        self._decode, self._time_of, self._value_of = self._field_decoder()
        # Rows in buffer order: add_packed's runs (_Run, made into one Arrow table per flush) and Arrow chunks
        # of add()'s rows once sealed; then add()'s lists.
        self._chunks: list[pa.Table | _Run] = []
        self._chunk_rows = 0
        self._clear()

    def _field_decoder(self) -> tuple[Any, Any, tuple[Any, ...]]:
        """For add_packed: a decoder of an array of documents into just the fields rows need (unknown
        fields are skipped, ~0.1 us a document against ~0.6 us for a whole msgpack.unpackb) and getters of
        the time and value fields. Each field is an `object` defaulting to None: a missing field and a
        null give None, as doc.get does. Attributes are f0, f1, ... renamed to the document's names, so
        any field name works."""
        names = list(dict.fromkeys([self._time_field, *self._fields] if self._event_time else self._fields))
        attrs = {name: f"f{i}" for i, name in enumerate(names)}
        # gc=False: decoded values cannot form cycles, and untracked instances are cheaper to create.
        struct = msgspec.defstruct(
            "WindowFields",
            [(a, object, None) for a in attrs.values()],
            rename={a: name for name, a in attrs.items()},
            gc=False,
        )
        time_of = attrgetter(attrs[self._time_field]) if self._event_time else None
        decoder = msgspec.msgpack.Decoder(list[struct])  # type: ignore[valid-type]
        return decoder.decode, time_of, tuple(attrgetter(attrs[f]) for f in self._fields)

    @classmethod
    def for_worker(
        cls,
        state: State | str,
        function: str,
        generation: int,
        worker_id: str,
        window: dict[str, Any] | None,
        counters: Counter[str],
        put_file: Callable[[str, bytes], None] | None = None,
    ) -> WindowRowWriter | None:
        """The writer for a worker of a windowed function (None when `window` is None). A windowed function
        needs no on_update of its own: every update still becomes a row (see WorkerCore._handle).
        `put_file` hands row files to the data service (a worker that cannot see the data directory)."""
        if window is None:
            return None
        return cls(
            state,
            function,
            generation,
            worker_id,
            RowLayout.for_definition(function, window),
            counters,
            put_file=put_file,
        )

    def _clear(self) -> None:
        # Rows of add(): raw values in one list per column, appended through bound methods (~0.6 us a row).
        # Only ints, floats and strings stay buffered: no GC work. _seal() turns them into an Arrow chunk.
        self._base: tuple[list[Any], ...] = ([], [], [], [], [])  # vb, seqno, key, event time, arrival
        self._values: tuple[list[Any], ...] = tuple([] for _ in self._fields)
        self._appends = tuple(column.append for column in self._base)
        self._value_appends = tuple(
            zip(self._fields, (column.append for column in self._values), strict=True)
        )

    def __len__(self) -> int:
        return self._chunk_rows + len(self._base[0])

    def add(self, m: Mutation, doc: Any) -> bool:
        """Buffer the row of an on_update mutation; False (with ``rejection`` set) if it has no usable
        event time, or is not an object in a processing-time window: the caller dead-letters it as
        ``bad_event_time``."""
        if self._event_time:
            t = doc.get(self._time_field) if type(doc) is dict else None
            if type(t) is not int or not MIN_EVENT_MS <= t <= MAX_EVENT_MS:
                t, why = event_time_of(doc, self._time_field)
                if t is None:
                    self.rejection = why
                    return False
        elif type(doc) is not dict:
            self.rejection = "document is not a JSON object, so it has no fields to group or aggregate"
            return False
        else:
            t = int(time.time() * 1000)
        add_vb, add_seqno, add_key, add_time, add_arrival = self._appends
        add_vb(m.vb)
        add_seqno(m.seqno)
        add_key(m.key)
        add_time(t)
        add_arrival(m.arrival_ms)
        get = doc.get
        for field, append in self._value_appends:
            append(get(field))
        if self._chunk_rows + len(self._base[0]) >= MAX_BUFFERED_ROWS:
            self.flush()
        return True

    def add_packed(self, batch: PackedUpdates) -> bool:
        """Buffer the rows of a vBucket's updates read in bulk (``LocalBucket.read_vb_packed``) exactly as
        add() would one by one, several times faster: one decode call for all documents and whole
        columns to Arrow. False, with nothing buffered, if a document does not decode as an object or has
        no int event time in range, or a key holds a NUL byte: the caller then takes add()'s path, which
        handles float times and rejections row by row.

        Fields rows do not need are skipped, not checked, and the documents are decoded as one msgpack
        array: this relies on every document being one JSON-only msgpack value, which every write path
        guarantees (encode_document checks each write)."""
        import numpy as np

        n = batch.update_count
        if not n:
            return True
        keys = _split_keys(batch.keys, n)
        if keys is None:
            return False
        try:
            decoded = self._decode(b"\xdd" + n.to_bytes(4, "big") + batch.docs)  # msgpack array32 header
        except Exception:  # noqa: BLE001 - not an object, undecodable, ...: add()'s path says why
            return False
        if self._event_time:
            # Only ints in range take this way: a float, bool, null or huge time goes the per-row way
            # (rejected or floored there). The type check runs in C, one set of the values' types.
            times = list(map(self._time_of, decoded))
            if set(map(type, times)) != {int}:
                return False
            try:
                event_ms = np.array(times, np.int64)
            except OverflowError:
                return False
            if event_ms.min() < MIN_EVENT_MS or event_ms.max() > MAX_EVENT_MS:
                return False
        else:
            event_ms = np.full(n, int(time.time() * 1000), np.int64)
        seqnos = np.arange(batch.after_seqno + 1, batch.last_seqno + 1, dtype=np.int64)
        if batch.other_seqnos:  # the updates' seqnos: the range without the deletes'
            updates = np.ones(len(seqnos), bool)
            updates[np.array(batch.other_seqnos, np.int64) - (batch.after_seqno + 1)] = False
            seqnos = seqnos[updates]
        run = _Run(
            batch.vb,
            seqnos,
            keys,
            event_ms,
            arrival_times(batch),
            [list(map(value_of, decoded)) for value_of in self._value_of],
        )
        self._seal()
        # Fill up to MAX_BUFFERED_ROWS and write, as add() does, so the batch files are the same (a buffer
        # a failed write left full takes one row per retry, as in add()).
        start = 0
        while start < n:
            piece = run.slice(start, max(1, MAX_BUFFERED_ROWS - len(self)))
            self._chunks.append(piece)
            self._chunk_rows += len(piece)
            start += len(piece)
            if len(self) >= MAX_BUFFERED_ROWS:
                self.flush()
        return True

    def _seal(self) -> None:
        """Turn the rows add() buffered into an Arrow chunk, after the chunks before them."""
        if self._base[0]:
            vb, seqno, key, event_ms, arrival_ms = self._base
            self._chunks.append(self._rows_table(vb, seqno, key, event_ms, arrival_ms, self._values))
            self._chunk_rows += len(self._base[0])
            self._clear()

    def _rows_table(
        self, vb: Any, seqno: Any, key: Any, event_ms: Any, arrival_ms: Any, values: Sequence[list[Any]]
    ) -> pa.Table:
        """Rows as a table of the row schema, the values converted as the layout says. Every column is built
        from its buffers (``eventing.windows.batches.numpy_column``): no pyarrow.array call, whose first
        call imports pandas, so a worker process never does."""
        import numpy as np
        import pyarrow as pa

        from eventing.windows.batches import (
            EVENT_TIME_TYPE,
            build_row_batch,
            float_column,
            numpy_column,
            string_column,
        )

        layout = self.layout
        columns_in = iter(values)
        columns: dict[str, Any] = {}
        # A column of only the expected types (the common case) goes to Arrow as is; one type check per
        # value in C instead of a Python expression per value.
        for name in layout.string_columns:
            column = next(columns_in)
            columns[name] = (
                column
                if set(map(type, column)) <= _STRINGS
                else [v if v is None or type(v) is str else _group_value(v) for v in column]
            )
        for name in layout.numeric_fields:
            column = next(columns_in)
            columns[name] = (
                column
                if set(map(type, column)) <= _FLOATS
                else [
                    float(v) if type(v) is float or type(v) is int else _number(v, self.counters)
                    for v in column
                ]
            )
        for name in layout.counted_fields:
            columns[count_column(name)] = [None if v is None else 1.0 for v in next(columns_in)]
        for name in layout.string_columns:
            columns[name] = string_column(columns[name])
        for name in layout.value_columns:
            columns[name] = float_column(columns[name])
        # Event times are validated epoch ms (MIN_EVENT_MS..MAX_EVENT_MS): as microseconds they fit.
        return build_row_batch(
            layout.schema,
            vb=numpy_column(np.asarray(vb, np.int32), pa.int32()),
            seqno=numpy_column(np.asarray(seqno, np.int64), pa.int64()),
            key=key if isinstance(key, pa.Array) else string_column(key),
            event_time_ms=numpy_column(np.asarray(event_ms, np.int64) * 1000, EVENT_TIME_TYPE),
            columns=columns,
            arrival_ms=numpy_column(np.asarray(arrival_ms, np.int64), pa.int64()),
        )

    def flush(self) -> Path | None:
        """Write the buffered rows as one batch file (atomically) and return where it is (its local path, or
        its name in the area where the area is not on this machine); None if empty. The buffer is kept if
        the write fails, so a later flush retries it."""
        rows = len(self)
        if not rows:
            return None
        import pyarrow as pa

        from eventing.windows.batches import write_row_file

        self._seal()
        # One record batch per file: the coordinator's compute then runs over whole columns, not over
        # hundreds of small chunks (one per vBucket run). Consecutive runs become one table at once.
        tables: list[pa.Table] = []
        runs: list[_Run] = []
        for chunk in [*self._chunks, None]:
            if isinstance(chunk, _Run):
                runs.append(chunk)
                continue
            if runs:
                tables.append(self._rows_table(*_Run.joined(runs)))
                runs = []
            if chunk is not None:
                tables.append(chunk)
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables).combine_chunks()
        name = write_row_file(self.area, INCOMING, f"{self.prefix}-{self.files_written:09d}", table)
        self.files_written += 1
        self.counters["window_rows_written"] += rows
        self._chunks, self._chunk_rows = [], 0
        return self.area.local_path(name) or Path(name)


@dataclass(frozen=True)
class _Run:
    """Rows of one vBucket's bulk read (add_packed), as read: numpy columns, the keys as an Arrow array and
    the value fields as lists. A flush makes the runs it writes into one Arrow table."""

    vb: int
    seqnos: Any
    keys: pa.Array
    event_ms: Any
    arrival_ms: Any
    values: list[list[Any]]

    def __len__(self) -> int:
        return len(self.seqnos)

    def slice(self, start: int, length: int) -> _Run:
        if start == 0 and length >= len(self):
            return self
        end = start + length
        return _Run(
            self.vb,
            self.seqnos[start:end],
            self.keys.slice(start, length),
            self.event_ms[start:end],
            self.arrival_ms[start:end],
            [column[start:end] for column in self.values],
        )

    @staticmethod
    def joined(runs: list[_Run]) -> tuple[Any, ...]:
        """The columns of consecutive runs, end to end (``_rows_table``'s arguments)."""
        import numpy as np
        import pyarrow as pa

        values: list[list[Any]] = [[] for _ in runs[0].values]
        for run in runs:
            for column, part in zip(values, run.values, strict=True):
                column += part
        return (
            np.repeat(np.array([r.vb for r in runs], np.int32), [len(r) for r in runs]),
            np.concatenate([r.seqnos for r in runs]),
            pa.concat_arrays([r.keys for r in runs]),
            np.concatenate([r.event_ms for r in runs]),
            np.concatenate([r.arrival_ms for r in runs]),
            values,
        )


def arrival_times(batch: PackedUpdates) -> Any:
    """The rows' arrival times of a bulk read, as an int64 numpy array.

    Exact when the read gave each one (``PackedUpdates.arrivals``). Otherwise the first row gets the
    batch's least and every other row its greatest arrival time: the reader asks for each one whenever they
    spread over the shortest idle timeout (``WindowSpec.arrival_gap_ms``), so a spread left out is shorter
    than any timeout, and the coordinator, which only looks for silences at least that long and for the
    greatest arrival time, reaches the same answers as with the exact times."""
    import numpy as np

    n = batch.update_count
    if batch.arrivals is not None:
        return np.array(batch.arrivals, np.int64)
    out = np.full(n, batch.arrival_max_ms, np.int64)
    if n:
        out[0] = batch.arrival_min_ms
    return out


def _split_keys(joined: bytes, n: int) -> pa.Array | None:
    """``n`` UTF-8 keys joined by NUL bytes as an Arrow string array, split in numpy (no Python string per
    key); None if a key holds a NUL byte itself (then the separators do not count n - 1)."""
    import numpy as np
    import pyarrow as pa

    raw = np.frombuffer(joined, np.uint8)
    separators = np.flatnonzero(raw == 0)
    if len(separators) != n - 1:
        return None
    offsets = np.empty(n + 1, np.int32)
    offsets[0] = 0
    # Key i starts after separator i - 1; with the separators removed, i bytes earlier.
    offsets[1:n] = separators - np.arange(n - 1)
    offsets[n] = len(raw) - (n - 1)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(raw[raw != 0]))
