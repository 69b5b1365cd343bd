"""Windowed aggregation wired into the runtime: workers extract rows, a coordinator in the service windows
them.

``row_writer`` (worker side) turns each on_update mutation of a windowed function into one row and writes the
rows as one Arrow batch file per checkpoint into ``incoming/`` of the function's file area (``paths``:
``<data_dir>/windows/<fn>/`` on a data directory, a table on PostgreSQL), before the checkpoint moves.
``coordinator`` (service side) reads those batches, judges them with
``eventing.windows.semantics.WindowOperator`` (each vBucket is a partition), sends late rows to the
dead-letter queue, keeps the partial aggregates of accepted rows (Parquet), checkpoints its state in the
metadata store, and has PySpark merge each closed window's partials into its result, which the sink stores
exactly once; it orchestrates ``row_files`` (the batch-file protocol), ``arrivals`` (arrival-time policies),
``session_chains``, ``late_letters`` (dead letters), ``coordinator_state`` (what it commits) and ``emission``
(Spark jobs and the sink). ``host`` runs the coordinators of an ``EventingService``. Submodules are imported
explicitly: importing this package costs nothing.
"""
