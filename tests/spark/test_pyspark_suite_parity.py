"""Parity with PySpark's own transformWithState suite (issue 64): processors in the shape of the suite's
(tests/spark/pyspark_tws/processors.py), each in the Row flavour (transformWithState) and the pandas
flavour (transformWithStateInPandas), run on PySpark's operator (RocksDB provider, no no-data batches)
and on statekeeper over the same input files, one file per batch; every batch's output must be the same,
and the processors' own assertions (which PySpark's suite makes inside them) must hold on both.

The default run has three of them (see DEFAULT); ``-m slow`` runs a processor for each of the issue's seven
defects and then every processor in both flavours."""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from statekeeper.store.spark import StatefulOperator
from tests.spark.pyspark_tws import processors as p

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
CONF = {
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
    "spark.sql.streaming.noDataMicroBatches.enabled": "false",
}

# (id, temperature, seconds after T0) per file. With withWatermark("eventTime", "5 seconds") the batches'
# watermarks are T0 + (0 -> -2 s -> 18 s -> 35 s); batch 3's ("1", 99, 10) is behind batch 2's watermark
# (18 s), so it is late: dropped in time mode EventTime only.
FILES = [
    [("0", 123, 0), ("0", 46, 1), ("1", 146, 2), ("1", 346, 3)],
    [("0", 67, 20), ("0", 89, 21), ("1", 200, 22), ("3", 50, 23)],
    [("1", 10, 5), ("3", 120, 40), ("0", 30, 39)],
    [("1", 99, 10), ("0", 101, 50), ("3", 7, 51)],
]
SEEDS = [("0", 789, T0 + dt.timedelta(seconds=3)), ("3", 987, T0 + dt.timedelta(seconds=4))]
SEED_SCHEMA = "id string, initVal int, initTime timestamp"
LOS_ANGELES = {"spark.sql.session.timeZone": "America/Los_Angeles"}
"""A session time zone other than UTC (the suite's), where naive timestamps and their zone show."""


class _Collect:
    """The sink: each batch's output rows; `pause_s` after each batch spaces the batches' processing times."""

    def __init__(self, pause_s: float = 0.0) -> None:
        self.batches: dict[int, list[tuple[Any, ...]]] = {}
        self.pause_s = pause_s

    def __call__(self, df: Any, batch_id: int) -> None:
        self.batches[batch_id] = sorted((tuple(r) for r in df.collect()), key=repr)
        time.sleep(self.pause_s)


def _write_files(directory: Path) -> None:
    directory.mkdir(parents=True)
    for i, rows in enumerate(FILES):
        path = directory / f"part-{i:05d}.parquet"
        ts = pa.array([T0 + dt.timedelta(seconds=s) for _, _, s in rows], pa.timestamp("us", tz="UTC"))
        table = pa.table(
            {"id": [r[0] for r in rows], "temperature": pa.array([r[1] for r in rows], pa.int32()), "eventTime": ts}
        )
        pq.write_table(table, path)
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))


def _run(query: Any) -> None:
    try:
        assert query.awaitTermination(240), "query did not finish in time"
        assert query.exception() is None, query.exception()
    finally:
        query.stop()


# name -> (processor factory of use_pandas, time mode, input with withWatermark, with initial state)
CASES: dict[str, tuple[Callable[[bool], Any], str, bool, bool]] = {
    "SimpleStateful": (p.SimpleStateful, "None", False, False),
    "SimpleTTLStateful": (lambda pandas: p.SimpleStateful(pandas, ttl_ms=30_000), "ProcessingTime", False, False),
    "EventTimeMax": (p.EventTimeMax, "EventTime", True, False),
    "EventTimeMin": (p.EventTimeMin, "EventTime", True, False),
    "ProcTimeTimers": (p.ProcTimeTimers, "ProcessingTime", False, False),
    "InitialStateSum": (p.InitialStateSum, "None", False, True),
    "LateRowsTimeModeNone": (p.RowCounter, "None", True, False),
    "LateRowsProcessingTime": (p.RowCounter, "ProcessingTime", True, False),
    "CompositeState": (p.CompositeState, "None", False, False),
    "CompositeOutput": (p.CompositeOutput, "None", False, False),
    "MapStateOps": (p.MapStateOps, "None", False, False),
    "ListStateOps": (p.ListStateOps, "ProcessingTime", False, False),
    "IterationOrders": (p.IterationOrders, "ProcessingTime", False, False),
    "ListStateTTL": (lambda pandas: p.ListStateTTL(pandas, ttl_ms=15_000), "ProcessingTime", False, False),
    "ReorderedOutput": (p.ReorderedOutput, "None", False, False),
    "StateTimestamps": (p.StateTimestamps, "None", False, False),
    "ChainingOps": (p.ChainingOps, "None", False, False),
    "InitialStateTime": (p.InitialStateTime, "None", False, True),
    "TimerKeys": (p.TimerKeys, "ProcessingTime", False, False),
}
PAUSE_S = {"ListStateTTL": 10.0}
"""Batch k + 1 starts 10 s + batch k's duration after it: with a 15 s TTL, batch k + 1 sees batch k's elements
and batch k + 2 no longer does, for batches shorter than 5 s."""
DEFECTS = [
    ("SimpleStateful", "rows"),  # defect 1
    ("EventTimeMax", "pandas"),  # 2
    ("ProcTimeTimers", "rows"),  # 3
    ("InitialStateSum", "pandas"),  # 4
    ("LateRowsProcessingTime", "rows"),  # 5
    ("CompositeState", "pandas"),  # 6
    ("CompositeOutput", "pandas"),  # 7
]
DEFAULT = [DEFECTS[1], DEFECTS[4], ("ReorderedOutput", "rows")]
"""~15-25 s each: by default the ones whose semantics are Spark's own (nanosecond frames in the session time
zone, watermarks and late rows, output Rows taken by field name); every defect runs cheaply through TwsTester
in test_tws_pyspark_semantics.py."""
MATRIX = [(name, flavour) for name in CASES for flavour in ("rows", "pandas")]


def parity(
    spark: Any, tmp_path: Path, name: str, flavour: str, conf: dict[str, str] | None = None
) -> dict[int, list[tuple[Any, ...]]]:
    """Run case `name` in `flavour` on PySpark's operator and on ours (with the session settings `conf` too);
    assert every batch's output is the same; return PySpark's outputs per batch."""
    factory, time_mode, watermark, with_initial = CASES[name]
    use_pandas = flavour == "pandas"
    output = type(factory(use_pandas)).OUTPUT
    inputs = tmp_path / "in"
    _write_files(inputs)

    def stream() -> Any:
        df = spark.readStream.schema(p.INPUT).option("maxFilesPerTrigger", 1).parquet(str(inputs))
        return df.withWatermark("eventTime", "5 seconds") if watermark else df

    initial = spark.createDataFrame(SEEDS, SEED_SCHEMA).groupBy("id") if with_initial else None
    before = {key: spark.conf.get(key, None) for key in conf or {}}
    for key, value in {**CONF, **(conf or {})}.items():
        spark.conf.set(key, value)
    try:
        expected = _Collect(PAUSE_S.get(name, 0.0))
        grouped = stream().groupBy("id")
        tws = grouped.transformWithStateInPandas if use_pandas else grouped.transformWithState
        query = tws(factory(use_pandas), output, "Append", time_mode, initialState=initial)
        checkpoint = str(tmp_path / "ref-ckpt")
        _run(
            query.writeStream.foreachBatch(expected)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        got = _Collect(PAUSE_S.get(name, 0.0))
        op = StatefulOperator(
            (tmp_path / "state").as_uri(),
            name.lower(),
            key="id",
            processor=factory(use_pandas),  # the same processor class, unchanged
            output_schema=output,
            input_format=flavour,
            time_mode=time_mode,
            num_partitions=1,  # every key in one partition: pandas frames of later keys start mid-chunk
            initial_state=initial,
            sink=got,
        )
        _run(op.start(stream(), str(tmp_path / "ckpt"), trigger={"availableNow": True}))
    finally:
        for key in CONF:
            spark.conf.unset(key)
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
    assert sorted(expected.batches) == list(range(len(FILES)))
    for b in range(len(FILES)):
        assert got.batches.get(b) == expected.batches[b], f"{name} ({flavour}) batch {b}"
    return expected.batches


@pytest.mark.parametrize(("name", "flavour"), DEFAULT)
def test_defect_processors_match_pyspark(spark: Any, tmp_path: Path, name: str, flavour: str) -> None:
    outputs = parity(spark, tmp_path, name, flavour)
    if name == "LateRowsProcessingTime":  # batch 3's late row reaches the processor: id "1" has 5 rows
        assert ("1", 5) in outputs[3]
    if name == "EventTimeMax":  # seconds since the epoch, not microseconds
        assert ("0", str(int(T0.timestamp()) + 1)) in outputs[0]


@pytest.mark.parametrize("flavour", ["rows", "pandas"])
def test_output_timestamps_keep_their_instant_in_a_session_time_zone_like_pyspark(
    spark: Any, tmp_path: Path, flavour: str
) -> None:
    """ChainingOps hands each key's first event time back unchanged, in a session time zone other than UTC: naive
    in a pandas frame, a wall time in that zone, which PySpark takes in the zone again (statekeeper took it as UTC)."""
    outputs = parity(spark, tmp_path, "ChainingOps", flavour, LOS_ANGELES)
    assert ("0", dt.datetime.fromtimestamp(T0.timestamp())) in outputs[0]  # the first row's; collected as local time


@pytest.mark.parametrize("flavour", ["rows", "pandas"])
def test_initial_state_timestamps_are_in_the_session_time_zone_like_pyspark(
    spark: Any, tmp_path: Path, flavour: str
) -> None:
    """handleInitialState reads a timestamp of the initial state as it reads the input's: in the session time zone
    (statekeeper handed a Row the driver's UTC datetimes)."""
    outputs = parity(spark, tmp_path, "InitialStateTime", flavour, LOS_ANGELES)
    seen = "2023-12-31 16:00:03-08:00" if flavour == "rows" else "2023-12-31 16:00:03"
    assert outputs[0] == [("0", f"('0',) {seen}")]


@pytest.mark.parametrize("flavour", ["rows", "pandas"])
def test_timer_keys_are_rows_like_pyspark(spark: Any, tmp_path: Path, flavour: str) -> None:
    """handleExpiredTimer gets its key as a Row of the key columns (statekeeper handed it a plain tuple)."""
    outputs = parity(spark, tmp_path, "TimerKeys", flavour)
    assert ("0-expired", "Row(id='0') {'id': '0'}") in outputs[0]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "flavour"), [d for d in DEFECTS if d not in DEFAULT])
def test_other_defect_processors_match_pyspark(spark: Any, tmp_path: Path, name: str, flavour: str) -> None:
    parity(spark, tmp_path, name, flavour)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "flavour"), MATRIX)
def test_matrix_matches_pyspark(spark: Any, tmp_path: Path, name: str, flavour: str) -> None:
    parity(spark, tmp_path, name, flavour)


def _start(engine: str, stream: Any, processor: Any, flavour: str, tmp_path: Path, sink: _Collect) -> Any:
    """`processor` over `stream` on PySpark's operator or statekeeper's (time mode None, Append), into `sink`."""
    ckpt = str(tmp_path / f"{engine}-ckpt")
    output = type(processor).OUTPUT
    if engine == "pyspark":
        grouped = stream.groupBy("id")
        tws = grouped.transformWithStateInPandas if flavour == "pandas" else grouped.transformWithState
        df = tws(processor, output, "Append", "None")
        return df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).trigger(availableNow=True).start()
    op = StatefulOperator(
        (tmp_path / "state").as_uri(),
        type(processor).__name__.lower(),
        key="id",
        processor=processor,
        output_schema=output,
        input_format=flavour,
        num_partitions=1,
        sink=sink,
    )
    return op.start(stream, ckpt, trigger={"availableNow": True})


@pytest.mark.parametrize("flavour", ["rows", "pandas"])
def test_avro_state_encoding_refuses_non_nullable_fields_like_pyspark(spark: Any, tmp_path: Path, flavour: str) -> None:
    """With spark.sql.streaming.stateStore.encodingFormat=avro, both operators fail the query at the declaration
    of a state schema with a non-nullable field, with Spark's error class."""
    inputs = tmp_path / "in"
    _write_files(inputs)
    use_pandas = flavour == "pandas"
    messages = []
    spark.conf.set("spark.sql.streaming.stateStore.encodingFormat", "avro")
    try:
        for engine in ("pyspark", "statekeeper"):
            stream = spark.readStream.schema(p.INPUT).option("maxFilesPerTrigger", 1).parquet(str(inputs))
            processor = p.NotNullableState(use_pandas)
            query = _start(engine, stream, processor, flavour, tmp_path, _Collect())
            with pytest.raises(Exception) as e:
                _run(query)
            messages.append(str(e.value))
    finally:
        spark.conf.unset("spark.sql.streaming.stateStore.encodingFormat")
    for message in messages:
        assert "[TRANSFORM_WITH_STATE_SCHEMA_MUST_BE_NULLABLE]" in message
        assert "column family state must be nullable" in message


def test_pandas_frame_dtypes_are_inferred_per_frame_like_pyspark(spark: Any, tmp_path: Path) -> None:
    """Narrow integers and floats: each frame's dtypes as PySpark's operator gives them (int64, float64: it
    boxes every value as a Python int / float); an integer column with a null in every key: float64. (Where only
    some keys have nulls, PySpark's dtype follows which keys share its Arrow batches.)"""
    inputs = tmp_path / "in"
    inputs.mkdir()
    table = pa.table(
        {
            "id": ["a", "a", "b", "c"],
            "small": pa.array([1, 2, 3, 4], pa.int16()),
            "n": pa.array([1, None, None, None], pa.int32()),
            "ratio": pa.array([1.5, 2.0, 3.0, 4.5], pa.float32()),
            "flag": pa.array([True, False, False, True]),
        }
    )
    pq.write_table(table, inputs / "part-00000.parquet")
    schema = "id string, small short, n int, ratio float, flag boolean"
    outputs = []
    for key, value in CONF.items():
        spark.conf.set(key, value)
    for engine in ("pyspark", "statekeeper"):
        stream = spark.readStream.schema(schema).parquet(str(inputs))
        sink = _Collect()
        query = _start(engine, stream, p.FrameDtypes(True), "pandas", tmp_path, sink)
        _run(query)
        outputs.append(sink.batches)
    for key in CONF:
        spark.conf.unset(key)
    assert outputs[0] == outputs[1]
    assert ("b", "small:int64:3,n:float64:nan,ratio:float64:3.0,flag:bool:False") in outputs[1][0]
