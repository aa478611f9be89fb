"""The partition task without Spark: speculative duplicates, stale worker caches, catch-up, state API."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from statekeeper.store import CommitLog, StateStore, StoreConfig, open_file_manager
from statekeeper.store.errors import ConfigurationError, StoreStateError
from statekeeper.store.formats.typed_schema import SchemaEvolutionError
from statekeeper.store.spark import executor
from statekeeper.store.spark.api import StatefulProcessor, TimerValues
from statekeeper.store.spark.executor import MARKER_COL, PID_COL, TaskSpec, run_task
from statekeeper.store.spark.follow import Follower
from statekeeper.store.spark.handle import HandleStateError, StatefulProcessorHandle
from statekeeper.store.spark.state import StateContext
from statekeeper.store.spark.state_view import StateView
from statekeeper.store.spark.task_output import META_COL
from statekeeper.store.spark.worker_cache import WorkerCache
from testkit.processors import CountSum

SCHEMA = pa.schema([("user", pa.string()), ("count", pa.int64()), ("total", pa.int64()), (META_COL, pa.string())])


def _input(rows: list[tuple[str, int]], partition: int = 0) -> list[pa.RecordBatch]:
    data = pa.RecordBatch.from_pydict(
        {
            "user": [u for u, _ in rows] + [None],
            "value": pa.array([v for _, v in rows] + [None], pa.int64()),
            PID_COL: pa.array([partition] * (len(rows) + 1), pa.int32()),
            MARKER_COL: [False] * len(rows) + [True],
        }
    )
    return [data]


def _spec(root: str, version: int, load_id: str, tmp: Path, processor: Any = None) -> TaskSpec:
    return TaskSpec(
        root=root,
        operator="op",
        num_partitions=1,
        version=version,
        load_ids=(load_id,),
        commit=True,
        batch_ts_ms=1_000_000 + version,
        key_columns=("user",),
        processor=processor or CountSum(),
        output_schema=SCHEMA,
        local_dir=str(tmp / "local"),
    )


def _run(spec: TaskSpec, rows: list[tuple[str, int]]) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
    out = list(run_task(spec, _input(rows)))
    table = pa.Table.from_batches(out)
    metas = [json.loads(m) for m in table.column(META_COL).to_pylist() if m]
    assert len(metas) == 1
    data = [(u, c, t) for u, c, t, m in zip(*(table.column(i).to_pylist() for i in range(4)), strict=True) if not m]
    return data, metas[0]


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[WorkerCache]]:
    """Two simulated Python worker processes (each its own store cache and local directory)."""
    caches = [WorkerCache(), WorkerCache()]
    for i, c in enumerate(caches):
        c.base = str(tmp_path / f"worker{i}")
    yield caches
    for c in caches:
        c.close_all()


def _on(monkeypatch: pytest.MonkeyPatch, cache: WorkerCache) -> None:
    monkeypatch.setattr(executor, "CACHE", cache)


def test_speculative_duplicates_and_stale_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: list[WorkerCache]
) -> None:
    root = (tmp_path / "state").as_uri()
    log = CommitLog(open_file_manager(root))
    b0 = [("a", 1), ("b", 2), ("a", 3)]
    b1 = [("b", 10), ("c", 20)]
    b2 = [("a", 100)]

    # batch 0 runs twice at once (a speculative duplicate) on two workers: two ids, one is committed
    _on(monkeypatch, workers[0])
    out_a, meta_a = _run(_spec(root, 0, "", tmp_path), b0)
    _on(monkeypatch, workers[1])
    out_b, meta_b = _run(_spec(root, 0, "", tmp_path), b0)
    assert meta_a["checkpoint_id"] != meta_b["checkpoint_id"]
    assert sorted(out_a) == sorted(out_b) == [("a", 2, 4), ("b", 1, 2)]
    log.commit(1, {"op": [meta_b["checkpoint_id"]]})

    # batch 1 lands on worker 0, which holds the losing attempt: it must not reuse it
    _on(monkeypatch, workers[0])
    out, meta = _run(_spec(root, 1, meta_b["checkpoint_id"], tmp_path), b1)
    assert not meta["reused_local"]
    assert sorted(out) == [("b", 2, 12), ("c", 1, 20)]
    log.commit(2, {"op": [meta["checkpoint_id"]]})

    # batch 2 lands on worker 1, one version behind on the same lineage: it catches up
    _on(monkeypatch, workers[1])
    out, meta = _run(_spec(root, 2, meta["checkpoint_id"], tmp_path), b2)
    assert meta["reused_local"] and meta["replayed_changelogs"] == 1
    assert out == [("a", 3, 104)]
    assert meta["rows_total"] == 3
    log.commit(3, {"op": [meta["checkpoint_id"]]})

    fresh = StateStore(root, "op", 0, config=StoreConfig(local_dir=str(tmp_path / "fresh"))).load(3)
    got = {key[0]: v for key, _, v, _ in StateView(fresh).rows("totals")}
    fresh.close()
    assert got == {"a": (3, 104), "b": (2, 12), "c": (1, 20)}


def _wait_for(condition: Any, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_worker_catches_its_store_up_between_tasks_once_the_batch_is_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: list[WorkerCache]
) -> None:
    """Worker 0 holds version 1, worker 1 runs the next batch: once its commit record exists, worker 0's
    follower replays it, not while a task runs in worker 0, and the partition's next task there loads nothing."""
    root = (tmp_path / "state").as_uri()
    log = CommitLog(open_file_manager(root))
    _on(monkeypatch, workers[0])
    _, meta = _run(_spec(root, 0, "", tmp_path), [("a", 1)])
    log.commit(1, {"op": [meta["checkpoint_id"]]})
    _on(monkeypatch, workers[1])
    _, meta = _run(_spec(root, 1, meta["checkpoint_id"], tmp_path), [("a", 2), ("b", 3)])
    held = workers[0].stores[(root, "op", 0)]

    follower = Follower(workers[0])
    with workers[0].task():  # a task is running in worker 0: its stores are left alone
        follower.follow(root, "op", 2)
        log.commit(2, {"op": [meta["checkpoint_id"]]})
        time.sleep(0.3)
        assert held.version == 1 and not workers[0].followed
    follower.follow(root, "op", 2)  # worker 0's next task committed version 2 of another partition
    assert _wait_for(lambda: bool(workers[0].followed))
    assert (held.version, held.checkpoint_id) == (2, meta["checkpoint_id"])

    _on(monkeypatch, workers[0])
    out, meta = _run(_spec(root, 2, meta["checkpoint_id"], tmp_path), [("b", 10)])
    assert out == [("b", 2, 13)]
    assert meta["reused_local"] and meta["replayed_changelogs"] == 0
    assert meta["followed_changelogs"] == 1 and meta["followed_records"] >= 2
    assert not workers[0].followed  # reported once


def test_a_task_wanting_the_store_being_followed_waits_for_that_catch_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: list[WorkerCache]
) -> None:
    """A store is never used by the follower and a task at once (StateStore is not thread-safe)."""
    import threading

    root = (tmp_path / "state").as_uri()
    _on(monkeypatch, workers[0])
    spec = _spec(root, 0, "", tmp_path)
    _run(spec, [("a", 1)])
    key = (root, "op", 0)
    taken, events = threading.Event(), []

    def follower() -> None:
        with workers[0].follow(key) as store:
            assert store is not None
            taken.set()
            time.sleep(0.3)
            events.append("caught up")

    thread = threading.Thread(target=follower)
    thread.start()
    assert taken.wait(10)
    assert workers[0].store(spec, 0) is workers[0].held(key)
    events.append("task has its store")
    thread.join()
    assert events == ["caught up", "task has its store"]
    with workers[0].task(), workers[0].follow(key) as store:
        assert store is None  # and while a task runs the follower gets none


def test_the_follower_leaves_a_store_holding_a_losing_attempt_to_its_next_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: list[WorkerCache]
) -> None:
    """A store that is not behind the committed version (it holds another attempt of it) is not touched."""
    root = (tmp_path / "state").as_uri()
    log = CommitLog(open_file_manager(root))
    ids = []
    for cache in workers:  # a speculative duplicate of batch 0 on each worker
        _on(monkeypatch, cache)
        ids.append(_run(_spec(root, 0, "", tmp_path), [("a", 1)])[1]["checkpoint_id"])
    log.commit(1, {"op": [ids[1]]})
    follower = Follower(workers[0])
    follower.follow(root, "op", 1)
    time.sleep(0.3)
    assert not workers[0].followed and workers[0].stores[(root, "op", 0)].checkpoint_id == ids[0]
    _on(monkeypatch, workers[0])
    out, meta = _run(_spec(root, 1, ids[1], tmp_path), [("a", 5)])
    assert out == [("a", 2, 6)] and not meta["reused_local"]


def test_a_state_root_deleted_and_recreated_under_a_warm_worker_is_loaded_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: list[WorkerCache]
) -> None:
    """A notebook user deletes the state root and the query's checkpoint and starts again in the same
    session: the worker's cached store (and its commit records) describe the old root, not the new one."""
    import shutil

    root_dir = tmp_path / "state"
    root = root_dir.as_uri()
    for run in range(2):
        log = CommitLog(open_file_manager(root))
        load_id = ""
        for version, rows in enumerate([[("a", 1)], [("a", 2), ("b", 5)], [("b", 1)]]):
            _on(monkeypatch, workers[0 if version == 2 else 1])  # worker 0 loads version 2 from the root
            out, meta = _run(_spec(root, version, load_id, tmp_path), rows)
            load_id = meta["checkpoint_id"]
            log.commit(version + 1, {"op": [load_id]})
        assert out == [("b", 2, 6)], f"run {run}"
        shutil.rmtree(root_dir)


def test_replay_mode_aborts_and_gives_the_same_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: list[WorkerCache]
) -> None:
    root = (tmp_path / "state").as_uri()
    _on(monkeypatch, workers[0])
    out1, meta1 = _run(_spec(root, 0, "", tmp_path), [("a", 1)])
    CommitLog(open_file_manager(root)).commit(1, {"op": [meta1["checkpoint_id"]]})
    spec = _spec(root, 0, "", tmp_path)
    from dataclasses import replace

    out2, meta2 = _run(replace(spec, commit=False), [("a", 1)])
    assert out2 == out1 and meta2["checkpoint_id"] is None


class _AllStates(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.h = handle
        self.v = handle.getValueState("v", ttlDurationMs=1000)
        self.lst = handle.getListState("l")
        self.m = handle.getMapState("m", ttlDurationMs=5000)

    def handleInputRows(self, key: tuple[Any, ...], rows: Iterator[Any], timerValues: TimerValues) -> Iterator[Any]:
        return iter(())


def _ctx(tmp_path: Path, now: int) -> tuple[StateStore, StateContext, _AllStates]:
    store = StateStore((tmp_path / "root").as_uri(), "op", 0, config=StoreConfig(local_dir=str(tmp_path / "l")))
    store.load(0)
    ctx = StateContext(store, now)
    p = _AllStates()
    p.init(StatefulProcessorHandle(ctx))
    return store, ctx, p


def test_state_variables_ttl_timers_and_counts(tmp_path: Path) -> None:
    store, ctx, p = _ctx(tmp_path, now=10_000)
    ctx.set_key(("k",))
    assert not p.v.exists() and p.v.get() is None
    p.v.update((1,))
    p.v.update((2,))
    assert p.v.get() == (2,)
    p.lst.appendValue(1)
    p.lst.appendList([2, 3])
    assert list(p.lst.get()) == [1, 2, 3]
    p.m.updateValue("x", 1)
    p.m.updateValue("y", 2)
    assert dict(p.m.iterator()) == {"x": 1, "y": 2} and sorted(p.m.keys()) == ["x", "y"]
    p.m.removeKey("x")
    assert not p.m.containsKey("x") and p.m.getValue("y") == 2
    p.h.registerTimer(10_500)
    p.h.registerTimer(20_000)
    assert list(p.h.listTimers()) == [10_500, 20_000]
    p.h.deleteTimer(20_000)
    ctx.set_key(("other",))
    p.v.update((9,))
    assert ctx.rows_delta == 4  # v(k), l(k), m(k,y), v(other)
    assert ctx.rows_updated == 7  # 3 value updates (2 of k, 1 of other), 2 list writes, 2 map writes
    assert ctx.rows_removed == 1
    ctx.clear_key()
    with pytest.raises(StoreStateError, match="no current grouping key"):
        p.v.get()
    # bulk access with explicit keys
    assert p.v.getMany([("k",), ("other",), ("none",)]) == [(2,), (9,), None]
    p.v.updateMany([("n1",), ("n2",)], [(1,), (2,)])
    p.v.clearMany([("n1",), ("zz",)])
    assert ctx.rows_delta == 5
    assert ctx.save_rows_total() == 5

    # later: value TTL (1 s) has passed, map TTL (5 s) not; the timer at 10.5 s fires
    ctx.now_ms = 12_000
    ctx.set_key(("k",))
    assert p.v.get() is None and p.m.getValue("y") == 2
    assert ctx.pop_expired_timers() == [(ctx.gk, 10_500)]
    assert ctx.pop_expired_timers() == []
    removed = ctx.evict_expired()
    assert removed == 3  # v of k, other, n2
    assert p.v.getMany([("k",), ("other",), ("n2",)]) == [None, None, None]
    assert list(p.lst.get()) == [1, 2, 3]
    store.abort()
    store.close()


def test_update_many_after_get_many_writes_the_keys_it_is_given_and_counts_rows(tmp_path: Path) -> None:
    """updateMany reuses the encodings and presence getMany just read for the same keys, and only then: a
    key list changed in place, or a write in between, is read afresh."""
    store, ctx, p = _ctx(tmp_path, now=10_000)
    keys = [("a",), ("b",)]
    assert p.v.getMany(keys) == [None, None]
    p.v.updateMany(keys, [(1,), (2,)])
    assert ctx.rows_delta == 2
    got = p.v.getMany(keys)
    keys[1] = ("c",)  # changed in place after the read
    p.v.updateMany(keys, [(g[0] + 10,) for g in got])
    assert p.v.getMany([("a",), ("b",), ("c",)]) == [(11,), (2,), (12,)] and ctx.rows_delta == 3
    p.v.getMany([("a",), ("b",)])
    p.v.clearMany([("b",)])  # a write between the read and the update
    p.v.updateMany([("a",), ("b",)], [(0,), (0,)])
    assert ctx.rows_delta == 3 and ctx.save_rows_total() == 3
    store.abort()
    store.close()


def test_state_names_and_kinds_are_checked(tmp_path: Path) -> None:
    store, ctx, p = _ctx(tmp_path, now=0)
    h = StatefulProcessorHandle(ctx)
    with pytest.raises(ConfigurationError, match="invalid state variable name"):
        h.getValueState("__x")
    h.getValueState("v")
    with pytest.raises(HandleStateError, match="STATEFUL_PROCESSOR_DUPLICATE_STATE_VARIABLE_DEFINED"):
        h.getListState("v")
    ctx.set_key(("k",))
    p.lst.put([1])
    h.deleteIfExists("l")
    assert "l" not in ctx.states
    h2 = StatefulProcessorHandle(ctx)
    h2.getMapState("l")  # may come back as another kind after deleteIfExists
    store.abort()
    store.close()


def test_apply_in_pandas_with_state_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: list[WorkerCache]
) -> None:
    from dataclasses import replace

    from statekeeper.store.spark import ApplyInPandasWithState
    from testkit.processors import expiring_count

    _on(monkeypatch, workers[0])
    root = (tmp_path / "state").as_uri()
    log = CommitLog(open_file_manager(root))
    proc = ApplyInPandasWithState(expiring_count)
    spec = replace(_spec(root, 0, "", tmp_path, proc), input_format="pandas", batch_ts_ms=10_000)
    out, meta = _run(spec, [("a", 1), ("a", 2), ("b", 3)])
    assert out == [] and meta["rows_total"] == 2
    log.commit(1, {"op": [meta["checkpoint_id"]]})
    # 0.5 s later "a" has data again (its timeout moves), "b" has none yet
    spec = replace(spec, version=1, load_ids=(meta["checkpoint_id"],), batch_ts_ms=10_500)
    out, meta = _run(spec, [("a", 4)])
    assert out == [] and meta["timers_fired"] == 0
    log.commit(2, {"op": [meta["checkpoint_id"]]})
    # 1.2 s after the first batch: "b" times out (called with no rows), "a" not yet
    spec = replace(spec, version=2, load_ids=(meta["checkpoint_id"],), batch_ts_ms=11_200)
    out, meta = _run(spec, [("c", 5)])
    assert out == [("b", 1, -1)] and meta["timers_fired"] == 1 and meta["rows_total"] == 2


def test_restart_with_an_evolved_schema_and_an_incompatible_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: list[WorkerCache]
) -> None:
    """A new task (restart) reads old values through a compatible new schema; an incompatible one
    fails the task before anything is committed."""
    from testkit.processors import EvolvingCounter

    root = (tmp_path / "state").as_uri()
    fm = open_file_manager(root)
    log = CommitLog(fm)
    _on(monkeypatch, workers[0])
    out, meta = _run(_spec(root, 0, "", tmp_path, EvolvingCounter("count int")), [("a", 1), ("a", 2)])
    log.commit(1, {"op": [meta["checkpoint_id"]]})
    assert out == [("a", 2, 3)]  # the total is output, not stored
    # restart on another worker with a wider, reordered schema: old values read through it
    _on(monkeypatch, workers[1])
    schema = "total long, note string, count long"
    out, meta = _run(_spec(root, 1, meta["checkpoint_id"], tmp_path, EvolvingCounter(schema)), [("a", 5)])
    assert out == [("a", 3, 5)]
    log.commit(2, {"op": [meta["checkpoint_id"]]})
    before = {i.path for i in fm.list("")}
    _on(monkeypatch, workers[0])
    bad = _spec(root, 2, meta["checkpoint_id"], tmp_path, EvolvingCounter("total string, count long"))
    with pytest.raises(SchemaEvolutionError, match=r"'totals': field 'value.total' was long .* declared string"):
        _run(bad, [("a", 1)])
    assert {i.path for i in fm.list("")} == before  # nothing written


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def test_a_pickle_payload_fails_the_task_naming_its_changelog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: list[WorkerCache]
) -> None:
    import pickle

    from statekeeper.store.formats.typed_scalars import CorruptStateError

    root = (tmp_path / "state").as_uri()
    log = CommitLog(open_file_manager(root))
    _on(monkeypatch, workers[0])
    _, meta = _run(_spec(root, 0, "", tmp_path), [("a", 1)])
    log.commit(1, {"op": [meta["checkpoint_id"]]})
    marker = tmp_path / "executed"
    store = StateStore(root, "op", 0, config=StoreConfig(local_dir=str(tmp_path / "inject"))).load(1)
    cf = store.column_family("totals")
    cf.put(next(k for k, _ in cf.items()), pickle.dumps(_Exploit(marker)))
    result = store.commit()
    store.close()
    log.commit(2, {"op": [result.checkpoint_id]})
    with pytest.raises(CorruptStateError, match="not a statekeeper typed value") as err:
        _run(_spec(root, 2, result.checkpoint_id, tmp_path), [("a", 1)])
    assert f"op/00000/changelogs/{2:020d}_{result.checkpoint_id}.changelog" in str(err.value)
    assert not marker.exists()


def test_a_store_left_idle_gives_its_memtables_back_and_stays_warm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: list[WorkerCache]
) -> None:
    """The stores of a stopped query (or of partitions another worker now serves) must not keep their
    memtables charged to the worker's memory limit: that cache is what the busy stores read from."""
    from statekeeper.store import rocks

    clock = [1000.0]
    monkeypatch.setattr(rocks, "MIN_FLUSH_BYTES", 1)
    cache = workers[0]
    cache.clock, cache.idle_seconds = lambda: clock[0], 10
    _on(monkeypatch, cache)
    root = (tmp_path / "state").as_uri()
    log = CommitLog(open_file_manager(root))
    rows = [(f"user{i}", i) for i in range(2_000)]
    out, meta = _run(_spec(root, 0, "", tmp_path), rows)
    log.commit(1, {"op": [meta["checkpoint_id"]]})
    store = cache.stores[(root, "op", 0)]

    def active_bytes() -> int:
        tracked = rocks.shared_memory().memtables
        own = [cf for (owner, _), cf in tracked.items() if owner == id(store)]
        assert own
        return sum(cf.property_int_value("rocksdb.cur-size-active-mem-table") or 0 for cf in own)

    held = active_bytes()
    other = replace(_spec(root, 0, "", tmp_path), operator="other")
    clock[0] += 5  # used 5 s ago: kept as it is
    cache.store(other, 0)
    assert active_bytes() == held > 100_000
    clock[0] += 6  # 11 s: idle, flushed by the next fetch of any store
    cache.store(other, 0)
    assert active_bytes() < held // 10

    out, meta = _run(_spec(root, 1, meta["checkpoint_id"], tmp_path), [("user7", 1)])
    assert meta["reused_local"] and out == [("user7", 2, 8)]


@pytest.mark.parametrize("raw", ["soon", "-1"])
def test_a_bad_worker_cache_setting_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    from statekeeper.store.spark.worker_cache import IDLE_SECONDS_ENV, MAX_STORES_ENV

    for name in (IDLE_SECONDS_ENV, MAX_STORES_ENV):
        with monkeypatch.context() as m:
            m.setenv(name, raw)
            with pytest.raises(ConfigurationError, match=f"{name}='{raw}'"):
                WorkerCache()


def test_a_task_reports_its_own_peak_memory_and_hands_back_what_it_freed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark reuses a Python worker for many tasks (of many queries): the peak RSS a task reports is the peak
    while it ran, not an earlier task's, and what the task freed goes back to the OS when it ends."""
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("the peak is reset through Linux's /proc/self/clear_refs")
    released: list[str] = []
    monkeypatch.setattr(executor, "release_free_heap", lambda: released.append("heap"))
    root = (tmp_path / "state").as_uri()
    big = b"x" * (256 << 20)  # an earlier task's peak: 256 MiB more, written so that it is resident
    del big
    _, meta = _run(_spec(root, 0, "", tmp_path), [("a", 1)])
    assert released == ["heap"]
    now = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    phases = meta["phases"]
    assert phases["worker_peak_rss_mb"] < now + 128, phases
    # what the worker held when the task began, and RocksDB's part of it, beside the peak
    assert 0 < phases["worker_start_rss_mb"] <= phases["worker_peak_rss_mb"], phases
    assert 0 <= phases["rocksdb_mb"] < phases["worker_peak_rss_mb"], phases
