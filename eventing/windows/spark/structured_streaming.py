"""Spark Structured Streaming over the same row batches: the reference our windowing is benchmarked and
checked against.

Structured Streaming emits a window in append mode only once its watermark (max event time seen minus
``watermark_delay_ms``) passes the window's end, so the last windows of a finite input never close by
themselves. ``write_watermark_sentinel`` adds one row far in the future to the stream's input: it moves the
watermark past every real window and its own window never closes, so it never appears in the results.
``aggregate_windows`` ignores it too as long as its window is not asked for.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession

from eventing.windows.batches import (
    EVENT_TIME,
    ROW_ID_COLUMNS,
    AggregateColumn,
    build_row_batch,
    check_aggregates,
    result_schema,
    row_schema,
    write_row_batch,
)
from eventing.windows.spark.spark_job import (
    aggregate_column,
    check_window_shape,
    results_from_windowed,
    spark_ddl,
    to_result_table,
    window_column,
)

# Year 2200: later than any real event time, still well inside Spark's timestamp range.
SENTINEL_EVENT_TIME_MS = 7_258_118_400_000
SENTINEL_BATCH_NAME = "zz-watermark-sentinel"


def write_watermark_sentinel(
    rows_dir: str | os.PathLike[str],
    group_by: Sequence[str],
    value_fields: Sequence[str],
    *,
    event_time_ms: int = SENTINEL_EVENT_TIME_MS,
) -> Path:
    """Write one row at ``event_time_ms`` (vb -1, so it collides with no real row) that closes every earlier
    window."""
    schema = row_schema(group_by, value_fields)
    batch = build_row_batch(
        schema, vb=[-1], seqno=[0], key=["__watermark_sentinel__"], event_time_ms=[event_time_ms]
    )
    return write_row_batch(rows_dir, SENTINEL_BATCH_NAME, batch)


def run_structured_streaming(
    spark: SparkSession,
    rows_dir: str | os.PathLike[str],
    *,
    size_ms: int,
    group_by: list[str],
    aggregates: list[AggregateColumn],
    watermark_delay_ms: int,
    out_dir: str | os.PathLike[str],
    slide_ms: int | None = None,
    max_files_per_trigger: int | None = None,
    on_terminated: Callable[[], object] | None = None,
) -> pa.Table:
    """Run the windowed aggregation as a Structured Streaming query over the Parquet files in ``rows_dir``.

    Reads the folder as a file stream with the row schema, sets the watermark on ``event_time``, drops
    duplicate ``(vb, seqno)`` within the watermark, groups by ``window(event_time, size[, slide])`` and the
    group columns, writes append-mode Parquet to ``<out_dir>/results`` with the checkpoint in
    ``<out_dir>/checkpoint`` and trigger ``availableNow`` (process what is there, then stop). Returns every
    window emitted so far in ``aggregate_windows``'s layout and order. Rerunning with the same ``out_dir``
    resumes from the checkpoint and only adds windows closed since.

    The results equal ``aggregate_windows`` over the same closed windows when no row is later than the
    watermark of the micro-batch that reads it: always with one micro-batch (the default), not with a small
    ``max_files_per_trigger`` over shuffled event times, where Spark drops the late rows silently.
    """
    slide = size_ms if slide_ms is None else slide_ms
    check_window_shape(size_ms, slide)
    if watermark_delay_ms < 0:
        raise ValueError(f"watermark delay {watermark_delay_ms} ms must not be negative")
    value_fields = check_aggregates(aggregates, group_by)
    out = Path(out_dir)
    results_path = out / "results"
    schema = result_schema(group_by, aggregates)

    reader = spark.readStream.schema(spark_ddl(row_schema(group_by, value_fields)))
    if max_files_per_trigger is not None:
        reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
    windowed = (
        reader.parquet(os.fspath(rows_dir))
        .withWatermark(EVENT_TIME, f"{watermark_delay_ms} milliseconds")
        # Copies of a row share its event time, so any replay arrives within the watermark delay of itself.
        .dropDuplicatesWithinWatermark(list(ROW_ID_COLUMNS))
        .groupBy(window_column(size_ms, slide).alias("window"), *group_by)
        .agg(*(aggregate_column(op, field, name) for op, field, name in aggregates))
    )
    query = (
        results_from_windowed(windowed, group_by, aggregates)
        .writeStream.format("parquet")
        .outputMode("append")
        .option("path", os.fspath(results_path))
        .option("checkpointLocation", os.fspath(out / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if on_terminated is not None:
        on_terminated()  # before the results are read back: a benchmark times the query alone
    error = query.exception()
    if error is not None:
        raise RuntimeError(f"Structured Streaming query over {rows_dir} failed: {error}")
    # Reading the sink's folder goes through its _spark_metadata log, so only committed files count.
    return to_result_table(spark.read.schema(spark_ddl(schema)).parquet(os.fspath(results_path)), schema)
