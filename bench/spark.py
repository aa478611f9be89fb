"""How long does a stateful streaming batch take: Spark's own state operators vs statekeeper?

Stateful streaming on Spark: Spark's own state operators vs statekeeper, same workload, same run.

Workload (issues 6, 65): per key, a running count and sum; uniform keys; a file source reading one parquet
file per trigger; 4 state partitions; local[2]. The main table: 100k keys, 50k rows a batch; the size table
(bench/spark_scale.py) adds 500k rows at 100k keys, 500k and 2M rows at 1M keys, every variant at each.

- Spark ``applyInPandasWithState`` with the RocksDB state store provider and changelog checkpointing
- Spark ``transformWithStateInPandas`` (RocksDB provider, changelog checkpointing)
- statekeeper, per-key ``StatefulProcessor`` (rows), sync (and async, main table) checkpointing
- statekeeper, per-key ``StatefulProcessor`` with pandas input (transformWithStateInPandas semantics)
- statekeeper, ``ApplyInPandasWithState`` running Spark's function unchanged
- statekeeper, vectorized ``BatchStatefulProcessor``
- Spark's native JVM streaming aggregation (RocksDB provider, changelog checkpointing)
- four floors: a stateless foreachBatch that shuffles by key into ``noop``; Spark's own Python task (shuffled
  by key, a ``mapInArrow`` that hands its input back: ``run_python_floor``, what no change of ours moves);
  statekeeper's own batch with a Python task that takes its input as a task does and hands it back (no state,
  no user code:
  ``run_plan_floor``); the pandas floor, the same user function on the same per-key frames in a plain Python
  loop (no Spark, no state)

Batch duration is Spark's own ``durationMs.triggerExecution`` of every batch of each query (for
statekeeper it includes the foreachBatch function: tasks, upload wait, commit record and the sink, which
writes the output to the ``noop`` sink like the Spark queries do). Every variant ends with the same state
(checked against the batch-computed totals for statekeeper's variants).

Knobs (environment; bench/spark_scale.py says more): BENCH_SPARK_BATCHES (main size, default 30),
BENCH_SPARK_SIZE_BATCHES (the other sizes, default 8, 8, 6), BENCH_SPARK_PANDAS_BATCHES (the per-key pandas
paths and the pandas floor, default 3), BENCH_SPARK_BASELINE_BATCHES (Spark's Python operators, default 3),
BENCH_SPARK_SLOW_BATCH_MAX_S (skip a slow variant whose batch would take longer, default 120). The first batch
of every query is warm-up.
"""

# ruff: noqa: N802, N803 - PySpark's StatefulProcessor method names

from __future__ import annotations

import functools
import importlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.report import Table, load_note
from bench.spark_scale import (
    APPLY,
    FLOOR,
    NATIVE,
    PLAN_FLOOR,
    ROWS,
    SPARK_PYTHON_FLOOR,
    VECTORIZED,
    SizeResult,
    rounds_note,
    run_sizes,
    size_tables,
    sizes,
)
from bench.spark_trace import trace_row, trace_table
from statekeeper.store.spark.tasks_plan import WORKER_SOCKETS_CONF

log = logging.getLogger(__name__)

PARTITIONS = 4
WARMUP_BATCHES = 1
"""The first batch of every query (its plan, code generation and imports) is left out of the figures."""
WARM_UP_QUERIES = ("rows", "vectorized", "native", "floor")
"""An unmeasured first round of these queries over the first size's input: the JVM's JIT compiles Spark's code
for minutes (its compiler threads took 200 ms of CPU per batch in the first query of a session, 70 ms in the
third), so whichever query ran first would pay for it."""
OUTPUT = "key string, count long, total long"
STATE = "count long, total long"


# -- inputs ---------------------------------------------------------------------------------------
def write_inputs(directory: Path, batches: int, rows: int, keys: int, seed: int = 42) -> dict[str, tuple[int, int]]:
    """One parquet file per batch; returns the expected final (count, total) per key."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    counts = np.zeros(keys, dtype=np.int64)
    totals = np.zeros(keys, dtype=np.int64)
    names = np.array([f"k{i:06d}" for i in range(keys)], dtype=object)
    for b in range(batches):
        k = rng.integers(0, keys, rows)
        v = rng.integers(0, 1000, rows)
        np.add.at(counts, k, 1)
        np.add.at(totals, k, v)
        path = directory / f"batch-{b:05d}.parquet"
        pq.write_table(pa.table({"key": pa.array(names[k], pa.string()), "value": pa.array(v, pa.int64())}), path)
        os.utime(path, (1_700_000_000 + b, 1_700_000_000 + b))  # the file source goes by mtime
    return {str(names[i]): (int(counts[i]), int(totals[i])) for i in np.nonzero(counts)[0]}


# -- the processors (module level, so Spark's workers import them) --------------------------------
def apply_in_pandas_with_state_func(key: tuple[Any, ...], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
    pd = importlib.import_module("pandas")

    count, total = state.get if state.exists else (0, 0)
    for pdf in pdfs:
        count += len(pdf)
        total += int(pdf["value"].sum())
    state.update((count, total))
    yield pd.DataFrame({"key": [key[0]], "count": [count], "total": [total]})


def _spark_tws_processor() -> Any:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor as SparkProcessor

    class SparkCountSum(SparkProcessor):
        def init(self, handle: Any) -> None:
            self.state = handle.getValueState("totals", STATE)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            pd = importlib.import_module("pandas")

            count, total = self.state.get() if self.state.exists() else (0, 0)
            for pdf in rows:
                count += len(pdf)
                total += int(pdf["value"].sum())
            self.state.update((count, total))
            yield pd.DataFrame({"key": [key[0]], "count": [count], "total": [total]})

        def close(self) -> None:
            pass

    return SparkCountSum()


def _statekeeper_processors() -> dict[str, Any]:
    from statekeeper.store.spark import ApplyInPandasWithState
    from testkit.processors import CountSum, CountSumPandas, CountSumVectorized

    return {
        "rows": CountSum(),
        "pandas": CountSumPandas(key="key", schema=STATE),
        "vectorized": CountSumVectorized(key="key", schema=STATE),
        "apply": ApplyInPandasWithState(apply_in_pandas_with_state_func),
    }


# -- running --------------------------------------------------------------------------------------
def bench_session(local_dir: Path) -> Any:
    """The benchmarks' session: local[2], Spark's RocksDB state store with changelog checkpointing (its own
    operators' best configuration), its Python workers on Unix domain sockets (`WORKER_SOCKETS_CONF`: every Python
    operator's and floor's best), statekeeper's local files under `local_dir`."""
    from testkit.spark import spark_env

    os.environ.update(spark_env())  # the Python workers: this interpreter, and the repository on their path
    os.environ["STATEKEEPER_SPARK_LOCAL_DIR"] = str(local_dir)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("statekeeper-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "3g")
        .config("spark.sql.shuffle.partitions", "4")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.sql.streaming.numRecentProgressUpdates", "1000")
        .config(WORKER_SOCKETS_CONF, "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _run(query: Any, name: str, timeout: float) -> list[float]:
    return _run_counting(query, name, timeout)[0]


def _run_counting(query: Any, name: str, timeout: float) -> tuple[list[float], float]:
    """The steady batches' trigger durations, and the Spark jobs the query ran per batch."""
    t0 = time.time()
    try:
        if not query.awaitTermination(int(timeout)):
            raise RuntimeError(f"{name}: did not finish within {timeout}s")
        if query.exception() is not None:
            raise RuntimeError(f"{name}: {query.exception()}")
    finally:
        query.stop()
    durations = [float(p["durationMs"]["triggerExecution"]) for p in query.recentProgress if p["numInputRows"] > 0]
    log.info("%s: %d batches in %.1fs: %s", name, len(durations), time.time() - t0, [round(d) for d in durations])
    from pyspark.sql import SparkSession

    tracker = SparkSession.builder.getOrCreate().sparkContext.statusTracker()
    jobs = tracker.getJobIdsForGroup(str(query.runId))
    return durations[WARMUP_BATCHES:], len(jobs) / max(1, len(durations))


def _stream(spark: Any, inputs: Path) -> Any:
    return spark.readStream.schema("key string, value long").option("maxFilesPerTrigger", 1).parquet(str(inputs))


def _run_to_noop(df: Any, work: Path, name: str, timeout: float) -> list[float]:
    """Run a Spark stateful query over every input file into the noop sink; its batch durations."""
    q = (
        df.writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(work / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    return _run(q, name, timeout)


def run_spark_apply_in_pandas(spark: Any, inputs: Path, work: Path, timeout: float) -> list[float]:
    from pyspark.sql.streaming.state import GroupStateTimeout

    df = (
        _stream(spark, inputs)
        .groupBy("key")
        .applyInPandasWithState(apply_in_pandas_with_state_func, OUTPUT, STATE, "Update", GroupStateTimeout.NoTimeout)
    )
    return _run_to_noop(df, work, "applyInPandasWithState", timeout)


def run_spark_tws_in_pandas(spark: Any, inputs: Path, work: Path, timeout: float) -> list[float]:
    df = (
        _stream(spark, inputs)
        .groupBy("key")
        .transformWithStateInPandas(
            _spark_tws_processor(), outputStructType=OUTPUT, outputMode="Update", timeMode="None"
        )
    )
    return _run_to_noop(df, work, "transformWithStateInPandas", timeout)


def run_spark_native(spark: Any, inputs: Path, work: Path, timeout: float) -> list[float]:
    """Spark's own JVM streaming aggregation (count, sum per key) on the RocksDB provider."""
    from pyspark.sql import functions as sf

    df = _stream(spark, inputs).groupBy("key").agg(sf.count("*").alias("count"), sf.sum("value").alias("total"))
    return _run_to_noop(df, work, "Spark native aggregation", timeout)


FLOOR_JOBS: list[float] = []
"""Spark jobs per batch of each floor run (the statekeeper queries' own are in the trace table)."""


def _start_foreach_batch(spark: Any, inputs: Path, work: Path, function: Any) -> Any:
    """A query running `function` on each batch of the input files (one per trigger) until they are read."""
    writer = _stream(spark, inputs).writeStream.foreachBatch(function)
    return writer.option("checkpointLocation", str(work / "ckpt")).trigger(availableNow=True).start()


def run_floor(spark: Any, inputs: Path, work: Path, timeout: float, partitions: int) -> list[float]:
    """The floor: a stateless foreachBatch that only shuffles the batch by key and writes it to noop."""

    def shuffle_to_noop(df: Any, batch_id: int) -> None:
        df.repartition(partitions, "key").write.format("noop").mode("overwrite").save()

    q = _start_foreach_batch(spark, inputs, work, shuffle_to_noop)
    durations, jobs = _run_counting(q, "floor: foreachBatch shuffle + noop", timeout)
    FLOOR_JOBS.append(jobs)
    return durations


def _echo(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield from batches


def run_python_floor(spark: Any, inputs: Path, work: Path, timeout: float, partitions: int) -> list[float]:
    """Spark's own cost of a keyed Python task, which no change of statekeeper's moves: the batch shuffled by
    key (Spark's hash), a mapInArrow whose function hands its input back, written to noop. One job; no routing
    by key group, no markers, no sort, no results reported."""

    def python_echo(df: Any, batch_id: int) -> None:
        df.repartition(partitions, "key").mapInArrow(_echo, df.schema).write.format("noop").mode("overwrite").save()

    return _run(_start_foreach_batch(spark, inputs, work, python_echo), SPARK_PYTHON_FLOOR, timeout)


def run_plan_floor(spark: Any, inputs: Path, work: Path, timeout: float, partitions: int) -> list[float]:
    """statekeeper's batch without state or user logic: the operator's own tasks plan (key-group routing,
    a marker per partition), a mapInArrow whose Python function takes its input as a task does (sorted by key
    in the task, cut into chunks of whole keys), hands it back and reports its end through an accumulator, to
    noop (the sink's job running the tasks). What running as a Python task inside Spark costs before any state
    or user code: Arrow both ways, the workers, the sort."""
    from statekeeper.store.key_groups import KeyGroupLayout
    from statekeeper.store.spark.schemas import DEFAULT_MAX_KEY_GROUPS
    from statekeeper.store.spark.task_input import BATCH_INPUT_BUDGET_BYTES, TaskInput
    from statekeeper.store.spark.tasks_plan import TasksPlan, sort_in_task

    plans: list[TasksPlan] = []
    layout = KeyGroupLayout(partitions, DEFAULT_MAX_KEY_GROUPS)

    def echo_batch(df: Any, batch_id: int) -> None:
        if not plans:
            plans.append(TasksPlan.build(df.sparkSession, df.schema, ("key",), partitions, layout))
        ended = df.sparkSession.sparkContext.accumulator(0)
        sort = sort_in_task(df.schema, ("key",))

        def echo_and_report(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            task_input = TaskInput(batches, ("key",), BATCH_INPUT_BUDGET_BYTES, sort=sort, layout=layout)
            for chunk in task_input.chunks():
                yield from chunk.to_batches()
            ended.add(1)

        plans[0].input(df).mapInArrow(echo_and_report, df.schema).write.format("noop").mode("overwrite").save()
        if ended.value != partitions:
            raise RuntimeError(f"{PLAN_FLOOR}: {ended.value} of {partitions} tasks reported their end")

    return _run(_start_foreach_batch(spark, inputs, work, echo_batch), PLAN_FLOOR, timeout)


def run_task_floor(
    spark: Any, inputs: Path, work: Path, timeout: float, partitions: int, kind: str, *, routed: bool = False
) -> list[float]:
    """Spark's own Python task floor whose task does a RocksDB floor's work (`bench.spark_floors.in_task`, `kind`
    of its `WORK`): what a Python stateful operator on RocksDB in Spark cannot do with less. `routed`: the batch
    routed by key group by statekeeper's tasks plan, the task taking it as statekeeper's does and syncing its writes
    (what a rescalable, durable one cannot do with less). Its last batch's tasks close the workers' DBs, so that the
    queries after it start from the workers they would have had."""
    from bench.spark_floors import Pids, in_task
    from statekeeper.store.key_groups import KeyGroupLayout
    from statekeeper.store.spark.schemas import DEFAULT_MAX_KEY_GROUPS
    from statekeeper.store.spark.tasks_plan import TasksPlan

    name, last = f"floor in a Python task: {kind}{', routed' if routed else ''}", len(list(inputs.iterdir())) - 1
    opened, closed = (spark.sparkContext.accumulator(set(), Pids()) for _ in range(2))
    layout = KeyGroupLayout(partitions, DEFAULT_MAX_KEY_GROUPS) if routed else None
    plans: list[TasksPlan] = []

    def state_floor(df: Any, batch_id: int) -> None:
        task = functools.partial(in_task, kind, str(work / "db"), batch_id == last, opened, closed, layout=layout)
        if layout is None:
            planned = df.repartition(partitions, "key")
        else:
            if not plans:
                plans.append(TasksPlan.build(df.sparkSession, df.schema, ("key",), partitions, layout))
            planned = plans[0].input(df)
        planned.mapInArrow(task, OUTPUT).write.format("noop").mode("overwrite").save()

    durations = _run(_start_foreach_batch(spark, inputs, work, state_floor), name, timeout)
    if opened.value - closed.value:
        log.warning("%s: Python workers %s still hold its DBs", name, sorted(opened.value - closed.value))
    return durations


def _noop_sink(df: Any, batch_id: int) -> None:
    df.write.format("noop").mode("overwrite").save()


def run_statekeeper(
    spark: Any,
    inputs: Path,
    work: Path,
    timeout: float,
    *,
    api: str,
    async_checkpoint: bool,
    partitions: int,
    expected: dict[str, tuple[int, int]],
) -> tuple[list[float], dict[str, float], list[Any], list[Any]]:
    """The query's steady batch durations, its phases' medians, its trace row and its steady BatchProgress."""
    from statekeeper.store.spark import StatefulOperator, read_state

    processor = _statekeeper_processors()[api]
    root = (work / "state").as_uri()
    op = StatefulOperator(
        root,
        "counts",
        "key",
        processor,
        OUTPUT,
        num_partitions=partitions,
        input_format="pandas" if api in ("pandas", "apply") else "rows",
        async_checkpoint=async_checkpoint,
        sink=_noop_sink,
    )
    name = f"statekeeper {api} {'async' if async_checkpoint else 'sync'}"
    durations, jobs_per_batch = _run_counting(
        op.start(_stream(spark, inputs), str(work / "ckpt"), trigger={"availableNow": True}), name, timeout
    )
    got = {json.loads(r["key"])[0]: r["value"] for r in read_state(spark, root, "counts").collect()}
    if len(got) != len(expected) or any(tuple(json.loads(got[k])) != v for k, v in expected.items()):
        raise RuntimeError(f"{name}: the final state differs from the batch-computed totals")
    progress = list(op.recent_progress)
    steady = progress[len(progress) // 5 :] or progress
    phases = {
        "process_ms": float(np.median([p.process_ms for p in steady])),
        "load_ms": float(np.median([p.load_ms for p in steady])),
        "commit_ms": float(np.median([p.commit_ms for p in steady])),
        "upload_ms": float(np.median([p.upload_ms for p in steady])),
        "job_ms": float(np.median([p.job_ms for p in steady])),
        "sink_ms": float(np.median([p.sink_ms for p in steady])),
        "changelog_bytes": float(np.median([p.changelog_bytes for p in steady])),
        "warm": float(sum(p.stores_reused for p in progress)) / max(1, sum(p.num_partitions for p in progress)),
    }
    measured = progress[WARMUP_BATCHES:] or progress
    return durations, phases, trace_row(name, measured, durations, jobs_per_batch), measured


def _warm_up_jvm(
    spark: Any, inputs: Path, work: Path, timeout: float, partitions: int, expected: dict[str, tuple[int, int]]
) -> None:
    """Run each of `WARM_UP_QUERIES` once over `inputs`, unmeasured (see WARM_UP_QUERIES)."""
    for name in WARM_UP_QUERIES:
        where = work / name
        if name == "native":
            run_spark_native(spark, inputs, where, timeout)
        elif name == "floor":
            run_floor(spark, inputs, where, timeout, partitions)
        else:
            kw: dict[str, Any] = dict(api=name, async_checkpoint=False, partitions=partitions, expected=expected)
            run_statekeeper(spark, inputs, where, timeout, **kw)
    FLOOR_JOBS.clear()


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def run(quick: bool) -> list[Table]:
    all_sizes = sizes(quick)
    keys, rows_per_batch, batches = all_sizes[0]
    load_start = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="statekeeper-bench-spark-"))
    try:
        inputs = work / "inputs"
        expected = write_inputs(inputs, batches, rows_per_batch, keys)
        spark = bench_session(work / "local")
        timeout = 7200.0
        _warm_up_jvm(spark, inputs, work / "warm-up", timeout, PARTITIONS, expected)
        measured = run_sizes(spark, work, (inputs, expected), all_sizes, PARTITIONS, timeout)
        spark.stop()
        return [*_main_tables(measured[0], load_start), *size_tables(measured)]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _main_tables(main: SizeResult, load_start: float) -> list[Table]:
    """The first size in detail: every variant's batch durations, statekeeper's phases and trace."""
    results = main.results
    native_p50, floor_p50, ref_p50 = (_pct(results.get(k, []), 50) for k in (NATIVE, FLOOR, APPLY))
    rows: list[list[Any]] = []
    for name, d in results.items():
        p50, p99 = _pct(d, 50), _pct(d, 99)
        rows.append(
            [
                name,
                len(d),
                round(p50),
                round(p99),
                round(p99 / p50, 2),
                round(p50 / native_p50, 2),
                round(p50 / floor_p50, 2),
                round(ref_p50 / p50, 1),
            ]
        )
    plan_floor_p50 = _pct(results[PLAN_FLOOR], 50)
    notes = [
        "Targets: in the size table below (every size).",
        f"The Python-task floor is {plan_floor_p50 / native_p50:.2f}x Spark native: what statekeeper's batch pays "
        "before any state or user logic (routing by key group, a marker per partition, the sort by key in the task, "
        "Arrow both ways, "
        "the Python workers, the sink's job running the tasks). Above it, per batch: per-key rows "
        f"+{_pct(results[ROWS], 50) - plan_floor_p50:.0f} ms, vectorized "
        f"+{_pct(results[VECTORIZED], 50) - plan_floor_p50:.0f} ms (state and user logic). Spark's own Python "
        f"task floor (the same shuffle by key, Arrow both ways, no sort, no statekeeper code) is "
        f"{_pct(results[SPARK_PYTHON_FLOOR], 50) / native_p50:.2f}x Spark native: no Python stateful operator in "
        "Spark can take less.",
        f"{main.keys:,} keys, {main.rows:,} rows per batch, {main.batches} batches, {PARTITIONS} state partitions, "
        f"local[2] ({WORKER_SOCKETS_CONF}=true for every query: Spark's Python workers on Unix domain sockets, "
        "not TCP on loopback, whose delayed acknowledgements stall each Python task's input and end for up to 40 ms; "
        "Spark native runs no Python), parquet file source (1 file per trigger). The per-key pandas paths, the "
        "pandas floor and Spark's Python operators ran the first batches only (see the size table's notes).",
        "Batch duration = Spark's durationMs.triggerExecution of each batch after the first (warm-up; the pandas "
        "floor: each batch's loop, the first left out too); before all of them an unmeasured round of the per-key "
        "rows, vectorized, Spark native and floor queries over the same batches warms up the JVM (its JIT compiles "
        "for minutes; the first query would pay). speedup = applyInPandasWithState p50 / p50.",
        rounds_note(main.rounds),
        *main.notes,
        load_note(load_start),
    ]
    tables = [
        Table(
            "Stateful streaming batch duration (ms): Spark state operators vs statekeeper",
            [
                "query",
                "batches",
                "p50 ms",
                "p99 ms",
                "p99/p50",
                "p50 / Spark native",
                "p50 / floor",
                "speedup vs applyInPandasWithState",
            ],
            rows,
            notes,
        )
    ]
    prow = [
        [
            name,
            round(ph["job_ms"]),
            round(ph["process_ms"]),
            round(ph["load_ms"], 1),
            round(ph["commit_ms"], 1),
            round(ph["upload_ms"], 1),
            round(ph["sink_ms"]),
            int(ph["changelog_bytes"]),
            f"{ph['warm']:.0%}",
        ]
        for name, ph in main.phases.items()
    ]
    tables.append(
        Table(
            "statekeeper per-batch phases (median over the last 80% of batches)",
            [
                "query",
                "tasks job ms",
                "slowest partition process ms",
                "load ms",
                "local commit ms",
                "upload ms",
                "sink ms",
                "changelog bytes",
                "loads warm",
            ],
            prow,
            [
                "upload ms: sync = slowest task's upload inside its task; async = the driver's wait for the "
                "uploads after the tasks finished.",
                "loads warm: share of partition loads that reused a worker's open RocksDB (possibly catching up "
                "a few changelogs), the rest rebuilt from the checkpoint.",
            ],
        )
    )
    where = trace_table(list(main.traces.values()))
    if FLOOR_JOBS:
        where.notes.append(
            f"The floor ran {FLOOR_JOBS[0]:.1f} Spark jobs per batch (its shuffle's map stage and the noop write). "
            "statekeeper's figure counts every batch's jobs, the first batch's one-off ones too; "
            "a batch needs at least the sink's own job, which runs the tasks (with adaptive execution on, "
            "its shuffle's map stage is a job of its own).",
        )
    tables.append(where)
    return tables
