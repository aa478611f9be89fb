"""Model-based test of the store: random histories against a plain dict model.

Several partitions run batches of puts and deletes over a few column families; partitions commit
one or more attempts per batch (retries with fresh ids), some attempts abort, the "driver" commits
one winning id per partition; snapshots are taken of random committed versions, local working
directories are wiped, and any committed version can be loaded and must equal the model.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from statekeeper.store import CommitLog, LineageError, StateStore, StoreConfig, StoreStateError
from statekeeper.store.snapshot import write_snapshot
from tests.model_steps import CountedSteps, scaled

OPERATOR = "agg"
PARTITIONS = 3
CFS = ["default", "counts", "lists"]
keys = st.binary(min_size=0, max_size=3).map(lambda b: b"k" + b)
values = st.binary(min_size=0, max_size=40)
HOW = ["one", "batch", "sorted", "range"]
"""How an op is applied: alone, in a `put_batch` run, in a `put_sorted` bulk load, or as a
`delete_range` from its key (to the key its value spells, or through the last key)."""

State = dict[str, dict[bytes, bytes]]
STATS = {"batches": 0}


def copy_state(s: State) -> State:
    return {cf: dict(kv) for cf, kv in s.items()}


def normalise(s: State) -> State:
    return {cf: kv for cf, kv in s.items() if kv}


def store_content(store: StateStore) -> State:
    return normalise({cf: dict(store.items(cf=cf)) for cf in store.column_families()})


class StoreMachine(CountedSteps, RuleBasedStateMachine):
    model_name = "store"
    root_base = ""  # set by the test: the checkpoint root fixture's URI

    @initialize()
    def setup(self) -> None:
        self.root = f"{self.root_base.rstrip('/')}/{uuid.uuid4().hex[:12]}"  # a fresh root per example
        self.work = tempfile.mkdtemp(prefix="sk-model-")
        self.config = StoreConfig(block_bytes=1024, max_lineage=3, snapshot_check_interval=2)
        self.instances = [self._new_instance(p) for p in range(PARTITIONS)]
        self.commit_log = CommitLog(self.instances[0].fm)
        # committed[v][p] = (checkpoint id, state); version 0 is the empty state
        self.committed: list[list[tuple[str, State]]] = [[("", {}) for _ in range(PARTITIONS)]]
        self.candidates: list[list[tuple[str, State]]] = [[] for _ in range(PARTITIONS)]
        self.snapshotted: set[tuple[int, int]] = set()

    def _new_instance(self, p: int) -> StateStore:
        local = tempfile.mkdtemp(prefix=f"p{p}-", dir=self.work)
        return StateStore(self.root, OPERATOR, p, config=StoreConfig(**{**self.config.__dict__, "local_dir": local}))

    @property
    def latest(self) -> int:
        return len(self.committed) - 1

    def teardown(self) -> None:
        for inst in getattr(self, "instances", []):
            inst.close()
        shutil.rmtree(getattr(self, "work", ""), ignore_errors=True)

    # -- a batch ---------------------------------------------------------------------------------
    @rule(
        p=st.integers(0, PARTITIONS - 1),
        ops=st.lists(
            st.tuples(st.sampled_from(CFS), keys, st.one_of(st.none(), values), st.sampled_from(HOW)),
            max_size=40,
        ),
        outcome=st.sampled_from(["commit", "commit", "commit", "abort"]),
    )
    def task_attempt(self, p: int, ops: list[tuple[str, bytes, bytes | None, str]], outcome: str) -> None:
        """One task attempt of the current batch on partition p: load, update, commit or abort."""
        v = self.latest
        ckpt, state = self.committed[v][p]
        store = self.instances[p].load(v, ckpt or None)
        assert store_content(store) == normalise(state)
        model = copy_state(state)
        i = 0
        while i < len(ops):
            cf, _, _, how = ops[i]
            if how == "range":
                _, start, val, _ = ops[i]
                end = None if val is None else b"k" + val[:3]
                store.delete_range(start, end, cf=cf)
                for k in [k for k in model.get(cf, {}) if start <= k and (end is None or k < end)]:
                    del model[cf][k]
                i += 1
                continue
            if how != "one":  # a run of ops on one column family through the batch API
                run = [o for o in ops[i : i + 8] if o[0] == cf]
                dels = [k for _, k, val, _ in run if val is None]
                puts = [(k, pv) for _, k, pv, _ in run if pv is not None]
                store.delete_batch(dels, cf=cf)
                if how == "sorted":  # a bulk copy: strictly increasing keys
                    puts = sorted(dict(puts).items())
                    assert store.put_sorted(iter(puts), cf=cf) == len(puts)
                else:
                    store.put_batch([k for k, _ in puts], [pv for _, pv in puts], cf=cf)
                for k in dels:
                    model.setdefault(cf, {}).pop(k, None)
                for k, pv in puts:
                    model.setdefault(cf, {})[k] = pv
                i += 8
                continue
            _, k, val, _ = ops[i]
            if val is None:
                store.delete(k, cf=cf)
                model.setdefault(cf, {}).pop(k, None)
            else:
                store.put(k, val, cf=cf)
                model.setdefault(cf, {})[k] = val
            assert store.get(k, cf=cf) == model[cf].get(k)  # read your writes
            i += 1
        assert store_content(store) == normalise(model)
        if outcome == "abort":
            store.abort()
            return
        result = store.commit()
        assert result.version == v + 1
        self.candidates[p].append((result.checkpoint_id, model))

    @rule(data=st.data())
    def driver_commits_batch(self, data: st.DataObject) -> None:
        """Partitions without a committed attempt yet run one (no updates); then the driver commits."""
        for p, cands in enumerate(self.candidates):
            if not cands:
                self.task_attempt(p, [], "commit")
        chosen = [data.draw(st.sampled_from(c)) for c in self.candidates]
        v = self.latest + 1
        self.commit_log.commit(v, {OPERATOR: [ckpt for ckpt, _ in chosen]})
        self.committed.append(chosen)
        STATS["batches"] += 1
        self.candidates = [[] for _ in range(PARTITIONS)]

    # -- recovery and maintenance ------------------------------------------------------------------
    @rule(p=st.integers(0, PARTITIONS - 1), data=st.data())
    def load_any_committed_version(self, p: int, data: st.DataObject) -> None:
        v = data.draw(st.integers(0, self.latest))
        ckpt, state = self.committed[v][p]
        store = self.instances[p].load(v, ckpt or None)
        assert store_content(store) == normalise(state)
        cf, size = data.draw(st.sampled_from(CFS)), data.draw(st.integers(1, 5))
        start, end = data.draw(st.one_of(st.none(), keys)), data.draw(st.one_of(st.none(), keys))
        in_range = [
            (k, v)
            for k, v in sorted(state.get(cf, {}).items())
            if (start is None or k >= start) and (end is None or k < end)
        ]
        chunks = list(store.chunks(start, end, size=size, cf=cf)) if cf in store.column_families() else []
        assert all(0 < len(ks) == len(vs) <= size for ks, vs in chunks)
        assert [kv for ks, vs in chunks for kv in zip(ks, vs, strict=True)] == in_range  # bulk reads
        store.abort()

    @rule(p=st.integers(0, PARTITIONS - 1))
    def wipe_local_directory(self, p: int) -> None:
        self.instances[p].close()
        shutil.rmtree(self.instances[p].local_dir, ignore_errors=True)
        self.instances[p] = self._new_instance(p)

    @precondition(lambda self: self.latest > 0)
    @rule(p=st.integers(0, PARTITIONS - 1), data=st.data())
    def snapshot(self, p: int, data: st.DataObject) -> None:
        v = data.draw(st.integers(1, self.latest))
        if (v, p) in self.snapshotted:
            return
        ckpt, state = self.committed[v][p]
        maint = self._new_instance(p)
        try:
            maint.load(v, ckpt)
            assert store_content(maint) == normalise(state)
            maint.abort()
            write_snapshot(maint.fm, maint.store_id, v, ckpt, maint.db, maint.local_dir)
        finally:
            maint.close()
        self.snapshotted.add((v, p))

    @rule(p=st.integers(0, PARTITIONS - 1), data=st.data())
    def loading_a_losing_attempt_is_refused(self, p: int, data: st.DataObject) -> None:
        if self.latest == 0:
            return
        v = data.draw(st.integers(1, self.latest))
        probe = self._new_instance(p)
        try:
            with pytest.raises(LineageError):
                probe.load(v, "0" * 32)
        finally:
            probe.close()

    @invariant()
    def commit_log_matches_model(self) -> None:
        if hasattr(self, "commit_log"):
            assert self.commit_log.latest() == self.latest


def test_store_matches_model(checkpoint_root: str, request: pytest.FixtureRequest) -> None:
    class Machine(StoreMachine):
        root_base = checkpoint_root

    # Every S3 step is several HTTP round trips to the S3 server: fewer examples there, fewest on the
    # second S3 implementation (s3rver); the formats and lineage logic under test are the same.
    backend = request.node.callspec.params["checkpoint_root"]
    Machine.TestCase.settings = settings(
        max_examples=scaled({"local": 40, "s3": 12}.get(backend, 4)),
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    before = STATS["batches"]
    Machine.TestCase().runTest()
    assert STATS["batches"] - before > 10, "the machine should commit many batches"


def test_column_family_handles_survive_reloads(tmp_path) -> None:
    root = tmp_path.as_uri()
    store = StateStore(root, "agg", 0, config=StoreConfig(local_dir=str(tmp_path / "work")))
    counts = store.load(0).column_family("counts")
    counts.put(b"a", b"1")
    r1 = store.commit()
    CommitLog(store.fm).commit(1, {"agg": [r1.checkpoint_id]})
    store.load(1, r1.checkpoint_id)  # warm
    assert counts.get(b"a") == b"1"
    counts.put(b"b", b"2")
    store.abort()  # the next load rebuilds the local DB from the checkpoint
    store.load(1, r1.checkpoint_id)
    assert store.last_load is not None and not store.last_load.reused_local
    assert counts.get(b"a") == b"1" and counts.get(b"b") is None
    store.close()


def test_abort_without_updates_keeps_the_local_copy_warm(tmp_path) -> None:
    store = StateStore(tmp_path.as_uri(), "agg", 0, config=StoreConfig(local_dir=str(tmp_path / "work")))
    store.load(0).put(b"a", b"1")
    r1 = store.commit()
    CommitLog(store.fm).commit(1, {"agg": [r1.checkpoint_id]})
    store.load(1, r1.checkpoint_id)
    assert store.get(b"a") == b"1"
    store.abort()  # read only: nothing to undo
    store.load(1, r1.checkpoint_id)
    assert store.last_load is not None and store.last_load.reused_local
    store.delete(b"a")
    store.abort()  # the delete went into the local DB: the next load must rebuild
    store.load(1, r1.checkpoint_id)
    assert store.last_load is not None and not store.last_load.reused_local
    assert store.get(b"a") == b"1"
    store.close()


def test_load_catches_up_an_older_local_copy_by_replaying_only_the_gap(tmp_path) -> None:
    root = tmp_path.as_uri()
    first = StateStore(root, "agg", 0, config=StoreConfig(local_dir=str(tmp_path / "first")))
    later = StateStore(root, "agg", 0, config=StoreConfig(local_dir=str(tmp_path / "later")))
    log = CommitLog(first.fm)
    for v in range(5):  # `first` commits version 1, `later` versions 2..5
        store = first if v == 0 else later
        store.load(v)
        store.put(b"k%d" % v, b"v%d" % v)
        store.delete(b"k%d" % (v - 1))
        log.commit(v + 1, {"agg": [store.commit().checkpoint_id]})
    first.load(5)  # the local copy holds committed version 1: replay versions 2..5 only
    assert first.last_load is not None
    assert first.last_load.reused_local and first.last_load.replayed_changelogs == 4
    assert dict(first.items()) == {b"k4": b"v4"}
    first.abort()
    later.load(5)
    later.put(b"k9", b"v9")
    later.abort()  # an aborted attempt with updates leaves the local copy unknown: the next load rebuilds
    later.load(3)
    assert later.last_load is not None and not later.last_load.reused_local
    assert dict(later.items()) == {b"k2": b"v2"}
    first.close()
    later.close()


def test_a_bulk_load_out_of_key_order_is_refused_and_abandons_its_attempt(tmp_path) -> None:
    local = tmp_path / "local"
    store = StateStore((tmp_path / "root").as_uri(), "agg", 0, config=StoreConfig(local_dir=str(local))).load(0)
    store.put(b"a", b"1")
    with pytest.raises(StoreStateError, match="strict ascending order") as err:
        store.put_sorted([(b"b", b"2"), (b"d", b"4"), (b"c", b"3")])
    assert "'default' of agg/0" in str(err.value)
    with pytest.raises(StoreStateError, match="without load"):
        store.commit()  # the changelog may hold what the DB does not: nothing of it commits
    assert local.is_dir() and not list(local.glob("**/ingest-*"))  # its SST file is gone
    store.load(0)
    assert dict(store.items()) == {}
    store.close()
