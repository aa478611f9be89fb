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

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench.report import Table, load_note
from testkit.quiet_timers import FIRST_DUE_MS, run_ours_counted, run_spark

log = logging.getLogger(__name__)
FULL = {"timers": 20, "spacing_ms": 1500}
QUICK = {"timers": 4, "spacing_ms": 800}


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
        ours, ours_batches = run_ours_counted(spark, work, size["timers"], size["spacing_ms"], timeout)
        rows.append(_row("statekeeper, quiet_timers", ours, ours_batches, size["timers"]))
        theirs, their_batches = run_spark(spark, work, size["timers"], size["spacing_ms"], timeout)
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


__all__ = ["run"]
