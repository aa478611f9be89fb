"""How a batch's partition tasks run, and how the driver learns each one's result (checkpoint id, metrics).

Two ways, one per kind of batch:

- **In the sink's job** (`TasksJob.in_sink`): the user's sink gets the tasks' output as it comes out of them, so
  its own action runs the tasks; each task adds its result to a Spark accumulator, which Spark merges on the
  driver once per successful task, and outputs only the processor's rows. No output is cached, filtered or read
  by a second job. A sink that does not read every partition to its end (``limit``, ``show``, nothing at all)
  leaves some results missing: the driver then runs a tasks job of its own for them, whose output nobody reads.
- **In the driver's own job** (`TasksJob.own`: no sink, Spark Connect, a re-run batch, a rescale): the output is
  cached where a sink will read it, the result rows collected, and the sink reads the cache after the commit.

Either way the commit record names one committed attempt of each partition: the attempt whose output the sink
read when it read it once (a sink that reads it twice ran the tasks twice: the last attempt's result counts,
each computing the same state from the same version and input).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from statekeeper.store.errors import StatekeeperError
from statekeeper.store.spark.batch_records import BatchRecords, UploadTimeoutError
from statekeeper.store.spark.connect import is_connect_dataframe
from statekeeper.store.spark.executor import TaskSpec, run_task
from statekeeper.store.spark.metrics import PartitionMetrics
from statekeeper.store.spark.task_output import META_COL
from statekeeper.store.spark.tasks_plan import OutputFilters, TasksRun, tasks_job_settings

if TYPE_CHECKING:
    from pyspark.accumulators import Accumulator
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

Sink = Callable[["DataFrame", int], None]


class _ResultsParam:
    """A Spark accumulator of JSON results: lists joined in the order Spark merges them (task completion)."""

    def zero(self, value: list[str]) -> list[str]:
        return []

    def addInPlace(self, value1: list[str], value2: list[str]) -> list[str]:  # noqa: N802 (PySpark's name)
        value1.extend(value2)
        return value1


@dataclass(frozen=True)
class TasksJob:
    """What running one batch's tasks needs from its operator."""

    name: str
    records: BatchRecords
    filters: OutputFilters
    out_struct: StructType
    """The tasks' output in the driver's own job: the processor's rows and META_COL (the results' rows); in the
    sink's job, the same without META_COL."""
    async_checkpoint: bool
    upload_timeout_s: float
    max_batch_attempts: int

    @staticmethod
    def runs_in_sink(sink: Sink | None, df: DataFrame, spec: TaskSpec) -> bool:
        """A committing batch with a sink runs in the sink's job; not a rescale (its new layout is committed
        before the batch's record), nor over Spark Connect (no accumulators)."""
        return sink is not None and spec.commit and spec.rescale is None and not is_connect_dataframe(df)

    def in_sink(self, sink: Sink, plan: DataFrame, spec: TaskSpec, target: int, batch_id: int) -> TasksRun:
        """The sink's job runs the tasks; the results they report, or a job of the driver's own when the sink
        left a partition unread or an upload timed out."""
        from pyspark.sql.types import StructType

        results: Accumulator[list[str]] = plan.sparkSession.sparkContext.accumulator([], _ResultsParam())  # type: ignore[arg-type]
        try:
            t_job, started_at_ms = time.perf_counter(), time.time() * 1000
            # The results go by the accumulator: the tasks' output is the processor's rows only, the sink's as is.
            rows_schema = spec.output_schema.remove(spec.output_schema.get_field_index(META_COL))
            rows_struct = StructType([f for f in self.out_struct.fields if f.name != META_COL])
            task = functools.partial(run_task, dataclasses.replace(spec, results=results, output_schema=rows_schema))
            out = plan.mapInArrow(task, rows_struct)
            sink(out, batch_id)
            job_ms = (time.perf_counter() - t_job) * 1000
            metas = _latest_each(results.value, spec.num_partitions)
        finally:
            _forget(results)
        if metas is None:
            log.info(
                "statekeeper %s batch %d: the sink left a partition unread; running the tasks", self.name, batch_id
            )
        else:
            t_wait = time.perf_counter()
            try:
                if self.async_checkpoint:
                    self.records.await_uploads(target, metas, self.upload_timeout_s)
                return TasksRun(out, metas, 1, job_ms, started_at_ms, (time.perf_counter() - t_wait) * 1000, True)
            except UploadTimeoutError as e:
                log.warning("statekeeper %s batch %d: %s; running the tasks again", self.name, batch_id, e)
        run = self.own(plan, spec, target, batch_id, keep_output=False)
        return dataclasses.replace(run, attempts=run.attempts + 1, job_ms=job_ms + run.job_ms, in_sink=True)

    def own(self, plan: DataFrame, spec: TaskSpec, target: int, batch_id: int, *, keep_output: bool) -> TasksRun:
        """The driver's own tasks job, its output cached for the sink when `keep_output`; re-run while an upload
        times out."""
        attempt = 0
        with tasks_job_settings(plan):
            while True:
                attempt += 1
                t_job, started_at_ms = time.perf_counter(), time.time() * 1000
                out = plan.mapInArrow(functools.partial(run_task, spec), self.out_struct)
                if keep_output:  # otherwise only the collect reads the output: nothing to keep
                    out = out.cache()  # deserialized: the collect and the sink read it without decoding
                try:
                    metas = _one_each(self.name, self.filters.result_json(out), spec.num_partitions)
                    job_ms = (time.perf_counter() - t_job) * 1000
                    t_wait = time.perf_counter()
                    if spec.commit and self.async_checkpoint:
                        self.records.await_uploads(target, metas, self.upload_timeout_s)
                    wait_ms = (time.perf_counter() - t_wait) * 1000
                    return TasksRun(out, metas, attempt, job_ms, started_at_ms, wait_ms)
                except UploadTimeoutError as e:
                    out.unpersist()
                    if attempt >= self.max_batch_attempts:
                        raise
                    log.warning(
                        "statekeeper %s batch %d attempt %d failed: %s; re-running", self.name, batch_id, attempt, e
                    )
                except BaseException:
                    out.unpersist()
                    raise


def _forget(results: Accumulator[list[str]]) -> None:
    """Drop the batch's accumulator from PySpark's driver registry, which keeps every accumulator (and its value)
    for the life of the process: one a batch would grow without bound. A late update of it is then ignored."""
    from pyspark import accumulators

    accumulators._accumulatorRegistry.pop(results.aid, None)


def _latest_each(texts: list[str], n: int) -> list[PartitionMetrics] | None:
    """Each partition's last reported result, or None when a partition reported none."""
    by_partition: dict[int, PartitionMetrics] = {}
    for text in texts:
        m = PartitionMetrics.from_meta(json.loads(text))
        by_partition[m.partition] = m
    return [by_partition[p] for p in range(n)] if sorted(by_partition) == list(range(n)) else None


def _one_each(name: str, texts: list[str], n: int) -> list[PartitionMetrics]:
    """Exactly one result row from each partition, collected from the driver's own job."""
    metas = [PartitionMetrics.from_meta(json.loads(r)) for r in texts]
    by_partition = {m.partition: m for m in metas}
    if len(by_partition) != len(metas) or sorted(by_partition) != list(range(n)):
        raise StatekeeperError(
            f"statekeeper {name}: expected one result from each of partitions 0..{n - 1}, got "
            f"{sorted(m.partition for m in metas)}"
        )
    return [by_partition[p] for p in range(n)]


__all__ = ["Sink", "TasksJob"]
