"""Moving over (issue 64) with time: a ``transformWithStateInPandas`` query's registered timers (processing
time, event time) and TTL'd state are imported from its Spark checkpoint, and the event-time watermark carries
over; the statekeeper query then fires the timers, drops late rows and expires state at the batches Spark's
operator does, and ends with Spark's state (test_spark_import.py has the flavours without time).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd  # type: ignore[import-untyped]
import pytest

from statekeeper.store.spark import StatefulOperator, read_state
from statekeeper.store.spark.spark_import import import_spark_state
from tests.spark.helpers import CollectingSink, stage_files
from tests.spark.test_spark_import import (
    OUT,
    Flavour,
    M,
    N,
    _await,
    _plain,
    _stream,
    _tws_processor,
    move_over,
    rocksdb_provider,
    spark_state,
    statekeeper_state,
)


@pytest.fixture
def spark_rocksdb(spark: Any) -> Iterator[Any]:
    with rocksdb_provider(spark) as session:
        yield session


# -- timers: transformWithStateInPandas in ProcessingTime and EventTime ----------------------------------
TIMER_OUT = "user string, n long, fired long"
NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"
LATE_S = 500
"""An event-time timer is set this far behind the key's newest row: Spark fires it at the next batch, whose
watermark (the newest row so far - 10 s) has passed it, so an import that lost the watermark fires it late."""


def _timers_processor(mode: str) -> Any:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor as PySparkProcessor

    class Reminders(PySparkProcessor):
        """Counts rows per user and sets a timer per batch (processing time: due at once; event time: behind the
        newest row); a timer emits the count and its expiry (-1 in processing time, where it is the clock's)."""

        def init(self, handle: Any) -> None:
            self.handle = handle
            self.count = handle.getValueState("count", "n long")
            self.fired = handle.getValueState("fired", "k long")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[pd.DataFrame]:
            n = (self.count.get() or (0,))[0]
            newest = None
            for pdf in rows:
                n += len(pdf)
                t = int(pdf["value"].max())
                newest = t if newest is None else max(newest, t)
            self.count.update((n,))
            if mode == "ProcessingTime":
                self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1)
            elif newest is not None:
                self.handle.registerTimer(newest - LATE_S * 1000)
            yield pd.DataFrame({"user": [key[0]], "n": [n], "fired": [0]})

        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
            k = (self.fired.get() or (0,))[0] + 1
            self.fired.update((k,))
            expiry = expiredTimerInfo.getExpiryTimeInMs() if mode == "EventTime" else -1
            yield pd.DataFrame({"user": [key[0]], "n": [(self.count.get() or (0,))[0]], "fired": [expiry]})

        def close(self) -> None:
            pass

    return Reminders()


def _timed_stream(spark: Any, input_dir: Path) -> Any:
    """`value` is the row's event time in ms (as a timestamp in ``ts``), watermark delay 10 s."""
    from pyspark.sql import functions as sf

    return _stream(spark, input_dir).withColumn("ts", sf.timestamp_millis("value")).withWatermark("ts", "10 seconds")


def _write_timed_inputs(directory: Path, files: int, late_file: int) -> None:
    """File f's rows happen around f * 1000 s; file `late_file` also has rows far behind every watermark."""
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    rnd = random.Random(5)
    for f in range(files):
        data = [(f"u{rnd.randrange(30)}", f * 1_000_000 + i) for i in range(80)]
        if f == late_file:
            data += [(f"u{rnd.randrange(30)}", 400_000 + i) for i in range(20)]
        name = directory / f"part-{f:05d}.parquet"
        pq.write_table(
            pa.table({"user": [u for u, _ in data], "value": pa.array([v for _, v in data], pa.int64())}), name
        )
        os.utime(name, (1_700_000_000 + f, 1_700_000_000 + f))


def _registered_timers(df: Any, exact: bool) -> dict[Any, Any]:
    """Each key's timers (their expiries in event time; how many in processing time, where they are the clock's)."""
    out: dict[Any, list[int]] = {}
    for r in df.collect():
        out.setdefault(_plain(r["key"]), []).append(int(r["expiration_timestamp_ms"]))
    return {k: sorted(v) if exact else len(v) for k, v in out.items()}


def _tws_timer_outputs(sink: CollectingSink, batches: range, exact: bool) -> dict[int, list[tuple[Any, ...]]]:
    return {b: sorted(r if exact else (*r[:2], -1) for r in sink.batches.get(b, [])) for b in batches}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ProcessingTime", "EventTime"])
def test_timers_move_over_and_fire_as_on_spark(spark_rocksdb: Any, tmp_path: Path, mode: str) -> None:
    """Spark's registered timers (``readRegisteredTimers``) are imported with the state; the statekeeper query
    fires them at the batches Spark's operator fires them, and ends with Spark's state and timers. In event
    time the watermark carries over too: a late row of the first continued batch is dropped as Spark drops it,
    and a timer behind the imported watermark fires at once."""
    spark = spark_rocksdb
    # batch for batch: timers fire in the batches with input on both sides (no-data batches: test_quiet_timers)
    spark.conf.set(NO_DATA_BATCHES, "false")
    try:
        _timers_move_over(spark, tmp_path, mode)
    finally:
        spark.conf.unset(NO_DATA_BATCHES)


def _timers_move_over(spark: Any, tmp_path: Path, mode: str) -> None:
    all_dir, input_dir = tmp_path / "all", tmp_path / "in"
    _write_timed_inputs(all_dir, N + M, late_file=N)
    stage_files(all_dir, input_dir, range(N))
    spark_ckpt, continued = tmp_path / "spark-ckpt", tmp_path / "statekeeper-ckpt"
    spark_sink = CollectingSink()

    def spark_query() -> None:
        out = (
            _timed_stream(spark, input_dir)
            .groupBy("user")
            .transformWithStateInPandas(_timers_processor(mode), TIMER_OUT, "Update", mode)
        )
        writer = out.writeStream.outputMode("update").foreachBatch(spark_sink)
        _await(writer.option("checkpointLocation", str(spark_ckpt)).trigger(availableNow=True).start())

    spark_query()
    assert sorted(spark_sink.batches) == list(range(N))
    root = (tmp_path / "state").as_uri()
    done = import_spark_state(spark, str(spark_ckpt), root, "op", continuation_checkpoint=str(continued))
    exact = mode == "EventTime"
    spark_timers = spark.read.format("statestore").option("readRegisteredTimers", "true")
    assert done.timers == sum(
        len(v) if exact else v for v in _registered_timers(spark_timers.load(str(spark_ckpt)), exact).values()
    )
    assert done.timers > 0
    committed = json.loads((spark_ckpt / "commits" / str(N - 1)).read_text().splitlines()[1])
    assert done.next_watermark_ms == committed["nextBatchWatermarkMs"]
    assert done.next_watermark_ms == ((N - 1) * 1000 - 10) * 1000 + 79  # batch N - 1's newest row - 10 s

    stage_files(all_dir, input_dir, range(N, N + M))
    sink = CollectingSink()
    op = StatefulOperator(
        root,
        "op",
        "user",
        _timers_processor(mode),
        TIMER_OUT,
        num_partitions=2,
        input_format="pandas",
        sink=sink,
        time_mode=mode,
    )
    _await(op.start(_timed_stream(spark, input_dir), str(continued), trigger={"availableNow": True}))
    first = done.batch_id + 1
    spark_query()
    continued_batches = range(first, N + M)
    assert sorted(sink.batches) == list(range(N, N + M)), "the statekeeper query continues at batch N"
    assert _tws_timer_outputs(sink, continued_batches, exact) == _tws_timer_outputs(
        spark_sink, continued_batches, exact
    )
    for var in ("count", "fired"):
        assert statekeeper_state(spark, root, var) == spark_state(spark, spark_ckpt, var), var
    ours = read_state(spark, root, "op", readRegisteredTimers=True)
    assert _registered_timers(ours, exact) == _registered_timers(spark_timers.load(str(spark_ckpt)), exact)


# -- TTL: each value moves with the expiry Spark gave it ------------------------------------------------
TTL_MS = 3_600_000


def _ttl_processor() -> Any:
    return _tws_processor(TTL_MS)


def _expiring(df: Any, value: str, expiry: Any) -> list[tuple[Any, ...]]:
    """(key, [map key,] value, expiry ms) of each row of a flattened state read."""
    from pyspark.sql import functions as sf

    cols = [sf.col("key"), *([sf.col("user_map_key")] if "user_map_key" in df.columns else [])]
    rows = df.select(*cols, sf.col(value).alias("v"), expiry.alias("e")).collect()
    return sorted(tuple(_plain(x) for x in r) for r in rows)


@pytest.mark.slow
def test_ttl_state_moves_over_with_its_expiries(spark_rocksdb: Any, tmp_path: Path) -> None:
    """Spark's state data source reads a TTL'd variable's values as ``struct<value, ttlExpirationMs>``: each
    value, list and map entry is imported with that expiry, and the statekeeper query continues as Spark's."""
    spark = spark_rocksdb
    spark.conf.set(NO_DATA_BATCHES, "false")  # ProcessingTime: batch for batch, as in the timers test
    try:
        flavour = Flavour(
            "ttl",
            lambda df: df.groupBy("user").transformWithStateInPandas(_ttl_processor(), OUT, "Update", "ProcessingTime"),
            lambda root, sink: StatefulOperator(
                root, "op", "user", _ttl_processor(), OUT, num_partitions=2, input_format="pandas", sink=sink
            ),
            {"total": "total", "recent": "recent", "buckets": "buckets"},
        )
        move_over(spark, tmp_path, flavour, before_continuing=_same_expiries)
    finally:
        spark.conf.unset(NO_DATA_BATCHES)


def _same_expiries(spark: Any, spark_ckpt: Path, root: str) -> None:
    from pyspark.sql import functions as sf

    for var, column in (("total", "value"), ("recent", "list_element"), ("buckets", "user_map_value")):
        theirs = spark.read.format("statestore").option("stateVarName", var).load(str(spark_ckpt))
        ours = read_state(spark, root, "op", stateVarName=var)
        got = _expiring(ours, column, sf.unix_millis("expiration_timestamp"))
        want = _expiring(theirs, f"{column}.value", sf.col(f"{column}.ttlExpirationMs"))
        assert got == want and len(got) > 0, var
        if var == "recent":  # some list holds elements of different batches, which expire apart
            assert len({(r[0], r[-1]) for r in got}) > len({r[0] for r in got}), got


def test_the_writer_keeps_spark_expiries_a_list_s_per_element(tmp_path: Path) -> None:
    """No Spark: TTL'd rows as Spark's state data source gives them. A value past its expiry reads as gone, one
    before it as the value; a list's elements expire one by one, each at the expiry Spark gave it."""
    import pyarrow as pa

    from statekeeper.store.formats.typed_schema import parse_ddl
    from statekeeper.store.spark.handle import StatefulProcessorHandle
    from statekeeper.store.spark.spark_checkpoint import TIMER_COL, VALUE_PREFIX, VAR_COL, SparkVariable
    from statekeeper.store.spark.spark_import import _StateWriter
    from statekeeper.store.spark.state import StateContext
    from statekeeper.store.state_store import StateStore, StoreConfig

    variables = (
        SparkVariable("total", "value", parse_ddl("n long"), None, "total", "value", ttl=True),
        SparkVariable("recent", "list", parse_ddl("v long"), None, "recent", "list_value", ttl=True),
    )
    value = pa.struct([("value", pa.struct([("n", pa.int64())])), ("ttlExpirationMs", pa.int64())])
    element = pa.struct([("value", pa.struct([("v", pa.int64())])), ("ttlExpirationMs", pa.int64())])

    def rows(list_expiries: list[int]) -> pa.Table:
        return pa.table(
            {
                "user": ["a", "b", "a"],
                VAR_COL: pa.array([0, 0, 1], pa.int32()),
                f"{VALUE_PREFIX}0": pa.array(
                    [
                        {"value": {"n": 1}, "ttlExpirationMs": 5_000},
                        {"value": {"n": 2}, "ttlExpirationMs": 9_000},
                        None,
                    ],
                    value,
                ),
                f"{VALUE_PREFIX}1": pa.array(
                    [None, None, [{"value": {"v": i}, "ttlExpirationMs": e} for i, e in enumerate(list_expiries)]],
                    pa.list_(element),
                ),
                TIMER_COL: pa.array([None, None, None], pa.int64()),
            }
        )

    root = (tmp_path / "state").as_uri()
    store = StateStore(root, "op", 0, config=StoreConfig(local_dir=str(tmp_path / "w"))).load(0)
    ctx = StateContext(store, 0, parse_ddl("user string"))
    writer = _StateWriter(variables, ("user",))
    writer.init(StatefulProcessorHandle(ctx))
    writer.handleBatch(rows([7_000, 8_000, 8_000]), None)  # type: ignore[arg-type]
    handle = StatefulProcessorHandle(ctx)
    total, recent = handle.getValueState("total"), handle.getListState("recent")
    ctx.now_ms = 6_000
    ctx.set_key(("a",))
    assert total.get() is None and list(recent.get()) == [(0,), (1,), (2,)]  # 5 s gone, 7 s not yet
    ctx.set_key(("b",))
    assert total.get() == (2,)
    ctx.now_ms = 7_000
    ctx.set_key(("a",))
    assert list(recent.get()) == [(1,), (2,)] and recent.exists()
    ctx.clear_key()
    assert ctx.evict_expired() == 1  # total of a; recent of a keeps its two live elements
    assert ctx.ttl_removed == 2  # total of a and recent's first element, as Spark counts them
    ctx.now_ms = 8_000
    ctx.set_key(("a",))
    assert not recent.exists()
    store.close()


def test_a_watermark_log_entry_nested_past_the_cap_counts_as_none_without_recursing() -> None:
    """Spark's offsets/commits logs are checkpoint content: a hostile entry gives no watermark, not a RecursionError."""
    from statekeeper.store.spark.spark_checkpoint import _log_entry

    class Files:
        def __init__(self, text: str) -> None:
            self.text = text

        def read_text(self, name: str) -> str:
            return self.text

    deep = "v1\n" + '{"a":' * 100_000 + "1" + "}" * 100_000
    assert _log_entry(Files(deep), "offsets/3", "batchWatermarkMs") is None  # type: ignore[arg-type]
    assert _log_entry(Files('v1\n{"batchWatermarkMs": 7}'), "offsets/3", "batchWatermarkMs") == 7  # type: ignore[arg-type]
