"""Where a restarting driver stands: the batch -> version mapping, the layout, and rescale at restart.

Versions and batch ids usually differ by one (batch ``b`` commits version ``b + 1``), but a rescale or
a rollback commits a version without running a batch (it repeats the batch id of the state it copies,
`CommitRecord.batch_id`), so the driver reads the offset from the newest commit record. When the
operator is started with a ``num_partitions`` other than its recorded layout's, the driver rescales
before the batch (store/rescale.py: each new partition takes exactly its key-group ranges, and one
commit record names the new layout), so the batch runs on the new layout.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from statekeeper.store.commit_log import CommitLog
from statekeeper.store.errors import ConfigurationError
from statekeeper.store.files import CheckpointFileManager
from statekeeper.store.formats.commit import CommitRecord
from statekeeper.store.key_groups import KeyGroupLayout
from statekeeper.store.rescale import (
    BuildRun,
    PartitionBuild,
    PartitionRunner,
    RelayoutResult,
    contiguous_runs,
    execute_relayout,
    plan_rescale,
)
from statekeeper.store.spark.rescale_rules import TypedStateKeys
from statekeeper.store.state_store import StoreConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Head:
    """The operator's committed head as the driver sees it before batch ``batch_id``."""

    record: CommitRecord | None
    shift: int
    """Batch ``b`` loads version ``b + shift``."""
    rerun: bool
    """Spark re-runs the batch of the newest commit record (its state is already committed)."""

    @property
    def layout(self) -> KeyGroupLayout | None:
        return None if self.record is None else next(iter(self.record.layouts.values()), None)

    @property
    def partitions(self) -> int | None:
        return None if self.record is None else len(next(iter(self.record.checkpoint_ids.values())))


def read_head(commit_log: CommitLog, fm: CheckpointFileManager, operator: str, batch_id: int) -> Head:
    """The head before ``batch_id``; raises when the state root and Spark's checkpoint disagree."""
    latest = commit_log.latest()
    record = commit_log.get(latest) if latest > 0 else None
    last_batch = record.batch if record is not None else -1
    if batch_id not in (last_batch, last_batch + 1):
        if batch_id > last_batch + 1:
            raise ConfigurationError(
                f"statekeeper operator {operator!r} in {fm.root_uri} has state up to batch {last_batch} (version "
                f"{latest}), but Spark asks for batch {batch_id}: the state root is behind the query's checkpoint (a "
                "new or replaced state root for an existing query?). Use a fresh Spark checkpoint location with it."
            )
        raise ConfigurationError(
            f"statekeeper operator {operator!r} in {fm.root_uri} has state up to batch {last_batch} (version "
            f"{latest}), but Spark asks for batch {batch_id}: the query's checkpoint is behind the state root "
            "(a new or reset Spark checkpoint location?). After a rollback, make the query restart at batch "
            f"{last_batch + 1} (docs/rescale.md). Use the matching Spark checkpoint or a fresh state root."
        )
    if record is not None and (operator not in record.checkpoint_ids or len(record.checkpoint_ids) != 1):
        raise ConfigurationError(
            f"the commit records in {fm.root_uri} belong to operators {sorted(record.checkpoint_ids)}; "
            f"use one state root per operator (not {operator!r})"
        )
    return Head(record, latest - last_batch - 1, record is not None and batch_id == last_batch)


def task_slots(spark: Any) -> int | None:
    """How many tasks the session's executors run at once (classic); None where it cannot say (Connect)."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect has no SparkContext
        return None


def on_executors(spark: Any) -> PartitionRunner:
    """Build the new partitions as one Spark job on the query's own executors (classic or Connect): the
    copy runs in parallel beside the data instead of on the driver.

    One task per slot, each building a run of neighbouring partitions (`contiguous_runs`: a Python task
    costs ~30 ms on top of its builds, and neighbours share the old partitions they load); one task per
    partition where the slots are unknown.
    """

    def run(build: BuildRun, partitions: list[int]) -> list[PartitionBuild]:
        runs = contiguous_runs(partitions, task_slots(spark) or len(partitions))

        def task(batches: Iterator[Any]) -> Iterator[Any]:
            import pyarrow as pa

            for batch in batches:
                done = [json.dumps(dataclasses.asdict(b)) for i in batch.column(0).to_pylist() for b in build(runs[i])]
                yield pa.RecordBatch.from_pydict({"build": done}, schema=pa.schema([("build", pa.string())]))

        tasks = len(runs)
        rows = spark.range(0, tasks, 1, tasks).mapInArrow(task, "build string").collect()  # one index per task
        return [PartitionBuild(**json.loads(r[0])) for r in rows]

    return run


def rescale_at_restart(
    fm: CheckpointFileManager,
    operator: str,
    partitions: int,
    store_config: StoreConfig,
    spark: Any = None,
    workers: int = 4,
) -> RelayoutResult:
    """Commit the operator's head re-laid out over ``partitions`` partitions (before the next batch):
    its new partitions built on `spark`'s executors, or on `workers` threads here without a session."""
    plan = plan_rescale(fm, operator, partitions, rules=TypedStateKeys(), config=store_config)
    log.info("statekeeper %s: rescaling at restart: %s", operator, plan.describe())
    runner = on_executors(spark) if spark is not None else None
    return execute_relayout(fm, plan, rules=TypedStateKeys(), config=store_config, workers=workers, runner=runner)


__all__ = ["Head", "on_executors", "read_head", "rescale_at_restart", "task_slots"]
