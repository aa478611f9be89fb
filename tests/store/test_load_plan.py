"""The load plan: which base, which changelogs, which fallbacks, at what metadata cost.

A model-based test resolves plans over random committed histories (capped lineages, snapshots on
and off the lineage) and checks them against the rule written in `statekeeper.store.load_plan`; a real store on
local disk checks that `StateStore.load` executes exactly the plan it exposes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statekeeper.store import CommitLog, StateStore, StoreConfig
from statekeeper.store.errors import LineageError
from statekeeper.store.formats.changelog import Lineage
from statekeeper.store.layout import StoreId
from statekeeper.store.load_plan import LoadSource, Ref, fall_back, resolve_load_plan
from statekeeper.store.snapshot import write_snapshot

STORE = StoreId("agg", 0)


@dataclass
class History:
    """A committed history as the checkpoint holds it: ids, capped lineages, snapshots (a `PlanSource`)."""

    latest: int
    cap: int
    snapshots: set[Ref]
    store: StoreId = STORE
    reads: list[Ref] = field(default_factory=list)

    def cid(self, v: int) -> str:
        return f"{v:032x}"

    def committed_id(self, version: int) -> str:
        if not 1 <= version <= self.latest:
            raise LineageError(f"version {version} is not committed")
        return self.cid(version)

    def read_lineage(self, version: int, checkpoint_id: str) -> Lineage:
        self.reads.append((version, checkpoint_id))
        return tuple((u, self.cid(u)) for u in range(version - 1, max(0, version - 1 - self.cap), -1))

    def list_snapshots(self) -> set[Ref]:
        return set(self.snapshots)


@st.composite
def histories(draw: st.DrawFn) -> tuple[History, int]:
    latest = draw(st.integers(1, 60))
    cap = draw(st.integers(1, 70))
    versions = draw(st.sets(st.integers(1, latest), max_size=6))
    snaps = {(v, f"{v:032x}") for v in versions}
    snaps |= {(v, "f" * 32) for v in draw(st.sets(st.integers(1, latest), max_size=2))}  # losing attempts
    return History(latest, cap, snaps), draw(st.integers(1, latest))


@given(histories())
@settings(max_examples=300, deadline=None)
def test_plans_follow_the_rule(case: tuple[History, int]) -> None:
    h, version = case
    plan = resolve_load_plan(h, version, h.cid(version))
    on_lineage = sorted(v for v, c in h.snapshots if v <= version and c == h.cid(v))
    base = on_lineage[-1] if on_lineage else 0
    assert (plan.base[0] if plan.base else 0) == base
    assert plan.source is (LoadSource.SNAPSHOT if base else LoadSource.EMPTY)
    assert plan.replay == tuple((v, h.cid(v)) for v in range(base + 1, version + 1))
    # O(1) metadata: one header read per `cap` lineage entries walked (none when the target is the base)
    entries = version - base if base else version - 1
    assert len(h.reads) == -(-entries // h.cap)
    older = [(v, h.cid(v)) for v in reversed(on_lineage[:-1])]
    if base:
        assert [f for f in plan.fallbacks if f is None or f[1] == h.cid(f[0])] == [*older, None]
    else:
        assert plan.fallbacks == ()
    # Falling back past each bad snapshot takes the next older one on the lineage, then version 0.
    for expected in [*older, None]:
        if plan.base is None:
            break
        plan = fall_back(h, plan, f"manifest of {plan.base[0]}", "test")
        assert plan.base == expected
        start = plan.base[0] if plan.base else 0
        assert plan.replay == tuple((v, h.cid(v)) for v in range(start + 1, version + 1))
    assert plan.base is None and plan.repairs == len(on_lineage)
    with pytest.raises(LineageError):
        fall_back(h, plan, "nothing", "test")


def test_a_commit_that_is_not_committed_is_refused() -> None:
    h = History(5, 10, set())
    with pytest.raises(LineageError, match="not the committed one"):
        resolve_load_plan(h, 3, "a" * 32)


def test_catch_up_and_reuse_plans() -> None:
    h = History(9, 100, {(4, f"{4:032x}")})
    assert resolve_load_plan(h, 9, h.cid(9), local=(9, h.cid(9))).source is LoadSource.REUSE
    plan = resolve_load_plan(h, 9, h.cid(9), local=(6, h.cid(6)))
    assert plan.source is LoadSource.CATCH_UP and [v for v, _ in plan.replay] == [7, 8, 9]
    off = resolve_load_plan(h, 9, h.cid(9), local=(6, "e" * 32))  # not on the lineage: rebuild
    assert off.source is LoadSource.SNAPSHOT and off.base == (4, h.cid(4))


def test_store_executes_the_plan_it_exposes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = str(tmp_path / "root")
    s = StateStore(root, "agg", 0, config=StoreConfig(local_dir=str(tmp_path / "w")))
    log = CommitLog(s.fm)
    ids: dict[int, str] = {}
    for v in range(1, 8):
        s.load(v - 1, ids.get(v - 1))
        s.put(b"k%d" % v, b"v%d" % v)
        ids[v] = s.commit().checkpoint_id
        log.commit(v, {"agg": [ids[v]]})
        if v == 4:
            write_snapshot(s.fm, s.store_id, v, ids[v], s.db, s.local_dir)
    s.close()
    probe = StateStore(root, "agg", 0, config=StoreConfig(local_dir=str(tmp_path / "p")))
    try:
        plan = probe.plan_load(7)
        assert plan.base == (4, ids[4]) and [v for v, _ in plan.replay] == [5, 6, 7]
        assert plan.fallbacks == (None,) and plan.manifest_path() == probe.store_id.manifest(4, ids[4])
        with caplog.at_level(logging.DEBUG, logger="statekeeper.store.loading"):
            probe.load(7)
        assert plan.describe() in caplog.text  # the plan is logged at debug level
        assert probe.last_plan == plan
        assert probe.last_load is not None and probe.last_load.snapshot_version == 4
        assert probe.last_load.replayed_changelogs == 3 and probe.last_load.repaired_snapshots == 0
        assert dict(probe.items()) == {b"k%d" % v: b"v%d" % v for v in range(1, 8)}
    finally:
        probe.close()
