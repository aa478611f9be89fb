"""Per-user session counting over Spark's rate-micro-batch source, with state in statekeeper.

A user's session is a run of events with gaps shorter than GAP_MS; a processing-time timer closes it.
State per user: the open session (start, last event, events; with a TTL) and totals (sessions, events).
Runs for RUN_SECONDS, prints each batch's latency and state metrics, then reads the committed state
back through the state reader and checks that every input event was counted exactly once.

    RUN_SECONDS=60 python examples/session_count.py

Users come in bursts: the source's n-th event belongs to user (n // BURST) % USERS, so each user is
busy for a moment, goes quiet (its session closes after GAP_MS) and comes back a while later.

A batch starts every 2 s with ROWS_PER_SECOND * 2 events. The rate-micro-batch source (unlike `rate`,
whose offsets follow the wall clock) gives every batch exactly that many, also after a restart: a run
resumed hours later continues with the next batch instead of catching up the whole pause in one.

Environment: RUN_SECONDS (60), ROWS_PER_SECOND (2000), USERS (200), BURST (50), GAP_MS (3000),
PARTITIONS (4), ASYNC (0/1: asynchronous checkpointing), WORK_DIR (default: a fresh temp dir; set it to
resume a run).
"""

# ruff: noqa: N802, N803 - PySpark's StatefulProcessor method names

from __future__ import annotations

import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from statekeeper.store.spark import (
    BatchProgress,
    ExpiredTimerInfo,
    StatefulOperator,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
    read_state,
)

OUTPUT = "user string, event string, sessions long, session_events long, total_events long"
TRIGGER_SECONDS = 2


class SessionCounter(StatefulProcessor):
    def __init__(self, gap_ms: int) -> None:
        self.gap_ms = gap_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        # the open session; dropped a while after it went quiet
        self.session = handle.getValueState(
            "session", "start_ms long, last_ms long, events long", ttlDurationMs=10 * self.gap_ms
        )
        # over all time
        self.totals = handle.getValueState("totals", "sessions long, events long")

    def handleInputRows(self, key: tuple[Any, ...], rows: Iterator[Any], timerValues: TimerValues) -> Iterator[Any]:
        now = timerValues.getCurrentProcessingTimeInMs()
        events = 0
        last = 0
        for r in rows:
            events += 1
            last = max(last, int(r.timestamp.timestamp() * 1000))
        sessions, total = self.totals.get() or (0, 0)
        open_session = self.session.get()
        if open_session is None:
            sessions += 1
            open_session = (last, last, 0)
        start, _, session_events = open_session
        self.session.update((start, last, session_events + events))
        self.totals.update((sessions, total + events))
        for t in self.handle.listTimers():
            self.handle.deleteTimer(t)
        self.handle.registerTimer(now + self.gap_ms)
        yield (key[0], "active", sessions, session_events + events, total + events)

    def handleExpiredTimer(
        self, key: tuple[Any, ...], timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[Any]:
        s = self.session.get()
        self.session.clear()
        sessions, total = self.totals.get() or (0, 0)
        yield (key[0], "closed", sessions, s[2] if s else 0, total)


def _stop_between_batches(query: Any, patience_s: float = 30.0) -> None:
    """Stop while no batch runs (stopping mid-batch is safe, but noisy: the batch is cancelled)."""
    logging.getLogger("py4j").setLevel(logging.CRITICAL)
    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline and query.isActive and query.status["isTriggerActive"]:
        time.sleep(0.01)
    query.stop()


def main() -> int:
    run_seconds = float(os.environ.get("RUN_SECONDS", "60"))
    rate = int(os.environ.get("ROWS_PER_SECOND", "2000"))
    users = int(os.environ.get("USERS", "200"))
    burst = int(os.environ.get("BURST", "50"))
    gap_ms = int(os.environ.get("GAP_MS", "3000"))
    partitions = int(os.environ.get("PARTITIONS", "4"))
    async_checkpoint = os.environ.get("ASYNC", "0") == "1"
    work = Path(os.environ.get("WORK_DIR") or tempfile.mkdtemp(prefix="statekeeper-sessions-"))
    fresh_work = "WORK_DIR" not in os.environ
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as sf

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("statekeeper-session-count")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.python.unix.domain.socket.enabled", "true")  # Python workers off TCP (README, Spark)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")

    root = (work / "state").as_uri()
    print(f"state root: {root}\nspark checkpoint: {work / 'spark-checkpoint'}", flush=True)
    print(
        f"rate-micro-batch source {rate} rows/s over {users} users in bursts of {burst}, session gap {gap_ms} ms, "
        f"{partitions} state partitions, "
        f"{'async' if async_checkpoint else 'sync'} checkpointing, {run_seconds:.0f} s",
        flush=True,
    )
    latencies: list[float] = []

    def on_progress(p: BatchProgress) -> None:
        latencies.append(p.duration_ms)
        print(
            f"batch {p.batch_id:4d} [{p.mode}] {p.input_rows:6d} rows -> {p.output_rows:6d} out | "
            f"latency {p.duration_ms:7.1f} ms (tasks {p.job_ms:6.1f}, load {p.load_ms:5.1f}, "
            f"process {p.process_ms:6.1f}, commit {p.commit_ms:5.1f}, upload {p.upload_ms:5.1f}, "
            f"sink {p.sink_ms:6.1f}) | state rows {p.num_rows_total} (+{p.num_rows_updated} "
            f"-{p.num_rows_removed}), sessions closed {closed_sessions.get(p.batch_id, 0)}, "
            f"changelog {p.changelog_bytes / 1024:.0f} KiB",
            flush=True,
        )

    closed_sessions: dict[int, int] = {}

    def sink(df: Any, batch_id: int) -> None:
        # at-least-once per batch: keyed by batch id, a re-delivered batch replaces its earlier count
        closed_sessions[batch_id] = df.where("event = 'closed'").count()

    op = StatefulOperator(
        root,
        "sessions",
        "user",
        SessionCounter(gap_ms),
        OUTPUT,
        num_partitions=partitions,
        async_checkpoint=async_checkpoint,
        sink=sink,
        on_progress=on_progress,
    )
    rows_per_batch = rate * TRIGGER_SECONDS
    events = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", rows_per_batch)
        .option("numPartitions", 2)
        .option("startTimestamp", int(time.time() * 1000))
        .option("advanceMillisPerBatch", TRIGGER_SECONDS * 1000)
        .load()
        .select(
            sf.concat(sf.lit("user-"), (sf.floor(sf.col("value") / burst) % users).cast("string")).alias("user"),
            "timestamp",
            "value",
        )
    )
    query = op.start(events, str(work / "spark-checkpoint"), trigger={"processingTime": f"{TRIGGER_SECONDS} seconds"})
    query.awaitTermination(max(1, int(run_seconds)))
    _stop_between_batches(query)
    rc = 0
    if query.exception() is not None:
        print(f"the query failed: {query.exception()}", file=sys.stderr)
        rc = 1

    committed = [p for p in op.recent_progress if p.mode == "commit"]
    steady = latencies[1:]  # the first batch starts Spark's Python workers and warms everything up
    if steady:
        ordered = sorted(steady)
        p50 = statistics.median(ordered)
        p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
        print(
            f"\n{len(latencies)} batches; after the first ({latencies[0]:.0f} ms, start-up): latency p50 {p50:.0f} ms, "
            f"p99 {p99:.0f} ms, max {ordered[-1]:.0f} ms"
        )
    if committed:
        last = committed[-1]
        # the version this run last reported (a stop mid-batch may have committed one more, unreported)
        totals = read_state(spark, root, "sessions", version=last.version, stateVarName="totals").collect()
        counted = sum(r.value.events for r in totals)
        sessions = sum(r.value.sessions for r in totals)
        fed = len(closed_sessions)
        print(
            f"state at version {last.version}: {len(totals)} users, {sessions} sessions, {counted} events counted "
            f"over {last.batch_id + 1} batches; the sink got {fed} batches, {sum(closed_sessions.values())} "
            "closed sessions"
        )
        top = sorted(totals, key=lambda r: -r.value.sessions)[:3]
        print("most sessions:", ", ".join(f"{r.key[0]}={r.value.sessions}" for r in top))
        expected = rows_per_batch * (last.batch_id + 1)  # every batch, of this run and earlier ones, is full
        status = "OK" if counted == expected else f"MISMATCH (expected {expected})"
        print(f"exactly-once check: {counted} events in state vs {expected} input rows committed: {status}")
        if status != "OK":
            rc = 1
    spark.stop()
    if fresh_work:
        shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    t0 = time.time()
    rc = main()
    print(f"done in {time.time() - t0:.0f} s")
    sys.exit(rc)
