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
            "batch timestamp file, plan). job outside tasks = tasks job - slowest task (the shuffle's map stage, "
            "the other wave of tasks when partitions outnumber cores: 4 on local[2], scheduling, the JVM's side "
            "of each task: shuffle read, sort, Arrow both ways, caching the output). Placed on the wall clock: "
            "before 1st task = job start to the first task function's start (planning, the map stage, the "
            "first task's shuffle read and sort); tasks' span = first task's start to last task's end; after "
            "last task = to the job's end (caching the last output, collecting the results).",
            "task: to 1st input batch = from the task function's start to its first Arrow batch (shuffle read); "
            "input wait = later waits on Spark's input iterator; output to Spark = time handing our output "
            "batches to the JVM; user logic + state = the processor and its state reads/writes.",
            "Spark jobs / batch: jobs of the query's job group divided by its batches (statusTracker). "
            "fresh workers: tasks that ran in a Python worker's first task. worker peak RSS: the largest "
            "ru_maxrss of any task's worker.",
        ],
    )


__all__ = ["COLUMNS", "TASK_PHASES", "trace_row", "trace_table"]
