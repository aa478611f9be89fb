"""A load racing expiry at the default `load_grace_seconds` (0): a newer snapshot becomes the base at
once and expiry deletes what an older plan names; the load notices (a file it was about to read is
gone and a fresh listing has a newer base) and starts over from that base, instead of taking the
gap for a broken checkpoint."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from statekeeper.maintenance.expiry import expire_versions
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_builds import create_snapshots
from statekeeper.store import CorruptFileError, StateStore, StoreConfig, VersionExpiredError
from statekeeper.store.layout import StoreId
from statekeeper.store.load_plan import LoadPlan, LoadSource, Ref
from tests.maintenance.helpers import History, content


@pytest.fixture
def head_only(settings: MaintenanceSettings) -> MaintenanceSettings:
    """Retain the newest version only: a snapshot of it is the base, everything before it expires."""
    assert settings.load_grace_seconds == MaintenanceSettings().load_grace_seconds == 0
    return replace(settings, min_versions_to_retain=1)


@pytest.fixture
def open_probe() -> Iterator[Callable[[History, StoreId], StateStore]]:
    """A second store instance on a history's store (its own local dir), closed and removed at teardown."""
    opened: list[StateStore] = []

    def open_(h: History, store: StoreId) -> StateStore:
        opened.append(h._instance(store, "probe"))
        return opened[-1]

    yield open_
    for probe in opened:
        probe.close()
        shutil.rmtree(probe.local_dir, ignore_errors=True)


def _snapshot_and_expire(h: History, settings: MaintenanceSettings) -> None:
    assert create_snapshots(h.fm, settings).snapshots > 0
    report = expire_versions(h.fm, settings)
    assert report.ok and report.changelogs > 0, report.errors


@pytest.mark.parametrize("race", ["after-planning", "while-planning"])
def test_a_cold_load_whose_snapshot_expires_after_it_listed_starts_over_from_the_newer_one(
    make_history: Callable[..., History],
    head_only: MaintenanceSettings,
    open_probe: Callable[[History, StoreId], StateStore],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    race: str,
) -> None:
    """Expiry runs between the load's listing of the snapshots and its reads: after the plan is made
    (the snapshot and changelogs it names are gone), or within it (the changelog headers it walks)."""
    h = make_history()
    h.batches(5)
    assert create_snapshots(h.fm, head_only).snapshots > 0
    h.batches(6)
    store, latest = h.stores[0], h.latest
    probe = open_probe(h, store)
    listed = probe.plan_source.list_snapshots
    planned = probe.plan_load
    raced: list[set[Ref]] = []

    def listed_then_expired() -> set[Ref]:
        snaps = listed()
        if not raced:
            raced.append(snaps)
            if race == "while-planning":
                _snapshot_and_expire(h, head_only)
        return snaps

    def planned_then_expired(version: int, checkpoint_id: str | None = None, *, use_local: bool = True) -> LoadPlan:
        plan = planned(version, checkpoint_id, use_local=use_local)
        if race == "after-planning" and len(raced) == 1:
            raced.append(set())
            assert (plan.source, plan.base and plan.base[0]) == (LoadSource.SNAPSHOT, 5)
            _snapshot_and_expire(h, head_only)
        return plan

    monkeypatch.setattr(probe.plan_source, "list_snapshots", listed_then_expired)
    monkeypatch.setattr(probe, "plan_load", planned_then_expired)
    ckpt, state = h.committed[latest][store]
    with caplog.at_level(logging.WARNING, logger="statekeeper.store.loading"):
        probe.load(latest, ckpt)
    assert content(probe) == state
    assert [v for v, _ in raced[0]] == [5], "the load listed the older snapshot only"
    load = probe.last_load
    assert load is not None and (load.replans, load.snapshot_version, load.repaired_snapshots) == (1, latest, 0)
    repairs = [r for r in caplog.records if r.name == "statekeeper.store.loading"]
    assert not repairs, "a race with expiry is not a broken snapshot"


@pytest.mark.parametrize("race", ["after-planning", "after-restoring"])
def test_a_load_of_a_version_that_leaves_retention_while_it_loads_says_so(
    make_history: Callable[..., History],
    head_only: MaintenanceSettings,
    open_probe: Callable[[History, StoreId], StateStore],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    race: str,
) -> None:
    """Loading an old version (a reader slower than the writer): after it planned from the snapshot of
    version 5 (or restored it, before replaying the changelogs after it), expiry makes the newest version
    the base and deletes everything below it, the version being loaded included. The load fails naming the
    expired manifest as `VersionExpiredError` (a `FileNotFoundError`), not as a corrupt checkpoint: no
    repair is logged."""
    h = make_history()
    h.batches(5)
    assert create_snapshots(h.fm, head_only).snapshots > 0
    h.batches(6)
    store, version = h.stores[0], 7
    probe = open_probe(h, store)
    planned, replayed = probe.plan_load, probe._replay_all

    def planned_then_expired(v: int, checkpoint_id: str | None = None, *, use_local: bool = True) -> LoadPlan:
        plan = planned(v, checkpoint_id, use_local=use_local)
        assert (plan.source, plan.base and plan.base[0]) == (LoadSource.SNAPSHOT, 5)
        if race == "after-planning":
            _snapshot_and_expire(h, head_only)
        return plan

    def expired_then_replayed(plan: LoadPlan) -> int:
        _snapshot_and_expire(h, head_only)
        return replayed(plan)

    monkeypatch.setattr(probe, "plan_load", planned_then_expired)
    monkeypatch.setattr(probe, "_replay_all", expired_then_replayed if race == "after-restoring" else replayed)
    expired = pytest.raises(VersionExpiredError, match=f"version {version} of store .* left retention")
    with caplog.at_level(logging.WARNING, logger="statekeeper.store.loading"), expired as e:
        probe.load(version, h.committed[version][store][0])
    assert not isinstance(e.value, CorruptFileError) and isinstance(e.value, FileNotFoundError)
    assert e.value.path is not None and e.value.path.endswith(store.manifest(5, h.committed[5][store][0]))
    assert not [r for r in caplog.records if r.name == "statekeeper.store.loading"], "no repair was attempted"


def test_a_manifest_deleted_by_hand_with_an_older_path_left_is_still_a_repair(
    make_history: Callable[..., History],
    head_only: MaintenanceSettings,
    open_probe: Callable[[History, StoreId], StateStore],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The contrast: the planned base's manifest goes missing after planning, but nothing expired (every
    changelog since version 1 is there), so the load falls back and repairs instead of saying expired."""
    h = make_history()
    h.batches(5)
    assert create_snapshots(h.fm, head_only).snapshots > 0
    h.batches(2)
    store, version = h.stores[0], 7
    probe = open_probe(h, store)
    planned = probe.plan_load

    def planned_then_deleted(v: int, checkpoint_id: str | None = None, *, use_local: bool = True) -> LoadPlan:
        plan = planned(v, checkpoint_id, use_local=use_local)
        manifest = plan.manifest_path()
        assert manifest is not None and plan.base is not None and plan.base[0] == 5
        h.fm.delete_many([manifest])
        return plan

    monkeypatch.setattr(probe, "plan_load", planned_then_deleted)
    ckpt, state = h.committed[version][store]
    probe.load(version, ckpt)
    assert content(probe) == state
    load = probe.last_load
    assert load is not None and (load.repaired_snapshots, load.snapshot_version) == (1, None)


def test_a_catch_up_whose_changelogs_expired_loads_the_newer_snapshot(
    make_history: Callable[..., History],
    head_only: MaintenanceSettings,
    open_probe: Callable[[History, StoreId], StateStore],
) -> None:
    """An executor that last ran the partition a few batches ago holds an older version locally; the
    changelogs after it were expired meanwhile (a snapshot above them is the base). The writer has not
    looked for snapshots since (`snapshot_check_interval`), so its changelogs' lineage still reaches
    the executor's version; but the commit records of that lineage expired with them, so the plan checks
    (invariant 13) see the catch-up cannot be had and start from the newer snapshot, without reading a
    changelog that is gone."""
    h = make_history(config=StoreConfig(block_bytes=1024, snapshot_check_interval=0))
    h.batches(3)
    store = h.stores[0]
    probe = open_probe(h, store)
    probe.load(3, h.committed[3][store][0])
    probe.abort()
    h.batches(6)
    assert create_snapshots(h.fm, head_only).snapshots > 0
    h.batches(1)
    keep_two = replace(head_only, min_versions_to_retain=2)  # the head's changelog stays
    assert expire_versions(h.fm, keep_two).changelogs > 0
    assert probe.plan_load(h.latest).source is LoadSource.SNAPSHOT, "it would replay the expired changelogs"
    ckpt, state = h.committed[h.latest][store]
    probe.load(h.latest, ckpt)
    assert content(probe) == state
    load = probe.last_load
    assert load is not None and (load.replans, load.snapshot_version) == (0, h.latest - 1)
