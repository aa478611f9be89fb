"""How long does a stateful streaming batch take: Spark's own state operators vs statekeeper?

Stateful streaming on Spark: Spark's own state operators vs statekeeper, same workload, same run.

Workload (issue 6): per key, a running count and sum; keys uniform over 100k; 50k rows per batch from
a file source reading one parquet file per trigger; 50 batches; 4 state partitions; local[2].

- Spark ``applyInPandasWithState`` with the RocksDB state store provider and changelog checkpointing
- Spark ``transformWithStateInPandas`` (RocksDB provider, changelog checkpointing)
- statekeeper, per-key ``StatefulProcessor`` (rows), sync and async checkpointing
- statekeeper, per-key ``StatefulProcessor`` with pandas input (transformWithStateInPandas semantics)
- statekeeper, vectorized ``BatchStatefulProcessor``
- Spark's native JVM streaming aggregation (RocksDB provider, changelog checkpointing)
- two floors: a stateless foreachBatch that shuffles by key into ``noop``, and statekeeper's own batch
  with a Python task that hands its input back (no state, no user code: ``run_plan_floor``)

Batch duration is Spark's own ``durationMs.triggerExecution`` of every batch of each query (for
statekeeper it includes the foreachBatch function: tasks, upload wait, commit record and the sink, which
writes the output to the ``noop`` sink like the Spark queries do). Every variant ends with the same state
(checked against the batch-computed totals for statekeeper's variants).
"""

# ruff: noqa: N802, N803 - PySpark's StatefulProcessor method names

from __future__ import annotations

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
from bench.spark_trace import trace_row, trace_table

log = logging.getLogger(__name__)

FULL = {"keys": 100_000, "rows": 50_000, "batches": 50, "partitions": 4, "baseline_batches": 50}
QUICK = {"keys": 2_000, "rows": 2_000, "batches": 4, "partitions": 4, "baseline_batches": 4}
BASELINE_BATCHES_ENV = "BENCH_SPARK_BASELINE_BATCHES"
"""Spark's own operators take 15-30 s per batch here (about 40 minutes for both): a smaller value runs only
the first batches of theirs, to save time."""
WARMUP_BATCHES = 1
"""The first batch of every query (its plan, code generation and imports) is left out of the figures."""
WARM_UP_QUERIES = ("rows", "vectorized", "native", "floor")
"""An unmeasured first round of these queries over the same input: the JVM's JIT compiles Spark's code for
minutes (its compiler threads took 200 ms of CPU per batch in the first query of a session, 70 ms in the
third), so whichever query ran first would pay for it."""
NATIVE = "Spark native aggregation (JVM, RocksDB, changelog)"
FLOOR = "floor: stateless foreachBatch shuffle by key + noop"
PLAN_FLOOR = "floor: statekeeper's batch with a Python task that hands its input back (no state) + noop"
APPLY = "Spark applyInPandasWithState (RocksDB, changelog)"
APPLY_UNCHANGED = "statekeeper ApplyInPandasWithState, the same function unchanged, sync"
SCALE_FULL = [(100_000, 500_000, 10), (1_000_000, 500_000, 10)]
"""(keys, rows per batch, batches): 10x the rows per batch, then 10x the state too."""
SCALE_QUICK = [(2_000, 20_000, 3), (20_000, 20_000, 3)]
SCALE_COLUMNS = [
    "keys",
    "rows / batch",
    "per-key rows p50",
    "vectorized p50",
    "Spark native p50",
    "floor p50",
    "rows / native",
    "vectorized / native",
    "rows p99/p50",
    "vectorized p99/p50",
]
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
    operators' best configuration), statekeeper's local files under `local_dir`."""
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


def run_plan_floor(spark: Any, inputs: Path, work: Path, timeout: float, partitions: int) -> list[float]:
    """statekeeper's batch without state or user logic: the operator's own tasks plan (key-group routing,
    a marker per partition, sorted by key), a mapInArrow whose Python function hands its input back, the
    output cached, the markers collected to the driver, the other rows to noop. What running as a Python
    task inside Spark costs before any state or user code: Arrow both ways, the Python workers, the cache."""
    from pyspark.sql import functions as sf

    from statekeeper.store.key_groups import KeyGroupLayout
    from statekeeper.store.spark.executor import MARKER_COL, PID_COL
    from statekeeper.store.spark.routing import owner_column
    from statekeeper.store.spark.schemas import DEFAULT_MAX_KEY_GROUPS
    from statekeeper.store.spark.tasks_plan import TasksPlan, tasks_job_settings

    plans: list[TasksPlan] = []

    def echo_batch(df: Any, batch_id: int) -> None:
        if not plans:
            owner = owner_column(df.schema, ("key",), KeyGroupLayout(partitions, DEFAULT_MAX_KEY_GROUPS))
            plans.append(TasksPlan.build(df.sparkSession, df.schema, ("key",), owner, partitions))
        with tasks_job_settings(df):
            planned = plans[0].input(df)
            out = planned.mapInArrow(_echo, planned.schema).cache()
            if len(out.filter(sf.col(MARKER_COL)).select(PID_COL).collect()) != partitions:
                raise RuntimeError(f"{PLAN_FLOOR}: a partition's marker went missing")
        try:
            out.filter(~sf.col(MARKER_COL)).drop(MARKER_COL).write.format("noop").mode("overwrite").save()
        finally:
            out.unpersist()

    return _run(_start_foreach_batch(spark, inputs, work, echo_batch), PLAN_FLOOR, timeout)


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
) -> tuple[list[float], dict[str, float], list[Any]]:
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
    return durations, phases, trace_row(name, measured, durations, jobs_per_batch)


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


def _scale_row(keys: int, rows: int, batches: int, results: dict[str, list[float]]) -> list[Any]:
    p50 = {k: _pct(v, 50) for k, v in results.items()}
    r, v = results["statekeeper per-key rows, sync"], results["statekeeper vectorized, sync"]
    return [
        keys,
        rows,
        round(p50["statekeeper per-key rows, sync"]),
        round(p50["statekeeper vectorized, sync"]),
        round(p50[NATIVE]),
        round(p50[FLOOR]),
        round(_pct(r, 50) / p50[NATIVE], 2),
        round(_pct(v, 50) / p50[NATIVE], 2),
        round(_pct(r, 99) / _pct(r, 50), 2),
        round(_pct(v, 99) / _pct(v, 50), 2),
    ]


def _run_scale(
    spark: Any, work: Path, keys: int, rows: int, batches: int, partitions: int, timeout: float
) -> list[Any]:
    """Per-key rows, vectorized, Spark native and the floor on a bigger workload."""
    base = work / f"scale-{keys}-{rows}"
    inputs = base / "inputs"
    expected = write_inputs(inputs, batches, rows, keys, seed=keys + rows)
    results: dict[str, list[float]] = {}
    for name, api in (("statekeeper per-key rows, sync", "rows"), ("statekeeper vectorized, sync", "vectorized")):
        results[name] = run_statekeeper(
            spark,
            inputs,
            base / api,
            timeout,
            api=api,
            async_checkpoint=False,
            partitions=partitions,
            expected=expected,
        )[0]
    results[NATIVE] = run_spark_native(spark, inputs, base / "native", timeout)
    results[FLOOR] = run_floor(spark, inputs, base / "floor", timeout, partitions)
    shutil.rmtree(base, ignore_errors=True)
    return _scale_row(keys, rows, batches, results)


def _targets(results: dict[str, list[float]]) -> str:
    """The issue's targets, each with its measured figure and met / NOT met."""
    p50 = {k: _pct(v, 50) for k, v in results.items()}
    checks = [
        ("per-key rows p50 <= 1.0x Spark native", p50["statekeeper per-key rows, sync"] / p50[NATIVE], 1.0),
        ("vectorized p50 <= 0.8x Spark native", p50["statekeeper vectorized, sync"] / p50[NATIVE], 0.8),
    ]
    parts = [f"{what} ({got:.2f}x: {'met' if got <= limit else 'NOT met'})" for what, got, limit in checks]
    tails = [_pct(v, 99) / p50[k] for k, v in results.items() if k.startswith("statekeeper")]
    parts.append(
        f"p99 <= 1.5x p50 for every statekeeper query (worst {max(tails):.2f}x: "
        f"{'met' if max(tails) <= 1.5 else 'NOT met'})"
    )
    rows_speedup = p50[APPLY] / p50["statekeeper per-key rows, sync"]
    pandas_speedup = p50[APPLY] / p50["statekeeper per-key pandas, sync"]
    parts.append(
        f">= 25x applyInPandasWithState, per-key rows ({rows_speedup:.1f}x: "
        f"{'met' if rows_speedup >= 25 else 'NOT met'})"
    )
    parts.append(
        f">= 10x applyInPandasWithState, per-key pandas ({pandas_speedup:.1f}x: "
        f"{'met' if pandas_speedup >= 10 else 'NOT met'})"
    )
    return "Targets: " + "; ".join(parts) + "."


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def run(quick: bool) -> list[Table]:
    size = QUICK if quick else FULL
    load_start = os.getloadavg()[0]
    baseline_batches = min(size["batches"], int(os.environ.get(BASELINE_BATCHES_ENV, size["baseline_batches"])))
    work = Path(tempfile.mkdtemp(prefix="statekeeper-bench-spark-"))
    try:
        inputs = work / "inputs"
        expected = write_inputs(inputs, size["batches"], size["rows"], size["keys"])
        base_inputs = inputs
        if baseline_batches < size["batches"]:
            base_inputs = work / "inputs-baseline"
            base_inputs.mkdir()
            for f in sorted(inputs.iterdir())[:baseline_batches]:
                shutil.copy2(f, base_inputs / f.name)
        spark = bench_session(work / "local")
        timeout = 7200.0
        _warm_up_jvm(spark, inputs, work / "warm-up", timeout, size["partitions"], expected)
        rows: list[list[Any]] = []
        notes: list[str] = []
        results: dict[str, list[float]] = {}
        variants: list[tuple[str, Any]] = [
            ("statekeeper per-key rows, sync", dict(api="rows", async_checkpoint=False)),
            ("statekeeper per-key rows, async", dict(api="rows", async_checkpoint=True)),
            ("statekeeper vectorized, sync", dict(api="vectorized", async_checkpoint=False)),
            ("statekeeper per-key pandas, sync", dict(api="pandas", async_checkpoint=False)),
            (APPLY_UNCHANGED, dict(api="apply", async_checkpoint=False)),
        ]
        phases: dict[str, dict[str, float]] = {}
        traces: list[list[Any]] = []
        for name, kw in variants:
            results[name], phases[name], trace = run_statekeeper(
                spark,
                inputs,
                work / name.replace(" ", "_").replace(",", ""),
                timeout,
                partitions=size["partitions"],
                expected=expected,
                **kw,
            )
            traces.append([name, *trace[1:]])
        results[NATIVE] = run_spark_native(spark, inputs, work / "spark-native", timeout)
        results[FLOOR] = run_floor(spark, inputs, work / "floor", timeout, size["partitions"])
        results[PLAN_FLOOR] = run_plan_floor(spark, inputs, work / "plan-floor", timeout, size["partitions"])
        results[APPLY] = run_spark_apply_in_pandas(spark, base_inputs, work / "spark-apply", timeout)
        results["Spark transformWithStateInPandas (RocksDB, changelog)"] = run_spark_tws_in_pandas(
            spark, base_inputs, work / "spark-tws", timeout
        )
        scale = [_scale_row(size["keys"], size["rows"], size["batches"], results)]
        for keys, rows_per_batch, batches in SCALE_QUICK if quick else SCALE_FULL:
            scale.append(_run_scale(spark, work, keys, rows_per_batch, batches, size["partitions"], timeout))
        spark.stop()
        native_p50, floor_p50, ref_p50 = (_pct(results[k], 50) for k in (NATIVE, FLOOR, APPLY))
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
        notes.append(_targets(results))
        plan_floor_p50 = _pct(results[PLAN_FLOOR], 50)
        notes.append(
            f"The Python-task floor is {plan_floor_p50 / native_p50:.2f}x Spark native: what statekeeper's batch pays "
            "before any state or user logic (routing by key group, a marker per partition, the sort, Arrow both ways, "
            "the Python workers, the cached output and the sink's second job). Above it, per batch: per-key rows "
            f"+{_pct(results['statekeeper per-key rows, sync'], 50) - plan_floor_p50:.0f} ms, vectorized "
            f"+{_pct(results['statekeeper vectorized, sync'], 50) - plan_floor_p50:.0f} ms (state and user logic)."
        )
        notes.append(
            f"{size['keys']:,} keys, {size['rows']:,} rows per batch, {size['batches']} batches, "
            f"{size['partitions']} state partitions, local[2], parquet file source (1 file per trigger)."
        )
        if baseline_batches < size["batches"]:
            notes.append(
                f"Spark's own operators ran the first {baseline_batches} of the {size['batches']} batches "
                f"(time budget; {BASELINE_BATCHES_ENV}={size['batches']} runs them all)."
            )
        notes.append(
            "Batch duration = Spark's durationMs.triggerExecution of each batch after the first (warm-up); "
            "before all of them an unmeasured round of the per-key rows, vectorized, Spark native and floor queries "
            "over the same batches warms up the JVM (its JIT compiles for minutes; the first query would pay). "
            "speedup = applyInPandasWithState p50 / p50."
        )
        notes.append(load_note(load_start))
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
        prow = []
        for name, ph in phases.items():
            prow.append(
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
            )
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
        where = trace_table(traces)
        if FLOOR_JOBS:
            where.notes.append(
                f"The floor ran {FLOOR_JOBS[0]:.1f} Spark jobs per batch (its shuffle's map stage and the noop write). "
                "statekeeper's figure counts every batch's jobs, the first batch's one-off ones too; "
                "a batch needs at least the tasks job and, after the commit record, the sink's read of the persisted "
                "task output.",
            )
        tables.append(where)
        tables.append(
            Table(
                "How p50 grows with rows per batch and with state size (ms)",
                SCALE_COLUMNS,
                scale,
                [
                    "Each row: its own input (uniform keys), queries run one after another in the same session; "
                    f"the first row is the table above, the others run {', '.join(str(b) for *_, b in SCALE_FULL)} "
                    "batches (the first of each query is warm-up) and check the final state like the table above.",
                    "per-key rows and vectorized: sync checkpointing. Ratios: p50 / Spark native aggregation p50.",
                ],
            )
        )
        return tables
    finally:
        shutil.rmtree(work, ignore_errors=True)
