"""End to end on real Spark (local[2]): results equal a batch-computed reference."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from statekeeper.maintenance.expiry import expire_versions
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_builds import create_snapshots
from statekeeper.store import CommitLog, open_file_manager
from statekeeper.store.formats.changelog import ChangelogReader
from statekeeper.store.spark import ApplyInPandasWithState, StatefulOperator, read_state
from statekeeper.store.spark.schemas import TAG_TTL
from testkit.processors import (
    CountSum,
    CountSumInInputOrder,
    CountSumPandas,
    CountSumVectorized,
    Sessions,
    count_sum_group_state,
)
from tests.spark.helpers import CollectingSink, reference, run_query, state_of, write_inputs

OUT = "user string, count long, total long"


def test_counts_equal_batch_reference_and_reader(spark: Any, tmp_path: Path) -> None:
    batches = write_inputs(tmp_path / "in", files=4, rows=400, keys=60)
    root = (tmp_path / "state").as_uri()
    sink = CollectingSink()
    op = StatefulOperator(root, "counts", "user", CountSum(), OUT, num_partitions=3, sink=sink)
    run_query(spark, op, tmp_path / "in", tmp_path / "ckpt")

    expected = reference(batches)
    assert CommitLog(open_file_manager(root)).latest() == 4
    assert state_of(spark, root, "counts") == expected
    assert sink.latest_per_key() == expected
    # each batch's output is the running total of the keys it touched
    for b, batch in enumerate(batches):
        running = reference(batches[: b + 1])
        assert {r[0]: r[1:] for r in sink.batches[b]} == {u: running[u] for u, _ in batch}
    # any committed version reads back as of that batch
    assert state_of(spark, root, "counts", version=2) == reference(batches[:2])
    progress = op.recent_progress
    assert [p.batch_id for p in progress] == [0, 1, 2, 3]
    assert all(p.mode == "commit" and p.num_partitions == 3 for p in progress)
    assert progress[-1].num_rows_total == len(expected)
    assert sum(p.input_rows for p in progress) == 1600
    assert progress[0].num_rows_updated == len({u for u, _ in batches[0]})
    assert all(p.changelog_bytes > 0 for p in progress)
    sop = progress[-1].state_operator_progress()
    assert sop["numRowsTotal"] == len(expected) and "uploadMs" in sop["customMetrics"]


@pytest.mark.parametrize(
    "processor,fmt",
    [
        (CountSumVectorized(), "rows"),
        (CountSumPandas(), "pandas"),
        (ApplyInPandasWithState(count_sum_group_state, state_name="totals"), "pandas"),
    ],
)
def test_vectorized_and_pandas_apis_match(spark: Any, tmp_path: Path, processor: Any, fmt: str) -> None:
    batches = write_inputs(tmp_path / "in", files=3, rows=300, keys=40, seed=3)
    root = (tmp_path / "state").as_uri()
    sink = CollectingSink()
    op = StatefulOperator(root, "counts", ["user"], processor, OUT, num_partitions=2, input_format=fmt, sink=sink)
    run_query(spark, op, tmp_path / "in", tmp_path / "ckpt")
    assert state_of(spark, root, "counts") == reference(batches)
    assert sink.latest_per_key() == reference(batches)


@pytest.mark.parametrize("processor", [CountSum(), CountSumInInputOrder()], ids=["per-key", "vectorized"])
def test_tasks_write_their_state_in_the_stores_key_order(spark: Any, tmp_path: Path, processor: Any) -> None:
    """The tasks take their keys by key group, then key (the store's order), so each batch's state writes, and the
    changelog records that replay them, ascend: RocksDB inserts such a run several times faster."""
    batches = write_inputs(tmp_path / "in", files=2, rows=600, keys=200, seed=5)
    root = (tmp_path / "state").as_uri()
    op = StatefulOperator(root, "counts", "user", processor, OUT, num_partitions=2, sink=CollectingSink())
    run_query(spark, op, tmp_path / "in", tmp_path / "ckpt")
    assert state_of(spark, root, "counts") == reference(batches)
    runs = []
    for path in sorted((tmp_path / "state").rglob("*.changelog")):
        with path.open("rb") as f:
            blocks = ChangelogReader(f, str(path)).blocks()
            runs += [keys for cf, keys, _values in blocks if cf == "totals" and len(keys) > 1]  # not __meta
    assert sum(map(len, runs)) >= 200
    assert all(list(keys) == sorted(set(keys)) for keys in runs)


def test_async_checkpointing_gives_the_sync_results(spark: Any, tmp_path: Path) -> None:
    batches = write_inputs(tmp_path / "in", files=4, rows=300, keys=50, seed=11)
    results = {}
    for mode in (False, True):
        root = (tmp_path / f"state-{mode}").as_uri()
        sink = CollectingSink()
        op = StatefulOperator(
            root, "counts", "user", CountSum(), OUT, num_partitions=2, async_checkpoint=mode, sink=sink
        )
        run_query(spark, op, tmp_path / "in", tmp_path / f"ckpt-{mode}")
        assert all(p.async_checkpoint is mode for p in op.recent_progress)
        results[mode] = (state_of(spark, root, "counts"), sink.batches)
    assert results[True] == results[False]
    assert results[True][0] == reference(batches)


def test_timers_list_and_map_state_through_the_reader(spark: Any, tmp_path: Path) -> None:
    """Processing-time timers close a user's session in the first batch without the user."""
    batches = write_inputs(tmp_path / "in", files=4, rows=40, keys=30, seed=13)
    root = (tmp_path / "state").as_uri()
    sink = CollectingSink()
    op = StatefulOperator(
        root,
        "sessions",
        "user",
        Sessions(gap_ms=1, ttl_ms=3_600_000),
        "user string, event string, n long",
        num_partitions=2,
        sink=sink,
    )
    run_query(spark, op, tmp_path / "in", tmp_path / "ckpt")

    present = [{u for u, _ in b} for b in batches]
    closed: dict[str, int] = {}
    for prev, cur in itertools.pairwise(present):
        for u in prev - cur:
            closed[u] = closed.get(u, 0) + 1
    assert state_of(spark, root, "sessions", state="closed") == {u: (n,) for u, n in closed.items()}
    closed_rows = [r for b in sink.batches.values() for r in b if r[1] == "closed"]
    assert len(closed_rows) == sum(closed.values())
    assert sum(p.timers_fired for p in op.recent_progress) == sum(closed.values())
    open_now = state_of(spark, root, "sessions", state="session")
    assert set(open_now) == present[-1]

    history = state_of(spark, root, "sessions", state="history")
    for u in reference(batches):
        counts = [sum(1 for x, _ in b if x == u) for b in batches]
        assert list(history[u]) == [c for c in counts if c]
    rows = read_state(spark, root, "sessions", state="per_value").collect()
    per_value: dict[tuple[str, int], int] = {}
    for r in rows:
        assert r["kind"] == "map" and r["expires_at_ms"] is None
        per_value[(json.loads(r["key"])[0], json.loads(r["user_key"]))] = json.loads(r["value"])
    want: dict[tuple[str, int], int] = {}
    for b in batches:
        for u, v in b:
            want[(u, v % 3)] = want.get((u, v % 3), 0) + 1
    assert per_value == want
    raw = read_state(spark, root, "sessions", state="session", raw=True).collect()
    assert raw and all(r["expires_at_ms"] is not None and bytes(r["value"])[0] == TAG_TTL for r in raw)


def test_restart_of_an_already_committed_batch_redelivers_without_reapplying(spark: Any, tmp_path: Path) -> None:
    """Spark re-runs a batch whose state we committed (its own commit was lost): not applied twice."""
    batches = write_inputs(tmp_path / "in", files=3, rows=200, keys=30, seed=17)
    staged = tmp_path / "staged"
    staged.mkdir()
    (tmp_path / "in" / "part-00002.parquet").rename(staged / "part-00002.parquet")
    root = (tmp_path / "state").as_uri()
    ckpt = tmp_path / "ckpt"

    def forget_spark_commit(batch_id: int) -> None:
        for name in (str(batch_id), f".{batch_id}.crc"):
            (ckpt / "commits" / name).unlink(missing_ok=True)

    first = CollectingSink()
    run_query(
        spark,
        StatefulOperator(root, "counts", "user", CountSum(), OUT, num_partitions=2, sink=first),
        tmp_path / "in",
        ckpt,
    )
    assert sorted(first.batches) == [0, 1]

    # Spark forgets it committed batch 1: the re-run recomputes its output from version 1, state untouched
    forget_spark_commit(1)
    again = CollectingSink()
    op = StatefulOperator(root, "counts", "user", CountSum(), OUT, num_partitions=2, sink=again)
    run_query(spark, op, tmp_path / "in", ckpt)
    assert [p.mode for p in op.recent_progress] == ["replay"]
    assert sorted(again.batches[1]) == sorted(first.batches[1])
    assert state_of(spark, root, "counts") == reference(batches[:2])

    # the same, but version 1 has expired meanwhile (a snapshot at 2 is the base; maintenance deleted version 1's
    # changelogs and commit record): the batch is skipped (its state is committed)
    forget_spark_commit(1)
    expire = MaintenanceSettings(snapshot_threshold=1, min_versions_to_retain=1, orphan_grace_seconds=0)
    fm = open_file_manager(root)
    assert create_snapshots(fm, expire).snapshots == 2 and expire_versions(fm, expire).commit_records == 1
    assert not fm.exists(f"commits/{1:020d}.commit")
    op = StatefulOperator(root, "counts", "user", CountSum(), OUT, num_partitions=2, sink=CollectingSink())
    run_query(spark, op, tmp_path / "in", ckpt)
    assert [p.mode for p in op.recent_progress] == ["skipped"]

    # and the query goes on from there
    (staged / "part-00002.parquet").rename(tmp_path / "in" / "part-00002.parquet")
    op = StatefulOperator(root, "counts", "user", CountSum(), OUT, num_partitions=2, sink=CollectingSink())
    run_query(spark, op, tmp_path / "in", ckpt)
    assert [(p.batch_id, p.mode) for p in op.recent_progress] == [(2, "commit")]
    assert state_of(spark, root, "counts") == reference(batches)
