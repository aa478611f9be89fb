"""transformWithState parity: the same processor on PySpark's own operator (RocksDB provider) and on
statekeeper, over the same input files, batch by batch (Spark is the reference)."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from statekeeper.store.spark import StatefulOperator
from tests.spark.tws_processors import (
    INPUT,
    OUTPUT,
    PANDAS_OUTPUT,
    PageTally,
    pyspark_page_tally,
    pyspark_sessions,
)

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

# (user, page, seconds after T0) per file. Batch 3's u1 row at 1 s is behind the watermark (16 s) but not
# behind the previous batch's (-1 s): Spark keeps it. Batch 4's u7 row at 10 s is behind the previous
# batch's watermark (16 s): late, dropped and counted.
FILES = [
    [("u1", "a", 0), ("u2", "b", 1), ("u1", "b", 2)],
    [("u1", "a", 4), ("u3", "c", 3)],
    [("u2", "a", 20), ("u4", "d", 21)],
    [("u1", "x", 1), ("u3", "c", 22), ("u5", "e", 30)],
    [("u6", "f", 60), ("u7", "y", 10)],
    [("u4", "a", 61)],
]


def _write_files(directory: Path) -> None:
    directory.mkdir(parents=True)
    for i, rows in enumerate(FILES):
        path = directory / f"part-{i:05d}.parquet"
        pq.write_table(
            pa.table(
                {
                    "user": [u for u, _, _ in rows],
                    "page": [p for _, p, _ in rows],
                    "ts": pa.array([T0 + dt.timedelta(seconds=s) for _, _, s in rows], pa.timestamp("us", tz="UTC")),
                }
            ),
            path,
        )
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))


class _Collect:
    def __init__(self) -> None:
        self.batches: dict[int, list[tuple[Any, ...]]] = {}

    def __call__(self, df: Any, batch_id: int) -> None:
        self.batches[batch_id] = sorted(tuple(r) for r in df.collect())


def _run(query: Any) -> list[Any]:
    try:
        assert query.awaitTermination(240), "query did not finish in time"
        assert query.exception() is None, query.exception()
        return list(query.recentProgress)
    finally:
        query.stop()


def _parity(
    spark: Any,
    tmp_path: Path,
    reference: Callable[[Any], Any],
    ours: Callable[[_Collect], StatefulOperator],
    *,
    watermark: bool = False,
    conf: dict[str, str] | None = None,
) -> tuple[StatefulOperator, list[Any]]:
    """Run PySpark's query (`reference` of the input stream) and ours (`ours` of a sink) over `FILES`, one
    file per batch, on the RocksDB provider; assert every batch's output is the same. Returns our operator
    and the reference query's progress."""
    inputs = tmp_path / "in"
    _write_files(inputs)

    def stream() -> Any:
        df = spark.readStream.schema(INPUT).option("maxFilesPerTrigger", 1).parquet(str(inputs))
        return df.withWatermark("ts", "5 seconds") if watermark else df

    settings = {"spark.sql.streaming.stateStore.providerClass": ROCKSDB, **(conf or {})}
    for name, value in settings.items():
        spark.conf.set(name, value)
    try:
        expected = _Collect()
        progress = _run(
            reference(stream())
            .writeStream.foreachBatch(expected)
            .option("checkpointLocation", str(tmp_path / "ref-ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        got = _Collect()
        op = ours(got)
        _run(op.start(stream(), str(tmp_path / "ckpt"), trigger={"availableNow": True}))
    finally:
        for name in settings:
            spark.conf.unset(name)
    assert sorted(expected.batches) == list(range(len(FILES)))
    for b in range(len(FILES)):
        assert got.batches[b] == expected.batches[b], f"batch {b}"
    return op, progress


def test_event_time_timers_watermark_initial_state_match_pyspark(spark: Any, tmp_path: Path) -> None:
    initial = spark.createDataFrame([("u1", 100), ("u9", 7)], "user string, n long")
    op, progress = _parity(
        spark,
        tmp_path,
        lambda df: df.groupBy("user").transformWithState(
            pyspark_sessions(), OUTPUT, "Append", "EventTime", initialState=initial.groupBy("user")
        ),
        lambda sink: StatefulOperator(
            (tmp_path / "state").as_uri(),
            "sessions",
            key="user",
            processor=pyspark_sessions(),  # PySpark's own processor class, unchanged
            output_schema=OUTPUT,
            num_partitions=2,
            time_mode="EventTime",
            initial_state=initial.groupBy("user"),
            sink=sink,
        ),
        watermark=True,
        conf={"spark.sql.streaming.noDataMicroBatches.enabled": "false"},
    )
    dropped = [p.num_rows_dropped_by_watermark for p in op.recent_progress]
    assert dropped == [0, 0, 0, 0, 1, 0]
    assert dropped == [p.stateOperators[0].numRowsDroppedByWatermark for p in progress if p.numInputRows]


@pytest.mark.slow
def test_pandas_flavour_time_mode_none_initial_state_match_pyspark(spark: Any, tmp_path: Path) -> None:
    """transformWithStateInPandas, timeMode "None": map containsKey/removeKey, list put/appendList, pandas
    initial state."""
    seed = [("u1", 3, "drop"), ("u1", 4, "z"), ("u8", 1, "q")]
    initial = spark.createDataFrame(seed, "user string, n long, page string")
    _parity(
        spark,
        tmp_path,
        lambda df: df.groupBy("user").transformWithStateInPandas(
            pyspark_page_tally(), PANDAS_OUTPUT, "Append", "None", initialState=initial.groupBy("user")
        ),
        lambda sink: StatefulOperator(
            (tmp_path / "state").as_uri(),
            "tally",
            key="user",
            processor=PageTally(),
            output_schema=PANDAS_OUTPUT,
            input_format="pandas",
            time_mode="None",
            initial_state=initial.groupBy("user"),
            sink=sink,
        ),
    )


class WindowCount(StatefulProcessor):
    """Rows per (window, user) key, the window a struct (PySpark hands it in the key as a dict), and its kind."""

    def init(self, handle: Any) -> None:
        self.n = handle.getValueState("n", "n long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        from pyspark.sql import Row

        window, user = key
        n = (self.n.get() or (0,))[0] + sum(1 for _ in rows)
        self.n.update((n,))
        yield Row(window=window, user=user, n=n, kind=type(window).__name__)


def test_a_struct_key_window_matches_pyspark(spark: Any, tmp_path: Path) -> None:
    """A grouping key holding a struct (Spark's `window`) reaches the processor as PySpark hands it (a dict), keys
    its state and goes back out as a struct, as on PySpark's operator (it failed in every task: Arrow cannot compare
    structs)."""
    from pyspark.sql import functions as sf

    inputs = tmp_path / "in"
    _write_files(inputs)
    out = "window struct<start: timestamp, end: timestamp>, user string, n long, kind string"

    def stream() -> Any:
        df = spark.readStream.schema(INPUT).option("maxFilesPerTrigger", 1).parquet(str(inputs))
        return df.withColumn("window", sf.window("ts", "10 seconds"))

    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    try:
        expected = _Collect()
        _run(
            stream()
            .groupBy("window", "user")
            .transformWithState(WindowCount(), out, "Update", "None")
            .writeStream.foreachBatch(expected)
            .option("checkpointLocation", str(tmp_path / "ref-ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        got = _Collect()
        op = StatefulOperator(
            (tmp_path / "state").as_uri(), "windows", ["window", "user"], WindowCount(), out, num_partitions=2, sink=got
        )
        _run(op.start(stream(), str(tmp_path / "ckpt"), trigger={"availableNow": True}))
    finally:
        spark.conf.unset("spark.sql.streaming.stateStore.providerClass")
    assert sorted(expected.batches) == list(range(len(FILES)))
    assert got.batches == expected.batches
