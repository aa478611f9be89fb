"""Rescale at restart and rollback on real Spark (local[2]): output exactly once, state equal to a reference.

The query is stopped between stages and restarted with another ``num_partitions`` on the same Spark
checkpoint and state root: the driver re-lays out the committed state by key-group ranges before
the next batch, and every later batch routes rows to the partition owning their key group.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from statekeeper.maintenance.fanout import SparkEngine
from statekeeper.maintenance.offline_rescale import rescale
from statekeeper.store import CommitLog, StateStore, open_file_manager
from statekeeper.store.key_groups import group_at
from statekeeper.store.rescale import RescaleError, execute_rescale, plan_rescale, plan_rollback
from statekeeper.store.spark import StatefulOperator
from testkit.processors import CountSum
from tests.spark.helpers import CollectingSink, reference, run_query, stage_files, state_of, write_inputs

OUT = "user string, count long, total long"


def _owned_groups_only(root: str, operator: str) -> None:
    fm = open_file_manager(root)
    record = CommitLog(fm).get(CommitLog(fm).latest())
    assert record is not None
    layout = record.layouts[operator]
    for p in range(layout.partitions):
        lo, hi = layout.groups_of(p)
        with StateStore(root, operator, p) as s:
            s.load(record.version)
            for k, _ in s.items(cf="totals"):
                assert lo <= group_at(k) < hi


def test_rescale_at_restart_4_8_3_1_4(spark: Any, tmp_path: Path) -> None:
    batches = write_inputs(tmp_path / "all", files=5, rows=120, keys=40)
    root = (tmp_path / "state").as_uri()
    sink = CollectingSink()
    rescales = []
    for stage, n in enumerate((4, 8, 3, 1, 4)):
        stage_files(tmp_path / "all", tmp_path / "in", range(stage, stage + 1))
        op = StatefulOperator(root, "counts", "user", CountSum(), OUT, num_partitions=n, sink=sink)
        run_query(spark, op, tmp_path / "in", tmp_path / "ckpt")
        progress = op.recent_progress[-1]
        assert progress.num_partitions == n and progress.batch_id == stage
        if stage:
            assert progress.rescale is not None and progress.rescale["partitions"] == n
            rescales.append(progress.rescale)
        assert state_of(spark, root, "counts") == reference(batches[: stage + 1])
        assert progress.num_rows_total == len(reference(batches[: stage + 1])), "rows recounted after a rescale"
        _owned_groups_only(root, "counts")
    # each batch delivered once, with the running totals of the keys it touched
    assert sink.deliveries == [0, 1, 2, 3, 4]
    for b, batch in enumerate(batches):
        running = reference(batches[: b + 1])
        assert {r[0]: r[1:] for r in sink.batches[b]} == {u: running[u] for u, _ in batch}
    record = CommitLog(open_file_manager(root)).get(9)
    assert record is not None and record.batch == 4 and len(record.checkpoint_ids["counts"]) == 4
    assert all(r["moved_key_groups"] > 0 for r in rescales)
    assert all(r["bytes_written"] > 0 and r["bytes_read"] > 0 for r in rescales)
    custom = op.recent_progress[-1].state_operator_progress()["customMetrics"]
    assert custom["rescaleBytesWritten"] == rescales[-1]["bytes_written"] and custom["rescaleBytesRead"] > 0


def test_rescale_inside_the_first_batch_with_async_checkpoints(spark: Any, tmp_path: Path) -> None:
    """With asynchronous changelog uploads, the first batch after a restart on more partitions still builds
    every new partition before its own commit: the rescale's record (its new partitions' changelogs
    uploaded) precedes the batch's, the batch runs on the new layout, and the output is exactly once."""
    batches = write_inputs(tmp_path / "all", files=3, rows=150, keys=50)
    root = (tmp_path / "state").as_uri()
    sink = CollectingSink()
    for stage, n in enumerate((2, 2, 5)):
        stage_files(tmp_path / "all", tmp_path / "in", range(stage, stage + 1))
        op = StatefulOperator(
            root, "counts", "user", CountSum(), OUT, num_partitions=n, sink=sink, async_checkpoint=True
        )
        run_query(spark, op, tmp_path / "in", tmp_path / "ckpt")
    progress = op.recent_progress[-1]
    assert progress.rescale is not None and progress.rescale["partitions"] == 5 and progress.num_partitions == 5
    commits = CommitLog(open_file_manager(root))
    rescaled, batch = commits.get(progress.version - 1), commits.get(progress.version)
    assert rescaled is not None and rescaled.change == {"counts": "rescale"} and batch is not None
    assert len(batch.checkpoint_ids["counts"]) == 5 and batch.batch == 2
    assert sorted(sink.deliveries) == [0, 1, 2]
    assert state_of(spark, root, "counts") == reference(batches)
    _owned_groups_only(root, "counts")


def test_offline_rescale_on_spark_executors_then_restart(spark: Any, tmp_path: Path) -> None:
    """`statekeeper rescale --engine spark` of state no snapshot covers yet: the new partitions are built as one
    Spark job, each relayed from its sources' changelogs into a full-state changelog that its first load replays
    alone; the row count is recounted, and the query restarts on the new layout with every batch delivered once."""
    batches = write_inputs(tmp_path / "all", files=3, rows=150, keys=50)
    root = (tmp_path / "state").as_uri()
    sink = CollectingSink()
    stage_files(tmp_path / "all", tmp_path / "in", range(2))
    run_query(
        spark,
        StatefulOperator(root, "counts", "user", CountSum(), OUT, num_partitions=3, sink=sink),
        tmp_path / "in",
        tmp_path / "ckpt",
    )
    result = rescale(open_file_manager(root), "counts", 5, idle_seconds=0.0, engine=SparkEngine(), workers=1)
    assert result.committed and len(result.checkpoint_ids) == 5 and result.relayed == 5
    record = CommitLog(open_file_manager(root)).get(result.plan.new_version)
    assert record is not None and not record.in_place.get("counts")
    assert state_of(spark, root, "counts") == reference(batches[:2])
    for p, cid in enumerate(result.checkpoint_ids):
        with StateStore(root, "counts", p) as s:
            s.load(result.plan.new_version)
            assert s.last_plan is not None and s.last_plan.replay == ((result.plan.new_version, cid),)
            assert s.last_plan.manifest_path() is None
    _owned_groups_only(root, "counts")
    stage_files(tmp_path / "all", tmp_path / "in", range(2, 3))
    op = StatefulOperator(root, "counts", "user", CountSum(), OUT, num_partitions=5, sink=sink)
    run_query(spark, op, tmp_path / "in", tmp_path / "ckpt")
    assert op.recent_progress[-1].rescale is None and op.recent_progress[-1].num_partitions == 5
    assert op.recent_progress[-1].num_rows_total == len(reference(batches)), "rows recounted by the rescale"
    assert sorted(sink.deliveries) == [0, 1, 2]
    assert state_of(spark, root, "counts") == reference(batches)


def test_rollback_then_restart_recomputes_the_rolled_back_history(spark: Any, tmp_path: Path) -> None:
    """docs/rescale.md's procedure: rollback to version 2, drop Spark's batches >= 2, restart: batches 2
    and 3 run again on the rolled-back state and the output equals the reference."""
    batches = write_inputs(tmp_path / "all", files=4, rows=100, keys=30)
    root = (tmp_path / "state").as_uri()
    stage_files(tmp_path / "all", tmp_path / "in", range(4))
    op = StatefulOperator(root, "counts", "user", CountSum(), OUT, num_partitions=3)
    run_query(spark, op, tmp_path / "in", tmp_path / "ckpt")
    assert state_of(spark, root, "counts") == reference(batches)
    fm = open_file_manager(root)
    result = execute_rescale(fm, plan_rollback(fm, "counts", 2))
    assert result.committed and result.plan.new_version == 5
    assert state_of(spark, root, "counts") == reference(batches[:2])
    assert state_of(spark, root, "counts", version=4) == reference(batches)  # still readable
    for sub in ("offsets", "commits"):
        for b in (2, 3):
            (tmp_path / "ckpt" / sub / str(b)).unlink()
            (tmp_path / "ckpt" / sub / f".{b}.crc").unlink(missing_ok=True)  # Hadoop's checksum file
    sink = CollectingSink()
    op = StatefulOperator(root, "counts", "user", CountSum(), OUT, num_partitions=3, sink=sink)
    run_query(spark, op, tmp_path / "in", tmp_path / "ckpt")
    # Spark's file source re-plans from its own log: files 2 and 3 may come as one batch 2
    assert min(sink.batches) == 2
    expected = reference(batches)
    assert state_of(spark, root, "counts") == expected
    assert sink.latest_per_key() == {u: expected[u] for u, _ in batches[2] + batches[3]}


def test_spark_computes_the_key_group_python_stores(spark: Any) -> None:
    """Routing agrees with the stored key group, and Spark's stored key (an import's) with `encode_gk`'s, for every
    supported key type, nulls and NUL bytes included."""
    import datetime
    import zlib

    from pyspark.sql import functions as sf

    from statekeeper.store.formats.typed_keys import KeyCodec, stored_key_encoder
    from statekeeper.store.formats.typed_schema import Field, from_arrow, struct
    from statekeeper.store.spark.routing import key_group_sql, stored_key_column

    epoch = datetime.datetime(1965, 1, 1, tzinfo=datetime.UTC)
    rows: list[tuple[Any, ...]] = [
        (
            i * 7919 - 50_000,
            f"s{i}\x00x" if i % 5 == 0 else f"é{i}",
            i % 2 == 0,
            datetime.date(1960, 1, 1) + datetime.timedelta(days=i * 37),
            epoch + datetime.timedelta(seconds=i * 99_991),
            i,
            bytes([i % 3, 0, i]) if i % 4 else b"",
        )
        for i in range(120)
    ]
    rows.append((None, None, None, None, None, 0, None))
    df = spark.createDataFrame(rows, "a long, s string, b boolean, d date, t timestamp, i int, y binary")
    for cols in [("a",), ("s",), ("b",), ("d",), ("t",), ("i",), ("y",), ("a", "s", "b", "d", "t", "y")]:
        out = df.select(
            *cols, sf.expr(key_group_sql(df.schema, cols, 1024)).alias("g"), stored_key_column(df.schema, cols, 1024)
        ).toArrow()
        codec = KeyCodec(struct(*(Field(c, from_arrow(out.schema.field(c).type, c)) for c in cols)), "key")
        stored = stored_key_encoder(codec, 1024)
        for r in out.to_pylist():
            key = tuple(r[c] for c in cols)
            assert zlib.crc32(codec.encode(key)) % 1024 == r["g"], (cols, r)
            assert stored(key) == r[out.schema.names[-1]], (cols, r)


def test_rows_route_to_their_partition_by_spark_own_hash_partitioning(spark: Any) -> None:
    """The routing values computed in Python land each marker row in its partition under Spark's own
    ``repartition(n, col)``, and the Murmur3 behind them equals Spark's ``hash()`` of an int."""
    from pyspark.sql import functions as sf

    from statekeeper.store.spark.routing import hash_routes, spark_int_hash

    values = [-(2**31), -7, -1, 0, 1, 2, 42, 65_537, 2**31 - 1]
    got = spark.createDataFrame([(v,) for v in values], "v int").selectExpr("v", "hash(v) as h").collect()
    assert {r["v"]: r["h"] for r in got} == {v: spark_int_hash(v) for v in values}
    for n in (1, 3, 4, 8, 200):
        routes = hash_routes(n)
        landed = (
            spark.createDataFrame([(p, r) for p, r in enumerate(routes)], "p int, r int")
            .repartition(n, "r")
            .select("p", sf.spark_partition_id().alias("at"))
            .collect()
        )
        assert {row["p"]: row["at"] for row in landed} == {p: p for p in range(n)}


def test_a_rescale_under_the_plain_stores_rules_is_refused_before_anything_commits(spark: Any, tmp_path: Path) -> None:
    """`execute_rescale` with its default rules (every key group-led) on an operator's typed state: its
    metadata keys lead with no key group, so a range copy would drop them; the rescale is refused naming the
    column family and the rules to pass, and the old layout stays the head, whole."""
    batches = write_inputs(tmp_path / "in", files=2, rows=150, keys=50)
    root = (tmp_path / "state").as_uri()
    run_query(
        spark,
        StatefulOperator(root, "counts", "user", CountSum(), OUT, num_partitions=3),
        tmp_path / "in",
        tmp_path / "ckpt",
    )
    fm = open_file_manager(root)
    head = CommitLog(fm).latest()
    with pytest.raises(RescaleError, match=r"column family '__meta'.*TypedStateKeys"):
        execute_rescale(fm, plan_rescale(fm, "counts", 5), workers=1)
    assert CommitLog(fm).latest() == head
    assert state_of(spark, root, "counts") == reference(batches)
