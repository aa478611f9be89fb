"""Rescale and rollback of a store's committed state (store/rescale.py), against a dict model.

Batches of puts and deletes run over partitions that own contiguous key-group ranges; between
batches the operator is rescaled through random partition counts, or rolled back to a retained
version. After every step each partition holds exactly its key groups and their union equals the
model; layouts and batch ids are in the commit records. Runs on local disk and on S3 (moto).
"""

from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.queues
import os
import random
import shutil
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statekeeper.store import CommitLog, StateStore, StoreConfig
from statekeeper.store.errors import CheckpointWriteError, ConfigurationError, CorruptFileError
from statekeeper.store.files import open_file_manager
from statekeeper.store.formats.changelog import ChangelogReader, SstFile
from statekeeper.store.key_groups import KeyGroupLayout, group_at, group_prefix
from statekeeper.store.layout import StoreId
from statekeeper.store.rescale import (
    PartitionBuild,
    RescaleError,
    SourceStores,
    execute_rescale,
    in_processes,
    plan_rescale,
    plan_rollback,
)
from statekeeper.store.snapshot import write_snapshot

OP = "agg"
GROUPS = 64
CFS = ("default", "counts")


def stored(key: bytes) -> bytes:
    return group_prefix(zlib.crc32(key) % GROUPS) + key


def run_batch(root: str, version: int, layout: KeyGroupLayout, updates: dict[str, dict[bytes, bytes | None]]) -> None:
    """Batch `version`: load every partition at `version`, apply its keys' updates, commit `version + 1`."""
    ids = []
    for p in range(layout.partitions):
        with StateStore(root, OP, p) as s:
            s.load(version)
            for cf, kv in updates.items():
                for k, v in kv.items():
                    if layout.owner(group_at(k)) != p:
                        continue
                    if v is None:
                        s.delete(k, cf=cf)
                    else:
                        s.put(k, v, cf=cf)
            ids.append(s.commit().checkpoint_id)
    CommitLog(open_file_manager(root)).commit(version + 1, {OP: ids}, layouts={OP: layout})


def snapshot_all(root: str, version: int, partitions: int) -> None:
    """Snapshot every partition at committed `version`, as maintenance would: a rescale then loads its sources
    from the snapshots and copies the moved ranges (the route a running operator's state takes)."""
    fm = open_file_manager(root)
    for p in range(partitions):
        with StateStore(fm, OP, p) as s:
            s.load(version)
            work = os.path.join(s.local_dir, "snap")
            os.makedirs(work)
            write_snapshot(fm, StoreId(OP, p), version, s.checkpoint_id or "", s.db, work)


def read_all(root: str, version: int, layout: KeyGroupLayout) -> dict[str, dict[bytes, bytes]]:
    state: dict[str, dict[bytes, bytes]] = {}
    for p in range(layout.partitions):
        lo, hi = layout.groups_of(p)
        with StateStore(root, OP, p) as s:
            s.load(version)
            for cf in s.column_families():
                for k, v in s.items(cf=cf):
                    assert lo <= group_at(k) < hi, f"partition {p} holds key group {group_at(k)} outside [{lo}, {hi})"
                    assert k not in state.setdefault(cf, {})
                    state[cf][k] = v
    return {cf: kv for cf, kv in state.items() if kv}


def random_updates(rng: random.Random, model: dict[str, dict[bytes, bytes]]) -> dict[str, dict[bytes, bytes | None]]:
    updates: dict[str, dict[bytes, bytes | None]] = {}
    for cf in CFS:
        kv: dict[bytes, bytes | None] = {}
        for _ in range(rng.randint(0, 40)):
            k = stored(b"k%d" % rng.randint(0, 120))
            kv[k] = None if rng.random() < 0.2 else b"v%d" % rng.randint(0, 10**6)
        updates[cf] = kv
        target = model.setdefault(cf, {})
        for k, v in kv.items():
            if v is None:
                target.pop(k, None)
            else:
                target[k] = v
    return updates


def clean(model: dict[str, dict[bytes, bytes]]) -> dict[str, dict[bytes, bytes]]:
    return {cf: dict(kv) for cf, kv in model.items() if kv}


def test_rescale_through_partition_counts(checkpoint_root: str) -> None:
    """4 -> 8 -> 3 -> 1 -> 4 between batches; state and layout exact after each step."""
    fm = open_file_manager(checkpoint_root)
    rng = random.Random(7)
    model: dict[str, dict[bytes, bytes]] = {}
    layout = KeyGroupLayout(4, GROUPS)
    version = batch = 0
    for n in (8, 3, 1, 4):
        for _ in range(1):
            run_batch(checkpoint_root, version, layout, random_updates(rng, model))
            version += 1
            batch += 1
        plan = plan_rescale(fm, OP, n)
        assert plan.source_layout == layout and plan.source_version == version
        result = execute_rescale(fm, plan, workers=2)
        assert result.committed and result.plan.new_version == version + 1
        record = CommitLog(fm).get(version + 1)
        assert record is not None
        assert record.layouts[OP] == KeyGroupLayout(n, GROUPS)
        assert record.change == {OP: "rescale"}
        assert record.batch == batch - 1, "a rescale repeats the batch id of the version it re-lays out"
        version += 1
        layout = KeyGroupLayout(n, GROUPS)
        assert read_all(checkpoint_root, version, layout) == clean(model)
    run_batch(checkpoint_root, version, layout, random_updates(rng, model))
    assert read_all(checkpoint_root, version + 1, layout) == clean(model)
    assert CommitLog(fm).get(version + 1).batch == batch  # type: ignore[union-attr]


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(counts=st.lists(st.integers(1, 9), min_size=1, max_size=4), seed=st.integers(0, 1000))
def test_rescale_model(tmp_path_factory: pytest.TempPathFactory, counts: list[int], seed: int) -> None:
    root = tmp_path_factory.mktemp("rescale").as_uri()
    fm = open_file_manager(root)
    rng = random.Random(seed)
    model: dict[str, dict[bytes, bytes]] = {}
    layout = KeyGroupLayout(rng.randint(1, 6), GROUPS)
    version = 0
    for n in counts:
        run_batch(root, version, layout, random_updates(rng, model))
        version += 1
        execute_rescale(fm, plan_rescale(fm, OP, n))
        version += 1
        layout = KeyGroupLayout(n, GROUPS)
        assert read_all(root, version, layout) == clean(model)


def test_rescale_of_a_legacy_layout_moves_every_group(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Partitions of a record without a layout may hold any group: every range of every one is read."""
    root = tmp_path_factory.mktemp("legacy").as_uri()
    fm = open_file_manager(root)
    keys = [stored(b"k%d" % i) for i in range(50)]
    ids = []
    for p in range(3):
        with StateStore(root, OP, p) as s:
            s.load(0)
            for k in keys[p::3]:  # routed by something else than key groups
                s.put(k, b"x")
            ids.append(s.commit().checkpoint_id)
    CommitLog(fm).commit(1, {OP: ids})
    with pytest.raises(ConfigurationError, match="max_key_groups"):
        plan_rescale(fm, OP, 2)
    plan = plan_rescale(fm, OP, 2, max_key_groups=GROUPS)
    assert plan.source_layout is None and plan.moved_groups() == GROUPS
    execute_rescale(fm, plan)
    assert read_all(root, 2, KeyGroupLayout(2, GROUPS)) == {"default": dict.fromkeys(keys, b"x")}


def test_rollback_then_restart_equals_the_rolled_back_history(checkpoint_root: str) -> None:
    fm = open_file_manager(checkpoint_root)
    rng = random.Random(3)
    model: dict[str, dict[bytes, bytes]] = {}
    history = [clean(model)]
    layout = KeyGroupLayout(3, GROUPS)
    for version in range(3):
        run_batch(checkpoint_root, version, layout, random_updates(rng, model))
        history.append(clean(model))
    execute_rescale(fm, plan_rescale(fm, OP, 5))  # version 4: a rescale lies between
    layout5 = KeyGroupLayout(5, GROUPS)
    run_batch(checkpoint_root, 4, layout5, random_updates(rng, model))  # version 5
    result = execute_rescale(fm, plan_rollback(fm, OP, 2))
    record = CommitLog(fm).get(6)
    assert result.committed and record is not None
    assert record.change == {OP: "rollback"} and record.layouts[OP] == layout and record.batch == 1
    assert read_all(checkpoint_root, 6, layout) == history[2]
    # the versions after the rolled-back one stay readable until expiry removes them
    assert read_all(checkpoint_root, 5, layout5) == clean(model)
    model = {cf: dict(kv) for cf, kv in history[2].items()}
    run_batch(checkpoint_root, 6, layout, random_updates(rng, model))  # the re-run of batch 2
    assert read_all(checkpoint_root, 7, layout) == clean(model)
    assert CommitLog(fm).get(7).batch == 2  # type: ignore[union-attr]


def test_rollback_refuses_the_head_and_missing_versions(tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("rb").as_uri()
    fm = open_file_manager(root)
    run_batch(root, 0, KeyGroupLayout(1, GROUPS), {"default": {stored(b"a"): b"1"}})
    with pytest.raises(ConfigurationError, match="below the head"):
        plan_rollback(fm, OP, 1)


@pytest.mark.parametrize("workers", [1, 2])
def test_unsnapshotted_sources_are_each_read_once(tmp_path_factory: pytest.TempPathFactory, workers: int) -> None:
    """Sources that replay their changelogs (no snapshot; puts and deletes over three batches) are each read
    once, also the one a partition kept in place took its groups from: the bytes read are the source changelogs
    once each, and the new layout holds exactly the model."""
    root = tmp_path_factory.mktemp("once").as_uri()
    fm = open_file_manager(root)
    rng = random.Random(5)
    model: dict[str, dict[bytes, bytes]] = {}
    layout = KeyGroupLayout(4, GROUPS)
    for version in range(3):
        run_batch(root, version, layout, random_updates(rng, model))
    plan = plan_rescale(fm, OP, 8)
    assert plan.kept_in_place(), "partition 0 keeps key groups in place: its old store is also a source"
    commits = CommitLog(fm)
    changelogs = sum(
        fm.info(StoreId(OP, p).changelog(v, commits.committed_id(v, OP, p))).size for v in (1, 2, 3) for p in range(4)
    )
    result = execute_rescale(fm, plan, workers=workers)
    assert result.bytes_read == changelogs, "each source partition's changelogs are read exactly once"
    assert read_all(root, plan.new_version, KeyGroupLayout(8, GROUPS)) == clean(model)


def test_bytes_written_scale_with_the_moved_key_groups(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The same snapshotted state rescaled 4 -> n for several n: the records copied are exactly those of the key groups
    that change owner, the records deleted in place exactly those a kept partition gave away, and the bytes
    written per moved group are about the same every time (a full rewrite is what a rollback writes)."""
    rng = random.Random(11)
    per_group = 20
    state = {group_prefix(g) + b"key%04d" % i: rng.randbytes(200) for g in range(GROUPS) for i in range(per_group)}
    layout = KeyGroupLayout(4, GROUPS)
    base = tmp_path_factory.mktemp("moved")
    run_batch(base.as_uri(), 0, layout, {"default": dict(state)})
    run_batch(base.as_uri(), 1, layout, {"default": {}})
    full = execute_rescale(open_file_manager(base.as_uri()), plan_rollback(open_file_manager(base.as_uri()), OP, 1))
    snapshot_all(base.as_uri(), 3, 4)
    per_group_full = full.bytes_written / GROUPS
    assert full.records == len(state)
    ratios = []
    for n in (5, 8, 2, 3, 16):
        root = tmp_path_factory.mktemp(f"to{n}")
        shutil.copytree(base, root, dirs_exist_ok=True)
        fm = open_file_manager(root.as_uri())
        plan = plan_rescale(fm, OP, n)
        target = KeyGroupLayout(n, GROUPS)
        moved = plan.moved_groups()
        assert 0 < moved < GROUPS
        result = execute_rescale(fm, plan)
        assert result.records == moved * per_group, "only the moved key groups are copied"
        given_away = sum(
            1 for g in range(GROUPS) if layout.owner(g) in plan.kept_in_place() and target.owner(g) != layout.owner(g)
        )
        assert result.deleted == given_away * per_group
        assert result.bytes_read > 0
        ratios.append(result.bytes_written / (moved * per_group_full))
        assert read_all(root.as_uri(), plan.new_version, target) == {"default": state}
    assert all(0.8 < r < 1.3 for r in ratios), ratios


def test_partitions_written_from_empty_hold_their_ranges_as_sst_files(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Copied from snapshotted sources, a moved range is one SST file, logged in the changelog as it is: the
    first load of a partition written from empty ingests it (one changelog, no record decoded) and the state is exact;
    a flipped bit inside that block is refused naming the changelog (its CRC covers the whole file)."""
    rng = random.Random(5)
    state = {stored(b"key%d" % i): rng.randbytes(40) for i in range(300)}
    layout, target = KeyGroupLayout(4, GROUPS), KeyGroupLayout(6, GROUPS)
    base = tmp_path_factory.mktemp("sst-blocks")
    run_batch(base.as_uri(), 0, layout, {"default": dict(state)})
    snapshot_all(base.as_uri(), 1, 4)
    fm = open_file_manager(base.as_uri())
    result = execute_rescale(fm, plan_rescale(fm, OP, 6))
    version = result.plan.new_version
    record = CommitLog(fm).get(version)
    assert record is not None
    full = [p for p in range(6) if p not in record.in_place[OP]]
    assert full
    for p in full:
        path = StoreId(OP, p).changelog(version, result.checkpoint_ids[p])
        with fm.open(path) as f:
            entries = list(ChangelogReader(f, path).entries(None))
        assert entries and all(isinstance(e, SstFile) and e.cf == "default" for e in entries), entries
        with StateStore(fm, OP, p) as s:
            s.load(version)
            assert s.last_plan is not None and s.last_plan.manifest_path() is None
            assert s.last_plan.replay == ((version, result.checkpoint_ids[p]),)
    assert read_all(base.as_uri(), version, target) == {"default": state}

    path = StoreId(OP, full[0]).changelog(version, result.checkpoint_ids[full[0]])
    data = bytearray((base / path).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (base / path).write_bytes(bytes(data))
    with StateStore(fm, OP, full[0]) as s, pytest.raises(CorruptFileError, match=r"an SST file") as err:
        s.load(version)
    assert path in str(err.value)


def test_a_stale_lent_source_is_read_from_the_root(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A source lent by its caller (a Spark worker's cached store) that remembers another root's commits
    (the root was deleted and written again under a warm worker) is not trusted: the source is loaded
    from the root instead, and the lent store stays the caller's."""
    layout = KeyGroupLayout(4, GROUPS)
    base = tmp_path_factory.mktemp("stale-lent")
    root = base / "root"
    run_batch(root.as_uri(), 0, layout, {"default": {stored(b"key%d" % i): b"old" for i in range(200)}})
    lent = StateStore(root.as_uri(), OP, 1, config=StoreConfig(local_dir=str(base / "worker"))).load(1)
    shutil.rmtree(root)
    fresh: dict[bytes, bytes | None] = {stored(b"key%d" % i): b"new" for i in range(200)}
    run_batch(root.as_uri(), 0, layout, {"default": dict(fresh)})
    fm = open_file_manager(root.as_uri())
    plan = plan_rescale(fm, OP, 6)
    sources = SourceStores(fm, plan, StoreConfig(), lambda q: lent if q == 1 else None)
    try:
        src, read = sources.get(1)
        assert src is not lent and read > 0
        lo, hi = layout.groups_of(1)
        assert dict(src.items()) == {k: v for k, v in fresh.items() if lo <= group_at(k) < hi}
    finally:
        sources.close()
    lent.close()


def test_rescale_on_processes_equals_the_model(checkpoint_root: str) -> None:
    """Built on processes (what `statekeeper rescale` runs: this one and spawned ones, a run of new
    partitions each), unsnapshotted sources (relayed) and then snapshotted ones (copied) re-lay out to
    exactly the model, on local disk and S3."""
    fm = open_file_manager(checkpoint_root)
    rng = random.Random(11)
    model: dict[str, dict[bytes, bytes]] = {}
    layout, version = KeyGroupLayout(3, GROUPS), 0
    for n, snapshotted in ((7, False), (2, True)):
        for _ in range(2):
            run_batch(checkpoint_root, version, layout, random_updates(rng, model))
            version += 1
        if snapshotted:
            snapshot_all(checkpoint_root, version, layout.partitions)
        result = execute_rescale(fm, plan_rescale(fm, OP, n), runner=in_processes(2))
        assert result.committed and result.relayed == (0 if snapshotted else n)
        version, layout = version + 1, KeyGroupLayout(n, GROUPS)
        assert read_all(checkpoint_root, version, layout) == clean(model)


def test_a_build_failing_in_another_process_commits_nothing(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A corrupt source read by a spawned build process fails the rescale with the store's own error (naming the
    file), before the commit record: the head and its layout stay."""
    base = tmp_path_factory.mktemp("child-fails")
    root = base.as_uri()
    fm = open_file_manager(root)
    layout = KeyGroupLayout(2, GROUPS)
    run_batch(root, 0, layout, {"default": {stored(b"k%d" % i): b"v" for i in range(300)}})
    path = StoreId(OP, 0).changelog(1, CommitLog(fm).committed_id(1, OP, 0))
    data = bytearray((base / path).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (base / path).write_bytes(bytes(data))
    # runs [0, 1] and [2, 3]: old partition 0 is read by the first run, which a spawned process builds
    with pytest.raises(CorruptFileError) as err:
        execute_rescale(fm, plan_rescale(fm, OP, 4), runner=in_processes(2))
    assert path in str(err.value)
    assert CommitLog(fm).latest() == 1


def _dies_elsewhere(parent: int, run: list[int]) -> list[PartitionBuild]:
    if os.getpid() != parent:
        os._exit(3)
    return []


def test_a_build_process_that_dies_fails_the_rescale() -> None:
    """A build process that ends without answering (killed, out of memory) is a `RescaleError` naming its
    partitions, not a hang or a bare pool error."""
    run = in_processes(2)
    with pytest.raises(RescaleError, match=r"the process building new partitions \[0, 1\] ended"):
        run(functools.partial(_dies_elsewhere, os.getpid()), [0, 1, 2, 3])


def _built_here(run: list[int]) -> list[PartitionBuild]:
    """Builds that say which process made them (their checkpoint id: its pid)."""
    return [PartitionBuild(p, str(os.getpid()), False, 0, 0, 0, 0, 0.0) for p in run]


def _builders_seen_by_a_daemon(out: multiprocessing.queues.Queue[list[str]]) -> None:
    try:
        out.put(sorted({b.checkpoint_id for b in in_processes(2)(_built_here, [0, 1, 2, 3])} | {f"me {os.getpid()}"}))
    except Exception as e:
        out.put([f"failed: {e!r}"])


def test_processes_build_in_several_and_a_daemonic_process_on_threads() -> None:
    """More than one CPU: some runs are built in other processes. A daemonic process (which may not start any,
    as a multiprocessing pool's worker) builds them all itself, on threads, instead of failing."""
    if len(os.sched_getaffinity(0)) > 1:
        pids = {b.checkpoint_id for b in in_processes(2)(_built_here, [0, 1, 2, 3])}
        assert str(os.getpid()) in pids and len(pids) == 2
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    daemon = context.Process(target=_builders_seen_by_a_daemon, args=(out,), daemon=True)
    daemon.start()
    seen = out.get(timeout=60)
    daemon.join(60)
    me = seen.pop()
    assert me.startswith("me ") and seen == [me.removeprefix("me ")], "every build ran in the daemonic process"


def _fails_elsewhere(parent: int, error: Exception, run: list[int]) -> list[PartitionBuild]:
    if os.getpid() != parent:
        raise error
    return []


@pytest.mark.parametrize(
    ("error", "raised"),
    [
        (CheckpointWriteError("agg/1/2.changelog", OSError(28, "No space left on device")), CheckpointWriteError),
        (KeyError("a bug"), RescaleError),
    ],
)
def test_an_error_in_a_build_process_crosses_back(error: Exception, raised: type[Exception]) -> None:
    """A statekeeper error raised in a build process reaches the rescaling process as it is (whatever its
    constructor takes: the disk-full error carries its path and errno); any other as a `RescaleError` naming it."""
    with pytest.raises(raised) as got:
        in_processes(2)(functools.partial(_fails_elsewhere, os.getpid(), error), [0, 1, 2, 3])
    if isinstance(error, CheckpointWriteError):
        assert isinstance(got.value, CheckpointWriteError)
        assert got.value.errno == 28 and got.value.path == "agg/1/2.changelog"
    else:
        assert "KeyError" in str(got.value) and "[0, 1]" in str(got.value)
