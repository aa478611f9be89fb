"""How the driver writes a batch's tasks job in Spark: the input plan, the session settings it runs
with, and the filters that split its output into the partitions' results and the processor's rows.

Everything that does not change between batches is built once per input schema, partition count and
layout (`TasksPlan`): each Column a driver builds costs several py4j round trips and each Dataset
operation an analysis, so a batch adds only the three operations of `TasksPlan.input` (four where Spark sorts the
partitions: `sort_in_task`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from statekeeper.store.spark.connect import is_connect_dataframe
from statekeeper.store.spark.executor import MARKER_COL, PID_COL
from statekeeper.store.spark.metrics import PartitionMetrics
from statekeeper.store.spark.routing import group_column, hash_routes, owner_sql, partition_column
from statekeeper.store.spark.task_input import GROUP_COL
from statekeeper.store.spark.task_output import META_COL

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from statekeeper.store.key_groups import KeyGroupLayout

log = logging.getLogger(__name__)

WORKER_SOCKETS_CONF = "spark.python.unix.domain.socket.enabled"
"""Spark's setting (4.1+, read as the SparkContext starts) for its Python workers to talk to the JVM over Unix domain
sockets. Over TCP on loopback (the default) Linux's delayed acknowledgements stall a Python task's input and its end
for up to 40 ms each, whatever the operator (what that costs a batch: docs/benchmarks.md, spark)."""

TASKS_JOB_SETTINGS = {
    # Adaptive execution gains nothing on this plan (its shuffle has a fixed partition count, which it
    # must keep) but runs the shuffle's map stage, the cached tasks and the driver's read of their
    # results as three jobs: about 60 ms more per batch on local[2].
    "spark.sql.adaptive.enabled": "false",
    # Any other byte limit makes the JVM measure its Arrow batch after every row it adds: a tenth of the
    # tasks' JVM time. Batches stay bounded by rows (maxRecordsPerBatch), and the task bounds what it
    # converts at once by bytes itself (task_input_budget_bytes).
    "spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1),
    # The cached task output lives for one batch: compressing its columns costs more than it saves.
    "spark.sql.inMemoryColumnarStorage.compressed": "false",
}
"""Session settings the tasks job is planned and run with."""


@dataclass(frozen=True)
class TasksPlan:
    """The batch-independent parts of the tasks job's input."""

    partitions: int
    markers: DataFrame
    """One row per partition: null input columns and what tells the task its partition."""
    data: list[Column]
    """The input's columns, then the internal columns the task needs (task_input.py)."""
    route: Column
    """The value Spark hashes to send a row to its partition's task (`hash_routes`): not a column the task gets."""
    order: list[Column] | None
    """Spark's sort of each partition; None where the task sorts its input (`sort_in_task`)."""

    @classmethod
    def build(
        cls,
        spark: SparkSession,
        schema: StructType,
        key: tuple[str, ...],
        n: int,
        layout: KeyGroupLayout | None,
    ) -> TasksPlan:
        """The plan for `n` partitions owning `layout`'s key groups, or routed by Spark's hash of the key (None)."""
        from pyspark.sql import functions as sf

        in_task = sort_in_task(schema, key)
        routes = sf.array(*[sf.lit(r) for r in hash_routes(n)])
        nulls = [sf.lit(None).cast(f.dataType).alias(f.name) for f in schema.fields]
        marker_pid = sf.col("id").cast("int")
        if layout is not None and in_task:
            # Each row carries only its key group: the task sorts by it first (then reads and writes its state in
            # the store's key order: RocksDB inserts a run of ascending keys into its memtable several times faster
            # than the same keys in any other order, and the changelog it writes replays as fast), and checks its
            # rows against its groups. A marker's is -(partition + 1). The route is computed from it as Spark
            # partitions the rows, not shipped: each column a task gets costs the JVM's Arrow conversion and the
            # shuffle (measured: the partition, marker and route columns took ~20% of a 500k-row batch).
            owner = sf.expr(f"if({GROUP_COL} < 0, -{GROUP_COL} - 1, {owner_sql(GROUP_COL, layout)})")
            group = group_column(schema, key, layout.max_key_groups)
            markers = spark.range(n).select(*nulls, (-marker_pid - 1).alias(GROUP_COL))
            return cls(n, markers, [sf.col("*"), group.alias(GROUP_COL)], sf.element_at(routes, owner + 1), None)
        pid = partition_column(schema, key, n, layout)
        markers = spark.range(n).select(*nulls, marker_pid.alias(PID_COL), sf.lit(True).alias(MARKER_COL))
        data = [sf.col("*"), pid.alias(PID_COL), sf.lit(False).alias(MARKER_COL)]
        # Where the task cannot sort its input: Spark sorts it, each key's rows together, the marker first (its
        # key is all nulls, and it leads any data row whose key is too), so the task learns its partition before
        # any data. The key leads so that Spark's sort compares rows by the key's prefix, not whole rows (the
        # marker flag as the first sort key made every prefix equal: a fifth of the tasks' JVM time).
        order = None if in_task else [*[sf.col(k).asc_nulls_first() for k in key], sf.col(MARKER_COL).desc()]
        return cls(n, markers, data, sf.element_at(routes, sf.col(PID_COL) + 1), order)

    def input(self, df: DataFrame) -> DataFrame:
        """The batch's rows and the markers, each partition's rows in the task of that partition (by key where
        Spark sorts them)."""
        routed = df.select(*self.data).unionByName(self.markers).repartition(self.partitions, self.route)
        return routed if self.order is None else routed.sortWithinPartitions(*self.order)


_SORTABLE = (
    "ByteType",
    "ShortType",
    "IntegerType",
    "LongType",
    "FloatType",
    "DoubleType",
    "DecimalType",
    "StringType",
    "VarcharType",
    "CharType",
    "BinaryType",
    "BooleanType",
    "DateType",
    "TimestampType",
    "TimestampNTZType",
)


def sort_in_task(schema: StructType, key: tuple[str, ...]) -> bool:
    """Whether the task sorts its input by key (Arrow's sort of these key types, several times cheaper per row
    than Spark's sort of the same rows), rather than Spark sorting each partition before the task."""
    types = {f.name: type(f.dataType).__name__ for f in schema.fields}
    return all(types.get(k) in _SORTABLE for k in key)


@dataclass(frozen=True)
class OutputFilters:
    """The tasks job's output holds the partitions' results (META_COL set) and the processor's rows."""

    results: Column
    rows: Column

    @classmethod
    def build(cls) -> OutputFilters:
        from pyspark.sql import functions as sf

        return cls(sf.col(META_COL).isNotNull(), sf.col(META_COL).isNull())

    def output(self, out: DataFrame) -> DataFrame:
        """What the processor produced, for the sink."""
        return out.filter(self.rows).drop(META_COL)

    def result_json(self, out: DataFrame) -> list[str]:
        """Each partition's result (JSON), collected to the driver: the action that runs the tasks job."""
        return [r[0] for r in out.filter(self.results).select(META_COL).collect()]


@dataclass(frozen=True)
class TasksRun:
    """One batch's tasks job as it ran: its output, each partition's result, its timings."""

    out: DataFrame
    metas: list[PartitionMetrics]
    attempts: int
    job_ms: float
    started_at_ms: float
    """Wall clock (epoch ms) when the job's last attempt started."""
    upload_wait_ms: float
    """The driver's wait for asynchronous uploads after the job."""
    in_sink: bool = False
    """The sink's own job ran the tasks (store/spark/tasks_job.py): `job_ms` is the sink's call, and the
    output is not cached for it."""


def note_worker_sockets(spark: SparkSession) -> None:
    """Say (log, info) when the session's Python workers talk to the JVM over TCP (`WORKER_SOCKETS_CONF`)."""
    if spark.sparkContext.getConf().get(WORKER_SOCKETS_CONF, "false").strip().lower() != "true":
        log.info(
            "statekeeper: the Python workers use TCP on loopback, which stalls each task for up to 40 ms; "
            "start the session with %s=true (Spark 4.1+, Unix domain sockets)",
            WORKER_SOCKETS_CONF,
        )


@contextlib.contextmanager
def tasks_job_settings(df: DataFrame) -> Iterator[None]:
    """Plan and run the tasks job with `TASKS_JOB_SETTINGS`, the session's own restored for the user's sink.

    The batch's session is the query's own (a clone of the user's), so the settings reach no other query.
    Over Spark Connect it is the client's session: left alone there."""
    if is_connect_dataframe(df):
        yield
        return
    conf = df.sparkSession.conf
    before = {key: conf.get(key, None) for key in TASKS_JOB_SETTINGS}
    for key, value in TASKS_JOB_SETTINGS.items():
        conf.set(key, value)
    try:
        yield
    finally:
        for key, old in before.items():
            if old is None:
                conf.unset(key)
            else:
                conf.set(key, old)


__all__ = [
    "TASKS_JOB_SETTINGS",
    "WORKER_SOCKETS_CONF",
    "OutputFilters",
    "TasksPlan",
    "TasksRun",
    "note_worker_sockets",
    "sort_in_task",
    "tasks_job_settings",
]
