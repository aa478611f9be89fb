"""Timers with quiet input, measured the same way by the quiet_timers benchmark and its test: one input batch
registers processing-time timers due a few seconds on, then no input comes; each timer's latency is the time
from its due time to its output reaching the foreachBatch sink. `run_ours` runs statekeeper with
``quiet_timers=True``, `run_spark` Spark's own ``transformWithState`` with no-data batches on (the same
PySpark processor; the session needs the RocksDB state store provider).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql.streaming.stateful_processor import StatefulProcessor

INPUT = "key string, due_ms long"
OUTPUT = "key string, expiry long"
TRIGGER = {"processingTime": "1 second"}
FIRST_DUE_MS = 5000
"""The first timer is due this long after its input is staged (its batch has run by then)."""


class DueTimers(StatefulProcessor):
    """Each row registers a processing-time timer at `due_ms` (epoch ms); a timer emits its expiry."""

    def init(self, handle: Any) -> None:
        self.handle = handle

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        for r in rows:
            self.handle.registerTimer(int(r.due_ms))
        return iter(())

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
        from pyspark.sql import Row

        yield Row(key=key[0], expiry=expiredTimerInfo.getExpiryTimeInMs())

    def close(self) -> None:
        pass


class _Arrivals:
    """The sink: when each timer's output arrived (wall clock ms), by expiry; and the batches seen."""

    def __init__(self) -> None:
        self.latency_ms: dict[tuple[str, int], float] = {}
        self.batches = 0
        self.lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = df.collect()
        now = time.time() * 1000
        with self.lock:
            self.batches += 1
            for r in rows:
                self.latency_ms.setdefault((r.key, int(r.expiry)), now - int(r.expiry))


def _stage(directory: Path, name: str, rows: list[dict[str, Any]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory.parent / f".{name}.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, directory / name)  # a file stream must never see a part of it


def _until(query: Any, done: Any, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if query.exception() is not None:
            raise RuntimeError(f"query failed: {query.exception()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout_s}s")
        time.sleep(0.05)


def _measure(query: Any, inputs: Path, sink: _Arrivals, timers: int, spacing_ms: int, timeout_s: float) -> int:
    """Warm the query up, stage the timers, wait until all fired; the batches run from the staging on."""
    try:
        _until(query, lambda: sink.batches >= 1, "the warm-up batch", timeout_s)
        before = sink.batches
        now = int(time.time() * 1000)
        _stage(
            inputs,
            "timers.json",
            [{"key": f"k{i:03d}", "due_ms": now + FIRST_DUE_MS + i * spacing_ms} for i in range(timers)],
        )
        _until(query, lambda: len(sink.latency_ms) >= timers, f"{timers} timers", timeout_s)
        return sink.batches - before
    finally:
        query.stop()


def run_ours(spark: Any, work: Path, *, timers: int, spacing_ms: int, timeout_s: float = 600) -> list[float]:
    """statekeeper with quiet_timers: each timer's latency (ms), due time to output."""
    latencies, _ = run_ours_counted(spark, work, timers, spacing_ms, timeout_s)
    return latencies


def run_ours_counted(spark: Any, work: Path, timers: int, spacing_ms: int, timeout_s: float) -> tuple[list[float], int]:
    from statekeeper.store.spark import StatefulOperator

    inputs = work / "ours-in"
    _stage(inputs, "warm.json", [{"key": "warm", "due_ms": 2**62}])
    sink = _Arrivals()
    op = StatefulOperator(
        (work / "ours-state").as_uri(),
        "due",
        key="key",
        processor=DueTimers(),
        output_schema=OUTPUT,
        num_partitions=2,
        sink=sink,
        local_dir=str(work / "ours-local"),
        quiet_timers=True,
    )
    df = spark.readStream.schema(INPUT).json(str(inputs))
    query = op.start(df, str(work / "ours-ckpt"), trigger=TRIGGER)
    batches = _measure(query, inputs, sink, timers, spacing_ms, timeout_s)
    return sorted(sink.latency_ms.values()), batches


def run_spark(spark: Any, work: Path, timers: int, spacing_ms: int, timeout_s: float) -> tuple[list[float], int]:
    inputs = work / "spark-in"
    _stage(inputs, "warm.json", [{"key": "warm", "due_ms": 2**62}])
    sink = _Arrivals()
    spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "true")
    query = (
        spark.readStream.schema(INPUT)
        .json(str(inputs))
        .groupBy("key")
        .transformWithState(DueTimers(), OUTPUT, "Append", "ProcessingTime")
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(work / "spark-ckpt"))
        .trigger(**TRIGGER)
        .start()
    )
    batches = _measure(query, inputs, sink, timers, spacing_ms, timeout_s)
    return sorted(sink.latency_ms.values()), batches


__all__ = ["DueTimers", "run_ours", "run_ours_counted", "run_spark"]
