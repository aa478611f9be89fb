"""The state reader's batch ids and change feed across an online rescale, an offline one and a rollback.

Real Spark (local[2]) runs the batches; the rescales and the rollback are the product's own (a restart
with another ``num_partitions``, `execute_rescale`). The change feed over the whole history and every
``batchId`` read are compared with a pandas reference computed from the batches' inputs.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

from statekeeper.store import CommitLog, open_file_manager
from statekeeper.store.rescale import execute_rescale, plan_rescale, plan_rollback
from statekeeper.store.spark import StatefulOperator, read_state
from statekeeper.store.spark.rescale_rules import TypedStateKeys
from testkit.processors import CountSum
from tests.spark.helpers import run_query, stage_files, write_inputs

OUT = "user string, count long, total long"
OP = "counts"
pd: Any = importlib.import_module("pandas")  # no pandas stubs in the project


def _want_feed(df: Any, last: int, first: int = 0) -> set[tuple[int, str, str, int, int]]:
    """Each batch updates the keys it read to their running (count, total)."""
    want = set()
    for b in range(first, last + 1):
        running = df[df.batch <= b].groupby("user")["value"].agg(["count", "sum"])
        for u in set(df[df.batch == b].user):
            want.add((b, "update", u, int(running.loc[u, "count"]), int(running.loc[u, "sum"])))
    return want


def _feed(spark: Any, root: str, first: int, last: int | None = None) -> list[Any]:
    options: dict[str, Any] = {"readChangeFeed": True, "changeStartBatchId": first}
    if last is not None:
        options["changeEndBatchId"] = last
    return read_state(spark, root, OP, stateVarName="totals", **options).collect()


def _rows(feed: list[Any]) -> set[tuple[int, str, str, int, int]]:
    return {(r.batch_id, r.change_type, r.key.user, r.value["count"], r.value.total) for r in feed}


def _state_after(spark: Any, root: str, batch: int) -> dict[str, tuple[int, int]]:
    rows = read_state(spark, root, OP, stateVarName="totals", batchId=batch).collect()
    assert len(rows) == len({r.key.user for r in rows}), "each key once"
    return {r.key.user: (r.value["count"], r.value.total) for r in rows}


def _reference_state(df: Any, batch: int) -> dict[str, tuple[int, int]]:
    agg = df[df.batch <= batch].groupby("user")["value"].agg(["count", "sum"])
    return {u: (int(c), int(s)) for u, c, s in agg.itertuples()}


def test_change_feed_and_batch_reads_across_rescales_and_a_rollback(spark: Any, tmp_path: Path) -> None:
    batches = write_inputs(tmp_path / "all", files=4, rows=40, keys=14, seed=11)
    df = pd.DataFrame(
        [(b, u, v) for b, rows in enumerate(batches) for u, v in rows], columns=["batch", "user", "value"]
    )
    root = (tmp_path / "state").as_uri()
    fm = open_file_manager(root)

    def run(files: range, partitions: int) -> None:
        stage_files(tmp_path / "all", tmp_path / "in", files)
        op = StatefulOperator(root, OP, "user", CountSum(), OUT, num_partitions=partitions)
        run_query(spark, op, tmp_path / "in", tmp_path / "ckpt")

    run(range(2), 4)  # batches 0, 1 on 4 partitions: versions 1, 2
    run(range(2, 3), 2)  # online rescale 4 -> 2 (version 3, batch 1 repeated), batch 2: version 4
    execute_rescale(fm, plan_rescale(fm, OP, 3, rules=TypedStateKeys()), rules=TypedStateKeys())  # version 5
    run(range(3, 4), 3)  # batch 3: version 6
    log = CommitLog(fm)
    assert [(v, r.batch, r.change.get(OP)) for v in range(1, 7) if (r := log.get(v))] == [
        (1, 0, None),
        (2, 1, None),
        (3, 1, "rescale"),
        (4, 2, None),
        (5, 2, "rescale"),
        (6, 3, None),
    ]

    # the whole feed: each batch once, numbered as the query numbers it, read by the layout that wrote it
    feed = _feed(spark, root, 0)
    assert _rows(feed) == _want_feed(df, 3) and len(feed) == len(_want_feed(df, 3))
    parts = {b: {r.partition_id for r in feed if r.batch_id == b} for b in range(4)}
    assert parts[0] | parts[1] <= set(range(4)) and max(parts[0] | parts[1]) >= 2  # the old layout's partitions
    assert parts[2] <= {0, 1} and parts[3] <= {0, 1, 2}
    # ranges that end on or start after a rescale
    assert _rows(_feed(spark, root, 1, 1)) == _want_feed(df, 1, 1)
    assert _rows(_feed(spark, root, 2, 2)) == _want_feed(df, 2, 2)
    assert _rows(_feed(spark, root, 2)) == _want_feed(df, 3, 2)
    # batchId b: the state after batch b (a rescaled batch reads its latest version, in the new layout)
    for b in range(4):
        assert _state_after(spark, root, b) == _reference_state(df, b), b
    with pytest.raises(Exception, match="batch 4 of operator 'counts' is not committed"):
        _state_after(spark, root, 4)

    # rollback to version 4 (after batch 2, 2 partitions): version 7; batch 3 of the abandoned branch is gone
    execute_rescale(fm, plan_rollback(fm, OP, 4))
    assert _rows(_feed(spark, root, 0)) == _want_feed(df, 2)
    assert _state_after(spark, root, 2) == _reference_state(df, 2)
    with pytest.raises(Exception, match="batch 3 of operator 'counts' is not committed"):
        _feed(spark, root, 0, 3)
    # the query resumes at batch 3 (docs/rescale.md): the feed is the new history's, on 2 partitions
    for sub in ("offsets", "commits"):
        (tmp_path / "ckpt" / sub / "3").unlink()
        (tmp_path / "ckpt" / sub / ".3.crc").unlink(missing_ok=True)
    run(range(3, 4), 2)
    feed = _feed(spark, root, 0)
    assert _rows(feed) == _want_feed(df, 3) and len(feed) == len(_want_feed(df, 3))
    assert {r.partition_id for r in feed if r.batch_id == 3} <= {0, 1}
    assert _state_after(spark, root, 3) == _reference_state(df, 3)
