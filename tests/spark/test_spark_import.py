"""Moving over (issue 64, part I): a query runs N batches on Spark's own stateful operator, its state is
imported (store/spark/spark_import.py), the statekeeper query continues M batches from a copy of the Spark
checkpoint's progress, and its final state and its outputs equal Spark's operator running all N + M batches.

Flavours: ``groupBy().agg()`` (count, sum), ``applyInPandasWithState`` and ``transformWithStateInPandas``
(ValueState, ListState, MapState; with a TTL; with processing-time and event-time timers, the watermark
carried over). An import whose partition fails commits nothing and runs again.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd  # type: ignore[import-untyped]
import pytest

from statekeeper.maintenance.cli import main as cli_main
from statekeeper.store import CommitLog, open_file_manager
from statekeeper.store.errors import ConfigurationError
from statekeeper.store.layout import StoreId
from statekeeper.store.spark import ApplyInPandasWithState, StatefulOperator, StatefulProcessor, read_state
from statekeeper.store.spark.spark_import import SparkImportError, import_spark_state
from tests.spark.helpers import SCHEMA, CollectingSink, stage_files, write_inputs

N, M = 3, 2
OUT = "user string, n long, s long"


# -- the operators, on Spark and on statekeeper --------------------------------------------------------
def count_sum(key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """An applyInPandasWithState function: rows and total of `value` per user."""
    n, s = state.get if state.exists else (0, 0)
    for pdf in pdfs:
        n += len(pdf)
        s += int(pdf["value"].sum())
    state.update((n, s))
    yield pd.DataFrame({"user": [key[0]], "n": [n], "s": [s]})


def _tws_processor() -> Any:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor as PySparkProcessor

    class Recent(PySparkProcessor):
        """PySpark's own processor, run unchanged by both: a total, the last 3 values and counts by value % 3."""

        def init(self, handle: Any) -> None:
            self.total = handle.getValueState("total", "n long, s long")
            self.recent = handle.getListState("recent", "v long")
            self.buckets = handle.getMapState("buckets", "b int", "c long")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[pd.DataFrame]:
            n, s = self.total.get() or (0, 0)
            recent = [r[0] for r in self.recent.get()]
            for pdf in rows:
                for v in pdf["value"]:
                    n, s = n + 1, s + int(v)
                    recent = [*recent, int(v)][-3:]
                    b = int(v) % 3
                    c = self.buckets.getValue((b,)) if self.buckets.containsKey((b,)) else (0,)
                    self.buckets.updateValue((b,), (c[0] + 1,))
            self.total.update((n, s))
            self.recent.put([(v,) for v in recent])
            yield pd.DataFrame({"user": [key[0]], "n": [n], "s": [s]})

        def close(self) -> None:
            pass

    return Recent()


class AggLike(StatefulProcessor):
    """What ``groupBy("user").agg(count("*"), sum("value"))`` keeps, on the imported buffer ``agg``."""

    def init(self, handle: Any) -> None:
        self.agg = handle.getValueState("agg", "count long, sum long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[tuple[Any, ...]]:
        n, s = self.agg.get() or (0, 0)
        for r in rows:
            n, s = n + 1, s + r["value"]
        self.agg.update((n, s))
        yield (key[0], n, s)


@dataclass(frozen=True)
class Flavour:
    name: str
    spark_output: Callable[[Any], Any]
    """The Spark query's output DataFrame from its input stream."""
    statekeeper: Callable[[str, CollectingSink], StatefulOperator]
    variables: dict[str, str | None]
    """Statekeeper variable -> Spark's stateVarName (None: the operator's single state)."""


def _agg(df: Any) -> Any:
    from pyspark.sql import functions as sf

    return df.groupBy("user").agg(sf.count("*").alias("n"), sf.sum("value").alias("s"))


def _group_state(df: Any) -> Any:
    from pyspark.sql.streaming.state import GroupStateTimeout

    return df.groupBy("user").applyInPandasWithState(
        count_sum, OUT, "n long, s long", "Update", GroupStateTimeout.NoTimeout
    )


def _tws(df: Any) -> Any:
    return df.groupBy("user").transformWithStateInPandas(_tws_processor(), OUT, "Update", "None")


FLAVOURS = {
    "aggregation": Flavour(
        "aggregation",
        _agg,
        lambda root, sink: StatefulOperator(root, "op", "user", AggLike(), OUT, num_partitions=2, sink=sink),
        {"agg": None},
    ),
    "applyInPandasWithState": Flavour(
        "applyInPandasWithState",
        _group_state,
        lambda root, sink: StatefulOperator(
            root,
            "op",
            "user",
            ApplyInPandasWithState(count_sum),
            OUT,
            num_partitions=2,
            input_format="pandas",
            sink=sink,
        ),
        {"group_state": None},
    ),
    "transformWithStateInPandas": Flavour(
        "transformWithStateInPandas",
        _tws,
        lambda root, sink: StatefulOperator(
            root,
            "op",
            "user",
            _tws_processor(),
            OUT,
            num_partitions=3,
            input_format="pandas",
            sink=sink,
            time_mode="None",
        ),
        {"total": "total", "recent": "recent", "buckets": "buckets"},
    ),
}


# -- running the queries ----------------------------------------------------------------------------
def _stream(spark: Any, input_dir: Path) -> Any:
    return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(input_dir))


def _await(query: Any) -> None:
    try:
        assert query.awaitTermination(240), "query did not finish in time"
        if query.exception() is not None:
            raise AssertionError(f"query failed: {query.exception()}")
    finally:
        query.stop()


def run_spark(spark: Any, flavour: Flavour, input_dir: Path, checkpoint: Path, sink: CollectingSink) -> None:
    """Spark's own operator on the RocksDB state store; each batch's output to `sink`."""
    out = flavour.spark_output(_stream(spark, input_dir))
    writer = out.writeStream.outputMode("update").foreachBatch(sink).option("checkpointLocation", str(checkpoint))
    _await(writer.trigger(availableNow=True).start())


def run_statekeeper(spark: Any, op: StatefulOperator, input_dir: Path, checkpoint: Path) -> None:
    _await(op.start(_stream(spark, input_dir), str(checkpoint), trigger={"availableNow": True}))


def _plain(value: Any) -> Any:
    """Rows, lists and maps as comparable Python values (a TTL'd value as Spark reads it: its value)."""
    if hasattr(value, "asDict") and list(value.__fields__) == ["value", "ttlExpirationMs"]:
        return _plain(value["value"])
    if hasattr(value, "asDict"):
        return tuple(_plain(v) for v in value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return sorted((_plain(k), _plain(v)) for k, v in value.items())
    return value


def _value_column(df: Any) -> str:
    return next(c for c in ("value", "list_value", "map_value") if c in df.columns)


def spark_state(spark: Any, checkpoint: Path, var: str | None) -> dict[Any, Any]:
    reader = spark.read.format("statestore").option("flattenCollectionTypes", "false")
    if var is not None:
        reader = reader.option("stateVarName", var)
    df = reader.load(str(checkpoint))
    column = _value_column(df)
    value = (lambda v: v[0]) if var is None and "groupState" in df.schema[column].dataType.fieldNames() else None
    return {_plain(r["key"]): _plain(value(r[column]) if value else r[column]) for r in df.collect()}


def statekeeper_state(spark: Any, root: str, var: str) -> dict[Any, Any]:
    df = read_state(spark, root, "op", stateVarName=var, flattenCollectionTypes=False)
    column = _value_column(df)
    return {_plain(r["key"]): _plain(r[column]) for r in df.collect()}


def _outputs(sink: CollectingSink, batches: range) -> dict[int, list[tuple[Any, ...]]]:
    return {b: sorted(sink.batches.get(b, [])) for b in batches}


@pytest.fixture
def spark_rocksdb(spark: Any) -> Iterator[Any]:
    """Spark's operators on its RocksDB state store provider (what a months-old job most likely runs on)."""
    key = "spark.sql.streaming.stateStore.providerClass"
    before = spark.conf.get(key, None)
    spark.conf.set(key, "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
    yield spark
    if before is None:
        spark.conf.unset(key)
    else:
        spark.conf.set(key, before)


def move_over(
    spark: Any,
    tmp_path: Path,
    flavour: Flavour,
    *,
    fail_first: bool = False,
    via_cli: bool = False,
    before_continuing: Callable[[Any, Path, str], None] | None = None,
) -> None:
    """N batches on Spark, import, M more on statekeeper beside M more on Spark; both agree (`before_continuing`
    checks more of the import: the Spark checkpoint and the root)."""
    all_dir, input_dir = tmp_path / "all", tmp_path / "in"
    write_inputs(all_dir, files=N + M, rows=120, keys=40, seed=11)
    stage_files(all_dir, input_dir, range(N))
    spark_ckpt, continued = tmp_path / "spark-ckpt", tmp_path / "statekeeper-ckpt"
    spark_sink = CollectingSink()
    run_spark(spark, flavour, input_dir, spark_ckpt, spark_sink)
    assert sorted(spark_sink.batches) == list(range(N))

    root = (tmp_path / "state").as_uri()
    if fail_first:  # one partition's changelog never uploads: the job fails, nothing is committed
        with pytest.raises(SparkImportError, match="nothing was committed"):
            import_spark_state(
                spark,
                str(spark_ckpt),
                root,
                "op",
                num_partitions=2,
                continuation_checkpoint=str(continued),
                file_manager_factory=FailingPartition(1),
            )
        assert CommitLog(open_file_manager(root)).latest() == 0
        assert not continued.exists(), "a failed import must not prepare the continuation"
    if via_cli:
        out = io.StringIO()
        argv = ["import-spark-state", "--spark-checkpoint", str(spark_ckpt), "--root", root, "--operator", "op"]
        with contextlib.redirect_stdout(out):
            code = cli_main([*argv, "--continuation-checkpoint", str(continued), "--json"])
        assert code == 0
        summary = json.loads(out.getvalue())
    else:
        lines: list[str] = []
        done = import_spark_state(
            spark, str(spark_ckpt), root, "op", continuation_checkpoint=str(continued), on_progress=lines.append
        )
        assert lines[-1] == done.summary()
        summary = done.to_dict()
    assert summary["batch_id"] == N - 1 and summary["version"] == 1
    assert summary["keys"] == len(spark_state(spark, spark_ckpt, next(iter(flavour.variables.values()))))
    assert summary["bytes"] > 0 and summary["rows"] >= summary["keys"]
    for var, spark_var in flavour.variables.items():
        assert statekeeper_state(spark, root, var) == spark_state(spark, spark_ckpt, spark_var), var
    if before_continuing is not None:
        before_continuing(spark, spark_ckpt, root)

    stage_files(all_dir, input_dir, range(N, N + M))
    sink = CollectingSink()
    run_statekeeper(spark, flavour.statekeeper(root, sink), input_dir, continued)
    run_spark(spark, flavour, input_dir, spark_ckpt, spark_sink)

    assert sorted(sink.batches) == list(range(N, N + M)), "the statekeeper query continues at batch N"
    assert _outputs(sink, range(N, N + M)) == _outputs(spark_sink, range(N, N + M))
    for var, spark_var in flavour.variables.items():
        assert statekeeper_state(spark, root, var) == spark_state(spark, spark_ckpt, spark_var), var


class FailingPartition:
    """A file manager factory whose uploads of partition `partition`'s changelogs always fail."""

    def __init__(self, partition: int) -> None:
        self.partition = partition

    def __call__(self, root: str) -> Any:
        return _FailingFM(open_file_manager(root), StoreId("op", self.partition).changelog_dir())

    def __reduce__(self) -> Any:
        return (FailingPartition, (self.partition,))


class _FailingFM:
    def __init__(self, inner: Any, changelogs: str) -> None:
        self.inner = inner
        self.changelogs = changelogs

    def put_file(self, local_path: str, path: str, *, exclusive: bool = True) -> int:
        if path.startswith(self.changelogs):
            raise OSError(f"injected upload failure of {path}")
        return int(self.inner.put_file(local_path, path, exclusive=exclusive))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_aggregation_moves_over_exactly_once_after_a_failed_import(spark_rocksdb: Any, tmp_path: Path) -> None:
    """The rerun goes through the command line (``statekeeper import-spark-state --json``)."""
    move_over(spark_rocksdb, tmp_path, FLAVOURS["aggregation"], fail_first=True, via_cli=True)


@pytest.mark.slow
@pytest.mark.parametrize("flavour", ["applyInPandasWithState", "transformWithStateInPandas"])
def test_stateful_functions_move_over_exactly_once(spark_rocksdb: Any, tmp_path: Path, flavour: str) -> None:
    move_over(spark_rocksdb, tmp_path, FLAVOURS[flavour])


def test_an_import_refuses_a_root_with_state_an_occupied_continuation_and_a_missing_checkpoint(
    spark: Any, tmp_path: Path
) -> None:
    """Each refusal comes before any job and writes nothing."""
    root = (tmp_path / "state").as_uri()
    missing = str(tmp_path / "no-such-checkpoint")
    with pytest.raises(ConfigurationError, match="no-such-checkpoint"):
        import_spark_state(spark, missing, root, "op")
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "offsets").mkdir()
    with pytest.raises(ConfigurationError, match="is not empty"):
        import_spark_state(spark, missing, root, "op", continuation_checkpoint=str(occupied))
    CommitLog(open_file_manager(root)).commit(1, {"op": ["0" * 32]})
    with pytest.raises(ConfigurationError, match="already holds committed state"):
        import_spark_state(spark, missing, root, "op")
    assert sorted(p.name for p in occupied.iterdir()) == ["offsets"]


def test_the_writer_stores_each_kind_and_the_timers_as_the_state_api_reads_them(tmp_path: Path) -> None:
    """No Spark: the rows a task gets (one per key and variable, timers on their own rows) written through the
    typed variables of a real store, then read back through the handle as a processor reads them."""
    import pyarrow as pa

    from statekeeper.store.formats.typed_schema import parse_ddl
    from statekeeper.store.spark.handle import StatefulProcessorHandle
    from statekeeper.store.spark.spark_checkpoint import TIMER_COL, VALUE_PREFIX, VAR_COL, SparkVariable
    from statekeeper.store.spark.spark_import import _StateWriter
    from statekeeper.store.spark.state import StateContext
    from statekeeper.store.state_store import StateStore, StoreConfig

    variables = (
        SparkVariable("total", "value", parse_ddl("n long, s long"), None, "total", "value"),
        SparkVariable("recent", "list", parse_ddl("v long"), None, "recent", "list_value"),
        SparkVariable("buckets", "map", parse_ddl("c long"), parse_ddl("b int"), "buckets", "map_value"),
    )
    struct = pa.struct([("n", pa.int64()), ("s", pa.int64())])
    rows = pa.table(
        {
            "user": ["a", "a", "a", "b", "b"],
            VAR_COL: pa.array([0, 1, 2, 0, -1], pa.int32()),
            f"{VALUE_PREFIX}0": pa.array([{"n": 2, "s": 7}, None, None, {"n": 1, "s": 3}, None], struct),
            f"{VALUE_PREFIX}1": pa.array(
                [None, [{"v": 3}, {"v": 4}], None, None, None], pa.list_(pa.struct([("v", pa.int64())]))
            ),
            f"{VALUE_PREFIX}2": pa.array(
                [None, None, [({"b": 0}, {"c": 5}), ({"b": 1}, {"c": 6})], None, None],
                pa.map_(pa.struct([("b", pa.int32())]), pa.struct([("c", pa.int64())])),
            ),
            TIMER_COL: pa.array([None, None, None, None, 1_000], pa.int64()),
        }
    )
    root = (tmp_path / "state").as_uri()
    store = StateStore(root, "op", 0, config=StoreConfig(local_dir=str(tmp_path / "w"))).load(0)
    key_schema = parse_ddl("user string")
    ctx = StateContext(store, 0, key_schema)
    writer = _StateWriter(variables, ("user",))
    writer.init(StatefulProcessorHandle(ctx))
    out = writer.handleBatch(rows, None)  # type: ignore[arg-type]
    assert out.to_pylist() == [{"keys": 2, "timers": 1}]
    assert ctx.save_rows_total() == 2 + 1 + 2  # two values, one list, two map entries
    done = store.commit()
    store.close()
    version = done.version
    CommitLog(open_file_manager(root)).commit(version, {"op": [done.checkpoint_id]})

    again = StateStore(root, "op", 0, config=StoreConfig(local_dir=str(tmp_path / "r"))).load(version)
    ctx = StateContext(again, 0, key_schema)
    handle = StatefulProcessorHandle(ctx)
    total, recent = handle.getValueState("total"), handle.getListState("recent")
    buckets = handle.getMapState("buckets")
    ctx.set_key(("a",))
    assert total.get() == (2, 7) and list(recent.get()) == [(3,), (4,)]
    assert dict(buckets.iterator()) == {(0,): (5,), (1,): (6,)}
    ctx.set_key(("b",))
    assert total.get() == (1, 3) and list(handle.listTimers()) == [1_000] and not recent.exists()
    again.close()


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
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor as PySparkProcessor

    class Expiring(PySparkProcessor):
        """`Recent`'s state, every variable with a TTL (the list rewritten whole: one expiry per list)."""

        def init(self, handle: Any) -> None:
            self.total = handle.getValueState("total", "n long, s long", TTL_MS)
            self.recent = handle.getListState("recent", "v long", TTL_MS)
            self.buckets = handle.getMapState("buckets", "b int", "c long", TTL_MS)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[pd.DataFrame]:
            n, s = self.total.get() or (0, 0)
            recent = [r[0] for r in self.recent.get()]
            for pdf in rows:
                for v in pdf["value"]:
                    n, s = n + 1, s + int(v)
                    recent = [*recent, int(v)][-3:]
                    b = int(v) % 3
                    c = self.buckets.getValue((b,)) if self.buckets.containsKey((b,)) else (0,)
                    self.buckets.updateValue((b,), (c[0] + 1,))
            self.total.update((n, s))
            self.recent.put([(v,) for v in recent])
            yield pd.DataFrame({"user": [key[0]], "n": [n], "s": [s]})

        def close(self) -> None:
            pass

    return Expiring()


def _expiring(df: Any, value: str, expiry: Any) -> list[tuple[Any, ...]]:
    """(key, [map key,] value, expiry ms) of each row of a flattened state read."""
    from pyspark.sql import functions as sf

    cols = [sf.col("key"), *([sf.col("user_map_key")] if "user_map_key" in df.columns else [])]
    rows = df.select(*cols, sf.col(value).alias("v"), expiry.alias("e")).collect()
    return sorted(tuple(_plain(x) for x in r) for r in rows)


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


def test_the_writer_keeps_spark_expiries_and_refuses_a_list_expiring_apart(tmp_path: Path) -> None:
    """No Spark: TTL'd rows as Spark's state data source gives them. A value past its expiry reads as gone, one
    before it as the value; a list whose elements expire at different times is refused, naming the variable."""
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
    with pytest.raises(ConfigurationError, match=r"'recent'.*different TTL expiries"):
        writer.handleBatch(rows([7_000, 8_000]), None)  # type: ignore[arg-type]
    writer.handleBatch(rows([7_000, 7_000]), None)  # type: ignore[arg-type]
    handle = StatefulProcessorHandle(ctx)
    total, recent = handle.getValueState("total"), handle.getListState("recent")
    ctx.now_ms = 6_000
    ctx.set_key(("a",))
    assert total.get() is None and list(recent.get()) == [(0,), (1,)]  # 5 s gone, 7 s not yet
    ctx.set_key(("b",))
    assert total.get() == (2,)
    ctx.now_ms = 7_000
    ctx.set_key(("a",))
    assert not recent.exists()
    store.close()
