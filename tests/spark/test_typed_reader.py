"""The typed state reader and change feed against a pandas reference; foreign bytes are refused."""

from __future__ import annotations

import importlib
import pickle
from pathlib import Path
from typing import Any

import pytest

from statekeeper.store import CommitLog, StateStore, StoreConfig, open_file_manager
from statekeeper.store.spark import StatefulOperator, read_state
from testkit.processors import TypedAll
from tests.spark.helpers import run_query, write_inputs

OUT = "user string, count long, total long"
pd: Any = importlib.import_module("pandas")  # no pandas stubs in the project


def _frame(batches: list[list[tuple[str, int]]]) -> Any:
    return pd.DataFrame(
        [(b, u, v) for b, rows in enumerate(batches) for u, v in rows], columns=["batch", "user", "value"]
    )


def test_typed_reader_and_change_feed_match_pandas_and_refuse_foreign_bytes(spark: Any, tmp_path: Path) -> None:
    batches = write_inputs(tmp_path / "in", files=3, rows=60, keys=12, seed=5)
    root = (tmp_path / "state").as_uri()
    op = StatefulOperator(root, "typed", "user", TypedAll(), OUT, num_partitions=2)
    run_query(spark, op, tmp_path / "in", tmp_path / "ckpt")
    df = _frame(batches)

    # ValueState: typed key and value structs, the TTL as a timestamp
    totals = read_state(spark, root, "typed", stateVarName="totals")
    assert totals.schema.simpleString() == (
        "struct<key:struct<user:string>,value:struct<count:bigint,total:bigint>,"
        "expiration_timestamp:timestamp,partition_id:int>"
    )
    rows = totals.collect()
    want = df.groupby("user")["value"].agg(["count", "sum"])
    assert {r.key.user: (r.value["count"], r.value.total) for r in rows} == {
        u: (int(c), int(s)) for u, c, s in want.itertuples()
    }
    assert all(r.expiration_timestamp is not None for r in rows)

    # ListState flattened (one row per element) and as an array column
    flat = read_state(spark, root, "typed", stateVarName="values").collect()
    want_lists = df.assign(v=df.value % 10).groupby("user")["v"].apply(list).to_dict()
    got_lists: dict[str, list[int]] = {}
    for r in flat:
        got_lists.setdefault(r.key.user, []).append(r.list_element.v)
    assert {u: sorted(v) for u, v in got_lists.items()} == {u: sorted(v) for u, v in want_lists.items()}
    nested = read_state(spark, root, "typed", stateVarName="values", flattenCollectionTypes=False).collect()
    assert {r.key.user: [e.v for e in r.list_value] for r in nested} == want_lists

    # MapState: one row per entry with a typed map key
    entries = read_state(spark, root, "typed", stateVarName="buckets").collect()
    want_map = df.assign(b=df.value % 3).groupby(["user", "b"]).size().to_dict()
    assert {(r.key.user, r.user_map_key.bucket): r.user_map_value.n for r in entries} == want_map
    as_map = read_state(spark, root, "typed", stateVarName="buckets", flattenCollectionTypes=False).collect()
    assert sum(len(r.map_value) for r in as_map) == len(want_map)

    # timers
    timers = read_state(spark, root, "typed", readRegisteredTimers=True).collect()
    assert sorted(r.key.user for r in timers) == sorted(want.index)
    assert {r.expiration_timestamp_ms for r in timers} == {10**15}

    # change feed of batches 1..2: each batch updates its keys to their running totals
    feed = read_state(
        spark, root, "typed", stateVarName="totals", readChangeFeed=True, changeStartBatchId=1, changeEndBatchId=2
    ).collect()
    got_feed = {(r.batch_id, r.change_type, r.key.user, r.value["count"], r.value.total) for r in feed}
    want_feed = set()
    for b in (1, 2):
        running = df[df.batch <= b].groupby("user")["value"].agg(["count", "sum"])
        for u in set(df[df.batch == b].user):
            want_feed.add((b, "update", u, int(running.loc[u, "count"]), int(running.loc[u, "sum"])))
    assert got_feed == want_feed
    assert len(feed) == len(want_feed)  # one change per key and batch
    # an older version reads as of its batch
    v1 = read_state(spark, root, "typed", stateVarName="totals", batchId=0).collect()
    first = df[df.batch == 0].groupby("user")["value"].agg(["count", "sum"])
    assert {r.key.user: (r.value["count"], r.value.total) for r in v1} == {
        u: (int(c), int(s)) for u, c, s in first.itertuples()
    }

    # a pickle payload (code on load) committed in a changelog value: refused, and never run
    marker = tmp_path / "executed"
    _inject_pickle(root, "typed", marker)
    feed_options: dict[str, Any] = {"readChangeFeed": True, "changeStartBatchId": 3}
    for options in ({}, feed_options):
        with pytest.raises(Exception, match="not a statekeeper typed value") as err:
            read_state(spark, root, "typed", stateVarName="totals", **options).collect()
        if options:  # the change feed names the changelog file
            assert "typed/00000/changelogs/" in str(err.value)
    with pytest.raises(Exception, match="not a statekeeper typed value"):
        read_state(spark, root, "typed").collect()
    assert not marker.exists()


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def _inject_pickle(root: str, operator: str, marker: Path) -> int:
    """Commit a new version whose changelog of partition 0 puts a pickle payload in a value of 'totals'."""
    log = CommitLog(open_file_manager(root))
    latest = log.latest()
    record = log.get(latest)
    assert record is not None
    ids = []
    for p in range(len(record.checkpoint_ids[operator])):
        store = StateStore(root, operator, p, config=StoreConfig(local_dir=str(marker.parent / f"inject{p}")))
        store.load(latest)
        if p == 0:
            key = next(k for k, _ in store.column_family("totals").items())
            store.column_family("totals").put(key, pickle.dumps(_Exploit(marker)))
        result = store.commit()
        store.close()
        ids.append(result.checkpoint_id)
    log.commit(latest + 1, {operator: ids})
    return latest + 1
