"""How long after its due time does a timer fire when the input has gone quiet, beside Spark's own transformWithState?

Once the query is warm (a first batch done), one input batch registers `timers` processing-time timers, due one
after another `spacing_ms` apart from a few seconds on; then no input comes. The time from each timer's due time
to its output reaching the sink (the foreachBatch call's wall clock) is measured, p50/p99/max, with a 1-second
trigger, for statekeeper with ``quiet_timers=True`` (a tick batch runs when a timer is due,
store/spark/ticks.py) and for Spark's ``transformWithState`` with no-data batches on (the same PySpark
processor, RocksDB provider). Also the batches each ran meanwhile: Spark's operator in timeMode
"ProcessingTime" asks for a no-data batch at every trigger, timers due or not; statekeeper runs one when one
is due.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from bench.report import Table, load_note

log = logging.getLogger(__name__)

INPUT = "key string, due_ms long"
OUTPUT = "key string, expiry long"
TRIGGER = {"processingTime": "1 second"}
FULL = {"timers": 20, "spacing_ms": 1500}
QUICK = {"timers": 4, "spacing_ms": 800}
FIRST_DUE_MS = 5000
"""The first timer is due this long after its input is staged (its batch has run by then)."""


class DueTimers(StatefulProcessor):
    """Each row registers a processing-time timer at `due_ms` (epoch ms); a timer emits its expiry."""

    def init(self, handle: Any) -> None:
        self.handle = handle

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:  # noqa: N802, N803
        for r in rows:
            self.handle.registerTimer(int(r.due_ms))
        return iter(())

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:  # noqa: N802, N803
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
    latencies, _ = _ours(spark, work, timers, spacing_ms, timeout_s)
    return latencies


def _ours(spark: Any, work: Path, timers: int, spacing_ms: int, timeout_s: float) -> tuple[list[float], int]:
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


def _spark(spark: Any, work: Path, timers: int, spacing_ms: int, timeout_s: float) -> tuple[list[float], int]:
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


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _row(engine: str, latencies: list[float], batches: int, timers: int) -> list[Any]:
    return [engine, timers, _pct(latencies, 50), _pct(latencies, 99), max(latencies, default=float("nan")), batches]


def run(quick: bool) -> list[Table]:
    from bench.spark import bench_session

    size = QUICK if quick else FULL
    load_start = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="statekeeper-bench-quiet-"))
    try:
        spark = bench_session(work / "local")
        timeout = 600.0
        rows = []
        ours, ours_batches = _ours(spark, work, size["timers"], size["spacing_ms"], timeout)
        rows.append(_row("statekeeper, quiet_timers", ours, ours_batches, size["timers"]))
        theirs, their_batches = _spark(spark, work, size["timers"], size["spacing_ms"], timeout)
        rows.append(_row("Spark transformWithState, no-data batches", theirs, their_batches, size["timers"]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    quiet_s = (FIRST_DUE_MS + (size["timers"] - 1) * size["spacing_ms"]) / 1000
    return [
        Table(
            "Timers with quiet input: due time to output (ms), trigger 1 s",
            ["engine", "timers", "p50", "p99", "max", "batches"],
            rows,
            [
                f"one input batch, then none for about {quiet_s:.0f} s while the timers fall due "
                f"{size['spacing_ms']} ms apart; latency = the sink's wall clock when the timer's row arrived - "
                "the timer's due time",
                "batches: foreachBatch calls from the timers' staging to the last timer's output, their input batch "
                "included (Spark's operator asks for a no-data batch at every trigger in ProcessingTime mode; "
                "statekeeper ticks only when a timer is due); each query warmed up by one batch first",
                load_note(load_start),
            ],
        )
    ]


__all__ = ["DueTimers", "run", "run_ours"]
