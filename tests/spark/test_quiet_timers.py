"""Timers fire while the input is quiet (issue 64 D, store/spark/ticks.py).

A foreachBatch query gets no no-data batches; with ``quiet_timers=True`` a due processing-time timer, or an
event-time timer the watermark passed, makes the query run a batch with no input rows (a tick), once, and
a query with no timer due runs no batch at all. Event time is compared with Spark's own transformWithState
with no-data batches on; the restart test stops the query after a tick batch and restarts it on another
"host" (the tick record gone): no timer output twice, none lost.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from statekeeper.store import CommitLog, open_file_manager
from statekeeper.store.spark import StatefulOperator, StatefulProcessor
from statekeeper.store.spark.ticks import TickChannel, TickRecord, channel_path, due_at_ms, next_offset
from statekeeper.store.spark.time_mode import TimeMode
from tests.spark.tws_processors import INPUT, OUTPUT, pyspark_sessions

REMINDER_INPUT = "user string, value long"
REMINDER_OUTPUT = "user string, kind string, expiry long"
TRIGGER = {"processingTime": "1 second"}
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
WAIT_S = 180.0
T0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)  # generous: the shared test machine may be loaded


class Reminder(StatefulProcessor):
    """Each row registers a processing-time timer `value` ms after the batch time; a timer emits a row."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.rows = handle.getValueState("rows", "n long")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        n = self.rows.get()[0] if self.rows.exists() else 0
        for r in rows:
            n += 1
            self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + int(r.value))
        self.rows.update((n,))
        yield (key[0], "input", -1)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
        yield (key[0], "timer", expiredTimerInfo.getExpiryTimeInMs())


class Sink:
    """Each batch's output with the wall clock it arrived at; a re-delivered batch replaces its first."""

    def __init__(self) -> None:
        self.batches: dict[int, list[tuple[Any, ...]]] = {}
        self.arrived: dict[int, float] = {}
        self.lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = sorted(tuple(r) for r in df.collect())
        with self.lock:
            self.batches[batch_id] = rows
            self.arrived[batch_id] = time.time()

    def rows(self, kind: str) -> list[tuple[int, tuple[Any, ...]]]:
        with self.lock:
            return [(b, r) for b in sorted(self.batches) for r in self.batches[b] if r[1] == kind]


def _wait(condition: Callable[[], bool], query: Any, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _stage(directory: Path, name: str, rows: list[dict[str, Any]]) -> None:
    """A JSON input file, published whole (a file stream must never see a partial file)."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory.parent / f".{name}.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, directory / name)


def _reminders(
    root: str, sink: Sink, local: Path, processor: StatefulProcessor | None = None, name: str = "reminders"
) -> StatefulOperator:
    """A quiet_timers operator over the users' rows (`processor`: a Reminder by default)."""
    return StatefulOperator(
        root,
        name,
        key="user",
        processor=processor or Reminder(),
        output_schema=REMINDER_OUTPUT,
        num_partitions=2,
        sink=sink,
        local_dir=str(local),
        quiet_timers=True,
    )


# -- the tick source's decisions, without Spark -----------------------------------------------------------
def test_tick_decisions() -> None:
    assert due_at_ms(TimeMode.PROCESSING_TIME, 1500, None) == 1500
    assert due_at_ms(TimeMode.PROCESSING_TIME, None, None) is None
    assert due_at_ms(TimeMode.EVENT_TIME, 5000, 15000) == 0  # the next batch's watermark passes it: now
    assert due_at_ms(TimeMode.EVENT_TIME, 25000, 15000) is None  # only new input moves the watermark
    assert due_at_ms(TimeMode.NONE, 5, 10) is None
    # a TTL expires by processing time in both modes: whichever is due first
    assert due_at_ms(TimeMode.PROCESSING_TIME, 1500, None, 1200) == 1200
    assert due_at_ms(TimeMode.PROCESSING_TIME, None, None, 1200) == 1200
    assert due_at_ms(TimeMode.EVENT_TIME, 25000, 15000, 900) == 900
    assert due_at_ms(TimeMode.EVENT_TIME, 5000, 15000, 900) == 0
    assert due_at_ms(TimeMode.NONE, None, None, 900) is None

    start = {"tick": 3, "after": 7}
    assert next_offset(start, TickRecord(8, 1000), 999, first_poll=False) == start  # not due yet
    assert next_offset(start, TickRecord(8, 1000), 1000, first_poll=False) == {"tick": 4, "after": 8}
    assert next_offset(start, TickRecord(7, 1000), 5000, first_poll=False) == start  # ticked after batch 7
    assert next_offset(start, TickRecord(8, None), 5000, first_poll=False) == start  # nothing pending
    assert next_offset(start, None, 5000, first_poll=False) == start
    assert next_offset(start, None, 5000, first_poll=True) == {"tick": 4, "after": 7}  # restarted, no record
    # a record from an earlier query on the same root (batch ids started over) still ticks once
    assert next_offset({"tick": 1, "after": 57}, TickRecord(2, 0), 1, first_poll=False) == {"tick": 2, "after": 2}


def test_tick_channel_round_trip(tmp_path: Path) -> None:
    path = channel_path("file:///r", "op", "/ckpt", str(tmp_path))
    assert path == channel_path("file:///r", "op", "/ckpt", str(tmp_path))  # a restart finds it
    assert path != channel_path("file:///r", "op", "/other", str(tmp_path))
    channel = TickChannel(path)
    assert channel.read() is None
    channel.write(TickRecord(4, 123))
    channel.write(TickRecord(5, None))
    assert channel.read() == TickRecord(5, None)
    for broken in ("{not json", "[" * 4000, '{"due_at_ms": ' * 1500):  # its directory is anyone's: a hint, not trusted
        Path(path).write_text(broken)
        assert channel.read() is None  # a broken hint raises no tick and no error
    channel.remove()
    assert channel.read() is None


# -- with Spark -------------------------------------------------------------------------------------------
def test_processing_time_timer_fires_without_input_and_nothing_else_runs(spark: Any, tmp_path: Path) -> None:
    inputs, sink = tmp_path / "in", Sink()
    _stage(inputs, "a.json", [{"user": "u1", "value": 2000}])
    op = _reminders((tmp_path / "state").as_uri(), sink, tmp_path / "local")
    df = spark.readStream.schema(REMINDER_INPUT).json(str(inputs))
    query = op.start(df, str(tmp_path / "ckpt"), trigger=TRIGGER)
    try:
        # the sink sees a batch's output before its progress is reported: wait for both
        _wait(lambda: bool(sink.rows("timer")) and len(op.recent_progress) >= 2, query, "the tick batch's progress")
        [(tick_batch, (user, _, expiry))] = sink.rows("timer")
        assert (tick_batch, user) == (1, "u1")
        progress = {p.batch_id: p for p in op.recent_progress}
        assert progress[0].input_rows == 1 and progress[0].timers_fired == 0
        assert progress[1].input_rows == 0 and progress[1].timers_fired == 1  # the tick batch
        assert progress[1].batch_timestamp_ms >= expiry
        # nothing is due any more: the quiet query runs no batch through several triggers
        time.sleep(4)
        assert query.exception() is None
        assert [p.batch_id for p in op.recent_progress] == [0, 1]
        assert sorted(sink.batches) == [0, 1]
    finally:
        query.stop()
    assert CommitLog(open_file_manager((tmp_path / "state").as_uri())).latest() == 2


class Remembered(StatefulProcessor):
    """Keeps each user's last value for `value` ms (a TTL'd ValueState); no timers."""

    def init(self, handle: Any) -> None:
        self.last = handle.getValueState("last", "v long", 1_500)

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        for r in rows:
            self.last.update((int(r.value),))
        yield (key[0], "input", -1)


def test_ttl_expires_without_input_as_in_sparks_no_data_batches(spark: Any, tmp_path: Path) -> None:
    """A quiet query evicts a TTL'd value when it expires (Spark's no-data batches evict it), not at the next
    input: one batch with no rows runs at the expiry, then nothing."""
    inputs, sink = tmp_path / "in", Sink()
    _stage(inputs, "a.json", [{"user": "u1", "value": 7}, {"user": "u2", "value": 8}])
    op = _reminders((tmp_path / "state").as_uri(), sink, tmp_path / "local", Remembered(), "remembered")
    query = op.start(spark.readStream.schema(REMINDER_INPUT).json(str(inputs)), str(tmp_path / "ckpt"), trigger=TRIGGER)
    try:
        _wait(lambda: len(op.recent_progress) >= 2, query, "the batch that evicts the expired values")
        first, evicting = op.recent_progress[0], op.recent_progress[1]
        assert (first.input_rows, first.num_rows_total) == (2, 2)
        assert evicting.input_rows == 0 and evicting.ttl_removed == 2 and evicting.num_rows_total == 0
        assert evicting.batch_timestamp_ms >= first.batch_timestamp_ms + 1_500
        time.sleep(3)  # nothing left to expire: no more batches
        assert query.exception() is None
        assert [p.batch_id for p in op.recent_progress] == [0, 1]
    finally:
        query.stop()


def test_a_query_that_ends_gets_no_ticks(spark: Any, tmp_path: Path) -> None:
    """availableNow (and once) end when the input is drained: nothing is quiet, no tick stream is added."""
    inputs = tmp_path / "in"
    _stage(inputs, "a.json", [{"user": "u1", "value": 60_000}])
    op = _reminders((tmp_path / "state").as_uri(), Sink(), tmp_path / "local")
    df = spark.readStream.schema(REMINDER_INPUT).json(str(inputs))
    query = op.start(df, str(tmp_path / "ckpt"), trigger={"availableNow": True})
    try:
        assert query.awaitTermination(int(WAIT_S))
        assert query.exception() is None
    finally:
        query.stop()
    assert op.ticks is None
    assert [p.input_rows for p in op.recent_progress] == [1]


def _sessions_stream(spark: Any, inputs: Path) -> Any:
    return (
        spark.readStream.schema(INPUT)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(inputs))
        .withWatermark("ts", "5 seconds")
    )


def _write_sessions_input(inputs: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    inputs.mkdir(parents=True)
    for i, (user, seconds) in enumerate([("u1", 0), ("u2", 20)]):
        ts = pa.array([T0 + dt.timedelta(seconds=seconds)], pa.timestamp("us", tz="UTC"))
        path = inputs / f"part-{i:05d}.parquet"
        pq.write_table(pa.table({"user": [user], "page": ["p"], "ts": ts}), path)
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))


def test_event_time_timer_fires_when_the_watermark_passes_as_in_spark(spark: Any, tmp_path: Path) -> None:
    """u1's session timer (5 s after its event) is passed by the watermark u2's row at 20 s moves to 15 s:
    Spark runs a no-data batch that fires it; we run a tick batch, with the same output, and then nothing
    (u2's timer at 25 s needs input to move the watermark)."""
    inputs = tmp_path / "in"
    _write_sessions_input(inputs)
    expected = Sink()
    reference = (
        _sessions_stream(spark, inputs)
        .groupBy("user")
        .transformWithState(pyspark_sessions(), OUTPUT, "Append", "EventTime")
        .writeStream.foreachBatch(expected)
        .option("checkpointLocation", str(tmp_path / "ref-ckpt"))
        .trigger(**TRIGGER)
    )
    settings = {
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        "spark.sql.streaming.noDataMicroBatches.enabled": "true",
    }
    for name, value in settings.items():
        spark.conf.set(name, value)
    try:
        query = reference.start()
        try:
            _wait(lambda: bool(expected.rows("timer")), query, "Spark's no-data batch")
        finally:
            query.stop()
    finally:
        for name in settings:
            spark.conf.unset(name)
    got = Sink()
    op = StatefulOperator(
        (tmp_path / "state").as_uri(),
        "sessions",
        key="user",
        processor=pyspark_sessions(),
        output_schema=OUTPUT,
        num_partitions=2,
        time_mode="EventTime",
        sink=got,
        local_dir=str(tmp_path / "local"),
        quiet_timers=True,
    )
    query = op.start(_sessions_stream(spark, inputs), str(tmp_path / "ckpt"), trigger=TRIGGER)
    try:
        _wait(lambda: bool(got.rows("timer")), query, "the tick batch")
        time.sleep(4)
        assert query.exception() is None
    finally:
        query.stop()
    assert sorted(expected.batches) == [0, 1, 2]  # the third is Spark's no-data batch
    assert got.batches == expected.batches
    [(_, timer)] = got.rows("timer")
    t0_ms = int(T0.timestamp() * 1000)
    assert (timer[0], timer[4], timer[5]) == ("u1", t0_ms + 15_000, t0_ms + 5_000)  # fired at watermark 20 s - 5 s
    assert [p.input_rows for p in op.recent_progress] == [1, 1, 0]


def test_ticks_exactly_once_across_a_restart_elsewhere(spark: Any, tmp_path: Path) -> None:
    """Stop after the tick batch that fired u1's timer, lose the tick record (a restart on another host),
    restart: u2's timer still fires without input, and no timer's output appears in two batches."""
    inputs, sink, root, ckpt = tmp_path / "in", Sink(), (tmp_path / "state").as_uri(), tmp_path / "ckpt"
    _stage(inputs, "a.json", [{"user": "u1", "value": 1500}, {"user": "u2", "value": 20_000}])
    df = spark.readStream.schema(REMINDER_INPUT).json(str(inputs))
    op = _reminders(root, sink, tmp_path / "local")
    query = op.start(df, str(ckpt), trigger=TRIGGER)
    try:
        _wait(lambda: bool(sink.rows("timer")), query, "u1's timer")
    finally:
        query.stop()
    assert [r[0] for _, r in sink.rows("timer")] == ["u1"]
    assert op.ticks is not None
    op.ticks.remove()
    again = _reminders(root, sink, tmp_path / "local")
    query = again.start(spark.readStream.schema(REMINDER_INPUT).json(str(inputs)), str(ckpt), trigger=TRIGGER)
    try:
        _wait(lambda: len(sink.rows("timer")) == 2, query, "u2's timer after the restart")
        time.sleep(3)
        assert query.exception() is None
    finally:
        query.stop()
    timers = sink.rows("timer")
    assert sorted(r[0] for _, r in timers) == ["u1", "u2"]
    assert len({b for b, _ in timers}) == 2
    assert [r[0] for _, r in sink.rows("input")] == ["u1", "u2"]  # the input batch ran once
    batches = sorted(sink.batches)
    assert batches == list(range(len(batches)))
    log = CommitLog(open_file_manager(root))
    assert log.latest() == len(batches)  # every batch committed its version once
    assert all(p.input_rows == 0 for p in again.recent_progress)


@pytest.mark.slow
def test_latency_from_due_time_to_output(spark: Any, tmp_path: Path) -> None:
    """Twenty timers due one after another with no input after the first batch: each fires within about a
    trigger interval of its due time (python -m bench quiet_timers measures it beside Spark's own)."""
    from testkit.quiet_timers import run_ours

    latencies = run_ours(spark, tmp_path, timers=20, spacing_ms=700)
    assert len(latencies) == 20  # each fired once, with no input after theirs
    assert max(latencies) < 30_000  # a loaded shared machine stretches batches: the bound is loose


@pytest.fixture
def remote(spark_connect_url: str) -> Iterator[Any]:
    """A Connect client session beside the suite's classic one (as tests/spark/test_connect.py builds it)."""
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

    from tests.spark.test_connect import CONNECT_MODE_ENV

    saved = {k: os.environ.get(k) for k in CONNECT_MODE_ENV}
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    session = RemoteSparkSession.builder.remote(spark_connect_url).getOrCreate()
    try:
        yield session
    finally:
        session.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.mark.slow
def test_quiet_timers_over_spark_connect(remote: Any, tmp_path: Path) -> None:
    """Over Connect the tick source and the batches run in the server: a timer still fires without input."""
    from tests.spark.helpers import JsonFileSink

    inputs, out = tmp_path / "in", tmp_path / "out"
    _stage(inputs, "a.json", [{"user": "u1", "value": 1500}])
    op = StatefulOperator(
        (tmp_path / "state").as_uri(),
        "reminders",
        key="user",
        processor=Reminder(),
        output_schema=REMINDER_OUTPUT,
        num_partitions=2,
        sink=JsonFileSink(str(out)),
        local_dir=str(tmp_path / "local"),
        quiet_timers=True,
    )
    df = remote.readStream.schema(REMINDER_INPUT).json(str(inputs))
    query = op.start(df, str(tmp_path / "ckpt"), trigger=TRIGGER)
    try:
        _wait((out / "batch-00001.json").exists, query, "the tick batch over Connect")
    finally:
        query.stop()
    assert json.loads((out / "batch-00001.json").read_text())[0][:2] == ["u1", "timer"]
