"""The per-phase trace of statekeeper's Spark batches, summarised for ``bench spark``.

Each batch's :class:`~store.spark.metrics.BatchProgress` carries the driver's phases and, per partition,
the task's trace (``PartitionMetrics.phases``). This module turns a query's batches into one row of
medians: the driver's own work, the tasks job, and inside the slowest task where its time went; plus
what Spark adds around the foreachBatch function (trigger duration minus our batch duration).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bench.report import Table

TASK_PHASES = (
    "first_batch_ms",
    "input_wait_ms",
    "convert_ms",
    "user_state_ms",
    "output_build_ms",
    "output_emit_ms",
)
COLUMNS = [
    "query",
    "trigger ms",
    "Spark around foreachBatch ms",
    "driver before job ms",
    "tasks job ms",
    "slowest task ms",
    "task: to 1st input batch",
    "task: input wait",
    "task: Arrow to Python",
    "task: load",
    "task: user logic + state",
    "task: commit + upload",
    "task: output build",
    "task: output to Spark",
    "job outside tasks ms",
    "job: before 1st task",
    "job: tasks' span",
    "job: after last task",
    "commit record ms",
    "sink ms",
    "Spark jobs / batch",
    "fresh workers",
    "worker peak RSS MB",
]


def _med(values: list[float]) -> float:
    return float(np.median(values)) if values else float("nan")


def trace_row(name: str, progress: list[Any], trigger_ms: list[float], jobs_per_batch: float) -> list[Any]:
    """One row of :data:`COLUMNS` from a query's steady batches (BatchProgress) and trigger durations."""
    slowest = [max(p.partitions, key=lambda m: m.task_ms) for p in progress if p.partitions]
    tasks = [m for p in progress for m in p.partitions]

    def phase(key: str) -> float:
        return round(_med([m.phases.get(key, 0.0) for m in slowest]), 1)

    before = [
        p.duration_ms - p.job_ms - (p.upload_ms if p.async_checkpoint else 0.0) - p.commit_record_ms - p.sink_ms
        for p in progress
    ]
    return [
        name,
        round(_med(trigger_ms)),
        round(_med(trigger_ms) - _med([p.duration_ms for p in progress])),
        round(_med(before), 1),
        round(_med([p.job_ms for p in progress])),
        round(_med([m.task_ms for m in slowest])),
        phase("first_batch_ms"),
        phase("input_wait_ms"),
        phase("convert_ms"),
        round(_med([m.load_ms for m in slowest]), 1),
        phase("user_state_ms"),
        round(_med([m.commit_ms + m.upload_ms for m in slowest]), 1),
        phase("output_build_ms"),
        phase("output_emit_ms"),
        round(_med([p.job_ms - max(m.task_ms for m in p.partitions) for p in progress if p.partitions])),
        *_job_timeline(progress),
        round(_med([p.commit_record_ms for p in progress]), 1),
        round(_med([p.sink_ms for p in progress])),
        round(jobs_per_batch, 1),
        f"{sum(1 for m in tasks if m.phases.get('worker_tasks_before', 1) == 0)} of {len(tasks)}",
        round(max((m.phases.get("worker_peak_rss_mb", 0.0) for m in tasks), default=0.0)),
    ]


def _job_timeline(progress: list[Any]) -> list[float]:
    """Medians of the tasks job's time before its first task started, from the first task's start to the
    last one's end, and after the last task ended (wall clocks of one machine: local mode)."""
    before, span, after = [], [], []
    for p in progress:
        starts = [m.phases.get("started_at_ms") for m in p.partitions]
        ends = [m.phases.get("ended_at_ms") for m in p.partitions]
        if not p.partitions or not p.job_started_at_ms or None in starts or None in ends:
            continue
        before.append(min(starts) - p.job_started_at_ms)
        span.append(max(ends) - min(starts))
        after.append(p.job_started_at_ms + p.job_ms - max(ends))
    return [round(_med(before)), round(_med(span)), round(_med(after))]


def trace_table(rows: list[list[Any]]) -> Table:
    return Table(
        "Where a statekeeper batch's time goes (ms, median over the steady batches; task columns: the slowest task)",
        COLUMNS,
        rows,
        [
            "Recorded on every batch (BatchProgress, PartitionMetrics.phases); STATEKEEPER_SPARK_TRACE=<file> "
            "appends each batch's full trace, every partition, as a JSON line.",
            "Spark around foreachBatch = trigger duration - our batch function (offsets and commit logs, source "
            "listing, progress). driver before job = our function's work before the tasks job (commit log read, "
            "batch timestamp file, plan). tasks job = the sink's call, whose job runs the tasks. job outside "
            "tasks = tasks job - slowest task (planning, the shuffle's map stage, the other wave of tasks when "
            "partitions outnumber cores: 4 on local[2], scheduling, the JVM's side of each task: shuffle read, "
            "Arrow both ways, the sink's write). Placed on the wall clock: "
            "before 1st task = job start to the first task function's start (planning, the map stage, the "
            "first task's shuffle read); tasks' span = first task's start to last task's end; after "
            "last task = to the job's end (the last output's write, the results' merge).",
            "task: to 1st input batch = from the task function's start to its first Arrow batch (shuffle read); "
            "input wait = later waits on Spark's input iterator; output to Spark = time handing our output "
            "batches to the JVM; user logic + state = the processor and its state reads/writes.",
            "Spark jobs / batch: jobs of the query's job group divided by its batches (statusTracker). "
            "fresh workers: tasks that ran in a Python worker's first task. worker peak RSS: the largest "
            "peak RSS of a task's worker while the task ran (Linux VmHWM, reset at the task's start).",
        ],
    )


PER_ROW_COLUMNS = [
    "keys",
    "rows / batch",
    "query",
    "trigger µs/row",
    "Spark around foreachBatch µs/row",
    "tasks job µs/row",
    "task: load µs/row",
    "task: input read µs/row",
    "task: Arrow to Python + grouping µs/row",
    "task: user logic + state µs/row",
    "task: commit + upload µs/row",
    "task: output build µs/row",
    "task: output to Spark µs/row",
    "job outside tasks µs/row",
    "sink after the commit record µs/row",
    "worker RSS at task start MB",
    "of it RocksDB MB",
    "worker peak RSS MB",
]


def per_row(keys: int, rows: int, name: str, progress: list[Any], trigger_ms: list[float]) -> list[Any]:
    """One row of :data:`PER_ROW_COLUMNS`: where each input row's time goes (µs per row, medians over the steady
    batches). Task phases are the slowest task's, divided by that task's own input rows; the batch's phases
    (trigger, job, sink) by the batch's input rows."""
    slowest = [max(p.partitions, key=lambda m: m.task_ms) for p in progress if p.partitions]

    def task(of: Any) -> float:
        return round(_med([of(m) * 1000 / m.input_rows for m in slowest if m.input_rows]), 2)

    def batch(of: Any) -> float:
        return round(_med([of(p) * 1000 / p.input_rows for p in progress if p.input_rows]), 2)

    per_batch = _med([float(p.input_rows) for p in progress])
    trigger = _med(trigger_ms) * 1000 / per_batch if per_batch else float("nan")
    ours = batch(lambda p: p.duration_ms)
    return [
        keys,
        rows,
        name,
        round(trigger, 2),
        round(trigger - ours, 2),
        batch(lambda p: p.job_ms),
        task(lambda m: m.load_ms),
        task(lambda m: m.phases.get("first_batch_ms", 0.0) + m.phases.get("input_wait_ms", 0.0)),
        task(lambda m: m.phases.get("convert_ms", 0.0)),
        task(lambda m: m.phases.get("user_state_ms", 0.0)),
        task(lambda m: m.commit_ms + m.upload_ms),
        task(lambda m: m.phases.get("output_build_ms", 0.0)),
        task(lambda m: m.phases.get("output_emit_ms", 0.0)),
        batch(lambda p: p.job_ms - max((m.task_ms for m in p.partitions), default=0.0)),
        batch(lambda p: p.sink_ms),
        *_peak_task_memory(progress),
    ]


def _peak_task_memory(progress: list[Any]) -> list[int]:
    """Of the task whose worker peaked highest: the worker's RSS when the task began, RocksDB's share of it (the
    shared cache and memtables, at the task's end), and the peak; peak - start is what the task itself needed."""
    tasks = [m for p in progress for m in p.partitions]
    if not tasks:
        return [0, 0, 0]
    top = max(tasks, key=lambda m: m.phases.get("worker_peak_rss_mb", 0.0))
    return [round(top.phases.get(k, 0.0)) for k in ("worker_start_rss_mb", "rocksdb_mb", "worker_peak_rss_mb")]


def per_row_table(rows: list[list[Any]]) -> Table:
    return Table(
        "Where each input row's time goes (µs per row, median over the steady batches; task columns: the slowest "
        "task, per row of its own input)",
        PER_ROW_COLUMNS,
        rows,
        [
            "The per-phase trace above divided by rows: task phases by the slowest task's input rows, the batch's "
            "(trigger, Spark around it, tasks job, job outside tasks, sink) by the batch's input rows.",
            "input read = to the first input batch + later waits on Spark's iterator (shuffle read, the JVM's Arrow). "
            "Arrow to Python + grouping = sorting the task's input by key (Arrow), converting each chunk to rows / one "
            "pandas frame and finding its keys' runs (one timer). user logic + state = the processor with its state "
            "reads, writes and their codec, "
            "and (pandas) cutting each key's frame from the chunk's as the processor takes it (one timer). "
            "output build = the output rows / frames to Arrow. sink after the commit record = the sink's "
            "call after the record (0 when the sink's own job ran the tasks, as here: its time is the tasks job's).",
            "Task columns are one core's cost per row (each task runs on one of the 2 cores); the batch's columns "
            "are wall clock per row of the batch.",
            "worker peak RSS: the largest peak RSS of a worker while one of the query's tasks ran (VmHWM, reset at "
            "each task's start); it includes what the worker holds for earlier tasks and queries (spark.python."
            "worker.reuse): their open stores and the shared RocksDB cache, filled up to STATEKEEPER_MEMORY_MB. "
            "The two columns before it are that task's: its worker's RSS when it began (the interpreter, PySpark, "
            "pandas and pyarrow, the open stores, RocksDB) and RocksDB's share (block cache and memtables, "
            "charged to one cache); peak - start is what the task itself needed.",
        ],
    )


__all__ = ["COLUMNS", "PER_ROW_COLUMNS", "TASK_PHASES", "per_row", "per_row_table", "trace_row", "trace_table"]
