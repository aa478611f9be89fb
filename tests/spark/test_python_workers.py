"""Spark's Python workers under the operator: a reused worker's collections between tasks (store/spark/worker_gc.py:
what a task finds alive is skipped by the daemon's collection after it, and collected by the full one every
`FULL_EVERY` tasks), and the start's word on their sockets (`WORKER_SOCKETS_CONF`)."""

from __future__ import annotations

import gc
import logging
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from statekeeper.store.spark import StatefulOperator
from statekeeper.store.spark.tasks_plan import WORKER_SOCKETS_CONF
from statekeeper.store.spark.worker_gc import FULL_EVERY, WorkerGC
from testkit.processors import CountSum
from tests.spark.helpers import CollectingSink, run_query, write_inputs


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_what_a_task_finds_alive_waits_for_the_full_collection(unfrozen: None) -> None:
    worker = WorkerGC()
    older = Node()
    dead_later = weakref.ref(older)
    worker.task_started()
    assert gc.get_freeze_count() > 0
    young = Node()
    dead_in_task = weakref.ref(young)
    del older, young
    worker.task_ended()
    gc.collect()  # the daemon's collection after the task
    assert dead_in_task() is None  # what the task created is collected at once
    assert dead_later() is not None  # frozen as the task began
    for _ in range(FULL_EVERY - 2):
        worker.task_started()
        worker.task_ended()
        gc.collect()
    assert dead_later() is not None
    worker.task_started()
    worker.task_ended()  # the FULL_EVERY-th task unfreezes
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert dead_later() is None


def test_tasks_in_spark_freeze_their_workers_and_tasks_outside_do_not(
    spark: Any, tmp_path: Path, unfrozen: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="statekeeper.store.spark.tasks_plan")
    write_inputs(tmp_path / "in", files=2, rows=200, keys=40)
    op = StatefulOperator(
        (tmp_path / "state").as_uri(),
        "counts",
        "user",
        CountSum(),
        "user string, count long, total long",
        num_partitions=2,
        sink=CollectingSink(),
    )
    run_query(spark, op, tmp_path / "in", tmp_path / "ckpt")
    assert gc.get_freeze_count() == 0  # the driver (and in-process tasks) never freeze
    assert WORKER_SOCKETS_CONF in caplog.text  # the suite's session keeps Spark's default: TCP

    def frozen(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            yield pa.RecordBatch.from_pydict({"frozen": [gc.get_freeze_count()]})

    # a Python job of the same session runs in the same reused workers as the operator's tasks
    counts = spark.range(4).repartition(4).mapInArrow(frozen, "frozen long").collect()
    assert max(r.frozen for r in counts) > 0
