"""The row-file protocol between workers and the coordinator: which incoming batch files are ready, consumed
or still waiting for an earlier file, which files no committed state lists, and reading ready files without
the rows a restarted worker wrote again.

A worker names each batch by generation, worker, incarnation and a counter without gaps
(``eventing.windows.runtime.row_writer.BATCH_NAME``); the coordinator's ``marks`` hold, per incarnation, the
counter of the next file to consume, so a file is consumed exactly once and in order.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eventing.storage.file_area import FileArea
from eventing.windows.batches import read_row_file
from eventing.windows.runtime.paths import ACCEPTED, ADJUSTED, HELD, INCOMING
from eventing.windows.runtime.row_writer import BATCH_NAME

ACCEPTED_NAME = re.compile(r"^f(\d+)-(\d{9})\.parquet$")
HELD_NAME = re.compile(r"^f(\d+)-(\d{9})\.arrow$")


def incoming_files(area: FileArea, generation: int) -> list[tuple[str, int, str]]:
    """(incarnation, counter, name) of this deployment's batch files; other deployments' are deleted."""
    found = []
    older = []
    for file in area.list(INCOMING):
        match = BATCH_NAME.match(file)
        if not match:
            continue
        if int(match[1]) != generation:
            if int(match[1]) < generation:
                older.append(f"{INCOMING}/{file}")  # a stopped deployment's leftovers
            continue
        found.append((f"{match[2]}-{match[3]}", int(match[4]), f"{INCOMING}/{file}"))
    if older:
        area.delete_many(older)
    return sorted(found)


def ready_files(
    area: FileArea, generation: int, marks: dict[str, int]
) -> tuple[list[str], dict[str, int], list[str], bool]:
    """Files to consume now, the marks after consuming them, files already consumed, and whether a
    file waits for an earlier one of its worker."""
    ready: list[str] = []
    consumed: list[str] = []
    deferred = False
    marks = dict(marks)
    for incarnation, counter, name in incoming_files(area, generation):
        mark = marks.get(incarnation, 0)
        if counter < mark:
            consumed.append(name)
        elif counter == mark:
            ready.append(name)
            marks[incarnation] = counter + 1
        else:
            deferred = True  # an earlier file of the same worker is not visible yet; wait for it
    return ready, marks, consumed, deferred


def drop_orphans(
    area: FileArea,
    generation: int,
    marks: dict[str, int],
    accepted: set[str],
    held: set[str] | None,
    adjusted_next: int,
) -> None:
    """Delete what no committed state lists (a poll that crashed before its commit): accepted files not in
    ``accepted``, incoming files already consumed (and older deployments' batches); with arrival-time
    policies (``held`` not None), held files not in ``held`` and adjusted files from ``adjusted_next`` on
    (the poll's replay writes them again)."""
    orphans = [f"{ACCEPTED}/{f}" for f in area.list(ACCEPTED) if ACCEPTED_NAME.match(f) and f not in accepted]
    _, _, consumed, _ = ready_files(
        area, generation, marks
    )  # listing also deletes older deployments' batches
    orphans += consumed
    if held is not None:
        orphans += [f"{HELD}/{f}" for f in area.list(HELD) if HELD_NAME.match(f) and f not in held]
        for file in area.list(ADJUSTED):
            match = ACCEPTED_NAME.match(file)
            if match and int(match[2]) >= adjusted_next:
                orphans.append(f"{ADJUSTED}/{file}")
    area.delete_many(orphans)


def read_fresh_rows(
    area: FileArea,
    files: list[str],
    names: list[str],
    classified_upto: list[int],
    *,
    function: str | None = None,
) -> tuple[pa.Table, int]:
    """The rows of ``files`` (columns ``names``) above ``classified_upto[vb]`` (copies a restarted worker
    wrote again), the first of each duplicate ``(vb, seqno)``; and how many rows were dropped."""
    table = pa.concat_tables([read_row_file(area, f, function=function).select(names) for f in files])
    read = table.num_rows
    upto = pa.array(classified_upto, pa.int64())
    fresh = pc.greater(table["seqno"], pc.take(upto, table["vb"]))
    if not pc.all(fresh).as_py():  # rows a restarted worker wrote again (filtering costs: only then)
        table = table.filter(fresh)
    if has_duplicate_rows(table):
        table = drop_duplicate_rows(table.sort_by([("vb", "ascending"), ("seqno", "ascending")]))
    return table, read - table.num_rows


def has_duplicate_rows(table: pa.Table) -> bool:
    """Whether two rows share (vb, seqno): a worker's replay within one poll. Checked on one int64 key per
    row, already in order in the common case (a catch-up), else sorted: far cheaper than sorting the table."""
    if table.num_rows < 2:
        return False
    seqno = table["seqno"].to_numpy()
    if seqno.max() >= 1 << 43:
        return True  # the key would overflow: let the table sort decide
    key = (table["vb"].to_numpy().astype(np.int64) << 43) | seqno
    if (key[1:] > key[:-1]).all():
        return False
    key.sort()
    return bool((key[1:] == key[:-1]).any())


def drop_duplicate_rows(table: pa.Table) -> pa.Table:
    """Keep the first of rows with equal (vb, seqno) in a table sorted by them (a worker replay within one
    poll)."""
    if table.num_rows < 2:
        return table
    vb = table["vb"].combine_chunks()
    seqno = table["seqno"].combine_chunks()
    same = pc.and_(pc.equal(vb[1:], vb[:-1]), pc.equal(seqno[1:], seqno[:-1]))
    if not pc.any(same).as_py():
        return table
    keep = pa.concat_arrays([pa.array([True]), pc.invert(same)])
    return table.filter(keep)


def max_seqno_per_vb(table: pa.Table) -> dict[int, int]:
    grouped = table.group_by("vb").aggregate([("seqno", "max")])
    return dict(zip(grouped["vb"].to_pylist(), grouped["seqno_max"].to_pylist(), strict=True))
