"""Moving over (issue 64, part I): a query runs N batches on Spark's own stateful operator, its state is
imported (store/spark/spark_import.py), the statekeeper query continues M batches from a copy of the Spark
checkpoint's progress, and its final state and its outputs equal Spark's operator running all N + M batches.

Flavours: ``groupBy().agg()`` (count, sum), ``applyInPandasWithState`` and ``transformWithStateInPandas``
(ValueState, ListState, MapState). An import whose partition fails commits nothing and runs again. Timers,
the watermark and TTL'd state: test_spark_import_time.py.
"""

from __future__ import annotations

import contextlib
import io
import json
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


def _tws_processor(ttl_ms: int | None = None) -> Any:
    """`ttl_ms`: every variable with that TTL (a list appended to while it holds 10 values or fewer, so its
    elements written in different batches expire apart)."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor as PySparkProcessor

    ttl = () if ttl_ms is None else (ttl_ms,)

    class Recent(PySparkProcessor):
        """PySpark's own processor, run unchanged by both: a total, the last 10 values and counts by value % 3."""

        def init(self, handle: Any) -> None:
            self.total = handle.getValueState("total", "n long, s long", *ttl)
            self.recent = handle.getListState("recent", "v long", *ttl)
            self.buckets = handle.getMapState("buckets", "b int", "c long", *ttl)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[pd.DataFrame]:
            n, s = self.total.get() or (0, 0)
            before = [r[0] for r in self.recent.get()]
            new: list[int] = []
            for pdf in rows:
                for v in pdf["value"]:
                    n, s = n + 1, s + int(v)
                    new.append(int(v))
                    b = int(v) % 3
                    c = self.buckets.getValue((b,)) if self.buckets.containsKey((b,)) else (0,)
                    self.buckets.updateValue((b,), (c[0] + 1,))
            self.total.update((n, s))
            if len(before) + len(new) <= 10:
                self.recent.appendList([(v,) for v in new])
            else:
                self.recent.put([(v,) for v in [*before, *new][-10:]])
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


class AggsLike(StatefulProcessor):
    """What ``agg(count("*"), sum("value"), avg("value"))`` keeps: Spark's buffer ``count, sum, sum, count``, imported
    with its repeated names made unique by position."""

    def init(self, handle: Any) -> None:
        self.agg = handle.getValueState("agg", "count long, sum long, sum_2 double, count_3 long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[tuple[Any, ...]]:
        n, s, avg_sum, avg_n = self.agg.get() or (0, 0, 0.0, 0)
        for r in rows:
            n, s, avg_sum, avg_n = n + 1, s + r["value"], avg_sum + r["value"], avg_n + 1
        self.agg.update((n, s, avg_sum, avg_n))
        yield (key[0], n, s, avg_sum / avg_n)


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


def _aggs(df: Any) -> Any:
    from pyspark.sql import functions as sf

    return df.groupBy("user").agg(sf.count("*").alias("n"), sf.sum("value").alias("s"), sf.avg("value").alias("a"))


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
    "aggregations": Flavour(
        "aggregations",
        _aggs,
        lambda root, sink: StatefulOperator(
            root, "op", "user", AggsLike(), f"{OUT}, a double", num_partitions=2, sink=sink
        ),
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


@contextlib.contextmanager
def rocksdb_provider(spark: Any) -> Iterator[Any]:
    """Spark's operators on its RocksDB state store provider (what a months-old job most likely runs on)."""
    key = "spark.sql.streaming.stateStore.providerClass"
    before = spark.conf.get(key, None)
    spark.conf.set(key, "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
    try:
        yield spark
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


@pytest.fixture
def spark_rocksdb(spark: Any) -> Iterator[Any]:
    with rocksdb_provider(spark) as session:
        yield session


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


def test_several_aggregations_with_repeated_buffer_names_move_over(spark_rocksdb: Any, tmp_path: Path) -> None:
    """count(*), sum and avg buffer as ``count, sum, sum, count``: imported (not refused as duplicate fields)."""
    move_over(spark_rocksdb, tmp_path, FLAVOURS["aggregations"])


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


def test_an_earlier_batch_with_a_continuation_is_refused_before_any_job(spark: Any, tmp_path: Path) -> None:
    """The copied progress continues after the last committed batch: with the state of an earlier one the
    statekeeper query would skip the batches between (it failed only at its first batch, after the import)."""
    ckpt = tmp_path / "spark-ckpt"
    (ckpt / "commits").mkdir(parents=True)
    for name in ("0", "1", ".1.crc", "²"):  # "²" passes str.isdigit(), not int()
        (ckpt / "commits" / name).write_text("v1\n{}")
    root, continued = (tmp_path / "state").as_uri(), tmp_path / "continued"
    with pytest.raises(ConfigurationError, match=r"batch_id 0 with a continuation.*committed batches up to 1"):
        import_spark_state(spark, str(ckpt), root, "op", batch_id=0, continuation_checkpoint=str(continued))
    assert not continued.exists() and not (tmp_path / "state").exists()


def test_a_hostile_progress_tree_is_refused_and_a_failed_copy_commits_nothing(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A symlink in the Spark checkpoint's progress is refused before any job (its target was copied into the
    continuation, and an unreadable one failed the copy after the commit, leaving a root that refuses a rerun).
    The copy comes before the commit record: a copy that fails is removed, and the import runs again."""
    from statekeeper.store.spark.spark_checkpoint import CheckpointFiles

    all_dir, input_dir, spark_ckpt = tmp_path / "all", tmp_path / "in", tmp_path / "spark-ckpt"
    write_inputs(all_dir, files=2, rows=40, keys=5, seed=3)
    stage_files(all_dir, input_dir, range(2))
    run_spark(spark, FLAVOURS["aggregation"], input_dir, spark_ckpt, CollectingSink())
    secret = tmp_path / "elsewhere"
    secret.mkdir()
    (secret / "credentials").write_text("not Spark's")
    (spark_ckpt / "offsets" / "evil").symlink_to(secret)
    root, continued = (tmp_path / "state").as_uri(), tmp_path / "continued"
    with pytest.raises(ConfigurationError, match="offsets/evil', a symlink"):
        import_spark_state(spark, str(spark_ckpt), root, "op", continuation_checkpoint=str(continued))
    assert not continued.exists() and not (tmp_path / "state").exists()
    (spark_ckpt / "offsets" / "evil").unlink()

    copy = CheckpointFiles.copy_progress

    def half_then_fail(self: Any, target: Any, files: list[str]) -> None:
        copy(self, target, files[: len(files) // 2])
        raise OSError("injected: the copy stopped half way")

    monkeypatch.setattr(CheckpointFiles, "copy_progress", half_then_fail)
    with pytest.raises(SparkImportError, match=r"nothing was committed.*half way"):
        import_spark_state(spark, str(spark_ckpt), root, "op", continuation_checkpoint=str(continued))
    assert CommitLog(open_file_manager(root)).latest() == 0
    assert not continued.exists() or not list(continued.iterdir())
    monkeypatch.undo()

    def no_commit(*args: Any, **kwargs: Any) -> None:
        raise OSError("injected: the commit record was not written")

    monkeypatch.setattr("statekeeper.store.spark.spark_import.BatchRecords.commit", no_commit)
    with pytest.raises(OSError, match="commit record was not written"):
        import_spark_state(spark, str(spark_ckpt), root, "op", continuation_checkpoint=str(continued))
    assert CommitLog(open_file_manager(root)).latest() == 0
    assert not continued.exists() or not list(continued.iterdir()), "the copy goes with the failed commit"
    monkeypatch.undo()
    done = import_spark_state(spark, str(spark_ckpt), root, "op", continuation_checkpoint=str(continued))
    assert done.batch_id == 1 and CommitLog(open_file_manager(root)).latest() == 1
    copied = sorted(str(p.relative_to(continued)) for p in continued.rglob("*") if p.is_file() and p.suffix != ".crc")
    assert copied == ["commits/0", "commits/1", "metadata", "offsets/0", "offsets/1", "sources/0/0", "sources/0/1"]


def test_a_window_key_is_refused_at_the_start_naming_the_column(spark: Any, tmp_path: Path) -> None:
    """``groupBy(window(...), "user")`` keys its state by a struct, which the import does not take: refused before
    the job (it failed in every task of the job)."""
    from pyspark.sql import functions as sf

    all_dir, input_dir, spark_ckpt = tmp_path / "all", tmp_path / "in", tmp_path / "spark-ckpt"
    write_inputs(all_dir, files=1, rows=40, keys=5, seed=3)
    stage_files(all_dir, input_dir, range(1))
    windowed = Flavour(
        "window",
        lambda df: df.groupBy(sf.window(sf.timestamp_millis("value"), "10 minutes"), "user").agg(sf.count("*")),
        FLAVOURS["aggregation"].statekeeper,
        {"agg": None},
    )
    run_spark(spark, windowed, input_dir, spark_ckpt, CollectingSink())
    root = (tmp_path / "state").as_uri()
    with pytest.raises(ConfigurationError, match=r"key column 'window' .* is a struct<start:timestamp,end:timestamp>"):
        import_spark_state(spark, str(spark_ckpt), root, "op")
    assert not (tmp_path / "state").exists()


def test_a_continuation_of_a_query_with_another_stateful_operator_is_refused(spark: Any, tmp_path: Path) -> None:
    """``dropDuplicates`` before the aggregation: its state is not imported, and the continuation (no ``state/``)
    failed only when the statekeeper query started (STREAMING_STATEFUL_OPERATOR_MISSING_STATE_DIRECTORY)."""
    from pyspark.sql import functions as sf

    all_dir, input_dir, spark_ckpt = tmp_path / "all", tmp_path / "in", tmp_path / "spark-ckpt"
    write_inputs(all_dir, files=1, rows=40, keys=5, seed=3)
    stage_files(all_dir, input_dir, range(1))
    two = Flavour(
        "dedupe+agg",
        lambda df: df.dropDuplicates(["user", "value"]).groupBy("user").agg(sf.count("*")),
        FLAVOURS["aggregation"].statekeeper,
        {"agg": None},
    )
    run_spark(spark, two, input_dir, spark_ckpt, CollectingSink())
    root, continued = (tmp_path / "state").as_uri(), tmp_path / "continued"
    with pytest.raises(ConfigurationError, match=r"besides 0 \(stateStoreSave\): 1 \(dedupe\)"):
        import_spark_state(spark, str(spark_ckpt), root, "op", continuation_checkpoint=str(continued))
    assert not continued.exists() and not (tmp_path / "state").exists()
    assert import_spark_state(spark, str(spark_ckpt), root, "op").keys == 5  # the state alone: imported


def test_what_spark_cannot_read_of_a_checkpoint_and_a_bad_state_name_are_named_at_the_start(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A malformed operator metadata or commit log failed with Spark's Py4J stack trace (the command line's too);
    a stray directory in ``state/`` makes Spark's state-metadata source list no operator, which the error says; a
    `state_name` statekeeper refuses is refused before the job."""
    import shutil

    from statekeeper.store.errors import CorruptFileError

    all_dir, input_dir, good = tmp_path / "all", tmp_path / "in", tmp_path / "good"
    write_inputs(all_dir, files=2, rows=40, keys=5, seed=3)
    stage_files(all_dir, input_dir, range(2))
    run_spark(spark, FLAVOURS["aggregation"], input_dir, good, CollectingSink())

    def broken(name: str, path: str, content: str | None) -> str:
        ckpt = tmp_path / name
        shutil.copytree(good, ckpt)
        if content is None:
            (ckpt / path).mkdir()
        else:
            (ckpt / path).write_text(content)
        return str(ckpt)

    metadata = broken("metadata", "state/0/_metadata/metadata", "v1\n{not json")
    with pytest.raises(CorruptFileError, match=r"cannot read operator 0: .*JsonParseException.*metadata"):
        import_spark_state(spark, metadata, (tmp_path / "s1").as_uri(), "op")
    commit = broken("commit", "commits/1", "garbage")
    with pytest.raises(CorruptFileError, match=r"commits/1. \[MALFORMED_LOG_FILE\]"):
        import_spark_state(spark, commit, (tmp_path / "s2").as_uri(), "op")
    stray = broken("stray", "state/7", None)
    with pytest.raises(ConfigurationError, match=r"no stateful operator 0 \(.* lists none; state/ holds \['0', '7'\]"):
        import_spark_state(spark, stray, (tmp_path / "s3").as_uri(), "op")
    with pytest.raises(ConfigurationError, match="invalid state variable name '__agg'"):  # failed in every task
        import_spark_state(spark, str(good), (tmp_path / "s5").as_uri(), "op", state_name="__agg")
    assert not (tmp_path / "s5").exists()
    argv = ["import-spark-state", "--spark-checkpoint", metadata, "--root", (tmp_path / "s4").as_uri()]
    assert cli_main([*argv, "--operator", "op"]) != 0
    assert "JsonParseException" in capsys.readouterr().err


def test_a_continuation_occupied_during_the_import_keeps_what_occupies_it(spark: Any, tmp_path: Path) -> None:
    """Checked empty before the job, written by another import since: the copy is refused, and what the other
    import copied stays (only a copy of this import's own is removed when it fails)."""
    from statekeeper.store.spark.spark_import import _Continuation

    ckpt, continued = tmp_path / "spark-ckpt", tmp_path / "continued"
    (ckpt / "offsets").mkdir(parents=True)
    (ckpt / "offsets" / "0").write_text("v1\n{}")
    continuation = _Continuation(str(continued), ["offsets/0"])
    (continued / "offsets").mkdir(parents=True)
    (continued / "offsets" / "0").write_text("the other import's")
    with pytest.raises(ConfigurationError, match="is not empty"):
        continuation.copy_progress_from(spark, str(ckpt))
    assert (continued / "offsets" / "0").read_text() == "the other import's"
