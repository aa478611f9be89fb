"""How long does moving a Spark job's state over take: importing it vs Spark's own offline rewrite of it?

Import benchmark (issue 64): the state of a streaming ``groupBy(key).agg(count, sum)`` on Spark's RocksDB
state store provider (changelog checkpointing), ``keys`` distinct keys committed in one batch on 4 shuffle
partitions, imported into a statekeeper operator by ``import_spark_state`` (one Spark job: Spark's state
data source reads it, each task writes its partition's store, one commit record), beside
``spark._streamingCheckpointManager.repartition`` (Spark 4.2+, experimental), which reads and rewrites the
same state (4 -> 8 partitions) offline.

Memory: the driver's Python peak RSS over the import, the largest peak RSS of a Python worker that wrote a
partition (from the tasks' traces), and the JVM's peak RSS sampled during the import (local mode: the
driver and the executors in one JVM).

Run ``python -m bench spark_import`` (10M keys; ``BENCH_IMPORT_KEYS=1000000`` for another size, comma
separated for several; ``--quick`` for a smoke run with 50k).
"""

from __future__ import annotations

import logging
import os
import resource
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from bench.report import Table

log = logging.getLogger(__name__)

KEYS_ENV = "BENCH_IMPORT_KEYS"
PARTITIONS = 4


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _rss_mb(pid: int, field: str = "VmRSS") -> float:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class _PeakRss:
    """The peak RSS of process `pid` while the block runs, sampled every `interval` seconds."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid, self.interval, self.peak = pid, interval, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_mb(self.pid))
            self._stop.wait(self.interval)

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def spark_state(spark: Any, work: Path, keys: int) -> Path:
    """Spark's RocksDB state of `keys` keys of a count / sum aggregation (one committed batch)."""
    inputs = work / f"in-{keys}"
    inputs.mkdir(parents=True)
    step = 2_000_000
    for n, lo in enumerate(range(0, keys, step)):
        hi = min(keys, lo + step)
        pq.write_table(
            pa.table({"key": [f"k{i}" for i in range(lo, hi)], "value": pa.array(range(lo, hi), pa.int64())}),
            inputs / f"part-{n:05d}.parquet",
        )
    ckpt = work / f"spark-{keys}"
    spark.conf.set("spark.sql.shuffle.partitions", str(PARTITIONS))
    df = spark.readStream.schema("key string, value long").parquet(str(inputs))
    agg = df.groupBy("key").agg({"value": "sum", "*": "count"})
    q = agg.writeStream.format("noop").outputMode("update").option("checkpointLocation", str(ckpt))
    query = q.trigger(availableNow=True).start()
    query.awaitTermination()
    shutil.rmtree(inputs, ignore_errors=True)
    return ckpt


def statekeeper_import(spark: Any, work: Path, ckpt: Path, keys: int) -> dict[str, Any]:
    from statekeeper.store.spark.spark_import import import_spark_state

    root = work / f"sk-{keys}"
    jvm_pid = int(spark._jvm.ProcessHandle.current().pid())
    with _PeakRss(jvm_pid) as jvm, _PeakRss(os.getpid()) as driver:
        t0 = time.perf_counter()
        summary = import_spark_state(spark, str(ckpt), root.as_uri(), "agg", num_partitions=PARTITIONS)
        seconds = time.perf_counter() - t0
    if summary.keys != keys:
        raise RuntimeError(f"imported {summary.keys} keys, expected {keys}")
    written = _du(root)
    shutil.rmtree(root, ignore_errors=True)
    return {
        "seconds": seconds,
        "keys": summary.keys,
        "bytes": summary.bytes,
        "written": written,
        "driver_mb": driver.peak,
        "driver_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "worker_mb": summary.worker_peak_rss_mb,
        "jvm_mb": jvm.peak,
    }


def spark_repartition(spark: Any, work: Path, ckpt: Path) -> dict[str, Any] | None:
    """Spark's offline repartition of a copy of the same state (4 -> 8 partitions): its read and rewrite."""
    manager = getattr(spark, "_streamingCheckpointManager", None)
    if manager is None:
        log.warning("this PySpark has no spark._streamingCheckpointManager.repartition (Spark < 4.2)")
        return None
    copy = work / "spark-copy"
    shutil.copytree(ckpt, copy)
    before = _du(copy)
    try:
        t0 = time.perf_counter()
        manager.repartition(str(copy), PARTITIONS * 2)
        seconds = time.perf_counter() - t0
    except Exception as e:  # an experimental API: report, go on
        log.warning("Spark's offline repartition failed: %s", e)
        return None
    finally:
        written = _du(copy) - before
        shutil.rmtree(copy, ignore_errors=True)
    return {"seconds": seconds, "read": before, "written": written}


def run(quick: bool) -> list[Table]:
    from bench.spark import bench_session

    sizes = [50_000] if quick else [int(k) for k in os.environ.get(KEYS_ENV, "10000000").split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench-import-"))
    spark = bench_session(work / "spark-local")
    rows: list[list[Any]] = []
    try:
        warm = spark_state(spark, work / "warm", 1_000)  # not timed: Python workers started, modules imported
        statekeeper_import(spark, work / "warm", warm, 1_000)
        for keys in sizes:
            ckpt = spark_state(spark, work, keys)
            sk = statekeeper_import(spark, work, ckpt, keys)
            sp = spark_repartition(spark, work, ckpt)
            shutil.rmtree(ckpt, ignore_errors=True)
            rows.append(
                [
                    f"{keys:,}",
                    round(sk["seconds"], 2),
                    round(keys / sk["seconds"]),
                    round(sp["seconds"], 2) if sp else "failed",
                    round(sk["seconds"] / sp["seconds"], 2) if sp else "-",
                    round(sk["driver_mb"]),
                    round(sk["worker_mb"]),
                    round(sk["jvm_mb"]),
                    f"{sk['bytes'] / 1e6:.1f}",
                    f"{sp['read'] / 1e6:.1f} / {sp['written'] / 1e6:.1f}" if sp else "-",
                ]
            )
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    return [
        Table(
            "Import: a Spark aggregation's state into statekeeper, beside Spark's offline repartition of it",
            [
                "keys",
                "import s",
                "keys/s",
                "Spark repartition s (4->8)",
                "import / repartition",
                "driver Python peak MB",
                "worker Python peak MB",
                "JVM peak MB",
                "statekeeper MB written",
                "Spark MB read / written",
            ],
            rows,
            notes=[
                "groupBy(key).agg(count, sum) state on Spark's RocksDB provider with changelog checkpointing, one "
                f"batch of every key on {PARTITIONS} shuffle partitions, local[2].",
                "import: import_spark_state (Spark's state data source read, routed by key group, each task writing "
                "its store through the typed ValueState in bulk (the stored keys encoded by Spark as it routes them, "
                f"no read per key: the store is empty), one commit record) into {PARTITIONS} partitions.",
                "Spark repartition: spark._streamingCheckpointManager.repartition (PySpark 4.3, experimental) of a "
                "copy of the same checkpoint: it reads and rewrites the same state, as a new batch.",
                "Peak memory: the driver's Python process and the JVM (driver and executors, local mode) sampled "
                "during the import; the Python workers' from their task traces (each task's peak RSS).",
            ],
        )
    ]
