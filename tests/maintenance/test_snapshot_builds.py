"""Snapshot creation: loading from maintenance snapshots gives exactly the replayed state; replicas
replay only new changelogs; only new SSTs are uploaded."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from typing import Any

from statekeeper.maintenance.catalog_sync import rebuild_catalog, sync_catalog
from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.replica import MARKER, host_boot_id
from statekeeper.maintenance.replica_pool import close_replicas, replica_dir, work_root
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_builds import create_snapshots
from statekeeper.maintenance.sync_view import InventoryView
from statekeeper.sql import Catalog
from statekeeper.store import StateStore, StoreConfig
from tests.catalog_export import catalog_export
from tests.maintenance.helpers import History, all_files, content


def _load_latest(h: History, tmp: str) -> list[int | None]:
    """Load every store's latest version in a fresh instance; returns the snapshot versions used."""
    used = []
    for s in h.stores:
        probe = StateStore(h.fm, s.operator, s.partition, config=StoreConfig(local_dir=os.path.join(tmp, str(s))))
        try:
            ckpt, state = h.committed[h.latest][s]
            probe.load(h.latest, ckpt)
            assert content(probe) == state
            assert probe.last_load is not None
            used.append(probe.last_load.snapshot_version)
            probe.abort()
        finally:
            probe.close()
    return used


def test_snapshots_load_to_the_replayed_state(
    make_history: Callable[..., History], settings: MaintenanceSettings, tmp_path
) -> None:
    h = make_history(operators={"agg": 2, "dedup": 1})
    h.batches(6, losing=1)
    report = create_snapshots(h.fm, settings)
    assert report.ok, report.errors
    assert (report.candidates, report.snapshots, report.cold_builds) == (3, 3, 0 + 3)
    assert report.files == report.ssts_uploaded + 3 and report.bytes > 0
    assert {r["store"] for r in report.rows()} == {"agg/0", "agg/1", "dedup/0"}
    assert _load_latest(h, str(tmp_path / "a")) == [6, 6, 6]  # the loader starts from the new snapshots
    h.check_loadable(range(h.latest + 1))  # every version, snapshot or not, is still the model's

    again = create_snapshots(h.fm, settings)
    assert again.ok and again.candidates == 0 and again.snapshots == 0 and again.files == 0


def test_second_snapshot_is_warm_and_uploads_only_new_ssts(
    make_history: Callable[..., History], settings: MaintenanceSettings, tmp_path
) -> None:
    h = make_history(keys=400)
    h.batches(5)
    first = create_snapshots(h.fm, settings)
    assert first.snapshots == 2 and first.cold_builds == 2
    h.batches(4)
    second = create_snapshots(h.fm, settings)
    assert second.ok, second.errors
    assert second.snapshots == 2 and second.warm_builds == 2 and second.cold_builds == 0
    assert second.changelogs_replayed == 2 * 4, "a replica replays only the changelogs after it"
    assert second.ssts_reused > 0, "SSTs shared with the first snapshot are not uploaded again"
    inv = Inventory.scan(h.fm)
    for s in h.stores:
        assert len(inv.files_of(s).ssts) == sum(1 for _ in inv.files_of(s).ssts)  # content-named, no dupes
    assert _load_latest(h, str(tmp_path / "b")) == [9, 9]


def test_replica_is_reused_by_a_later_process_and_dropped_after_a_crash(
    make_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    h = make_history()
    h.batches(4)
    assert create_snapshots(h.fm, settings).cold_builds == 2
    close_replicas()  # what a new process sees: only the directories and their markers
    h.batches(4)
    report = create_snapshots(h.fm, settings)
    assert report.warm_builds == 2 and report.changelogs_replayed == 8
    close_replicas()
    # A crash in the middle of a replay leaves no marker: the next run rebuilds from the checkpoint.
    crashed = replica_dir(work_root(settings), h.fm.root_uri, h.stores[0])
    os.unlink(os.path.join(crashed, MARKER))
    h.batches(4)
    report = create_snapshots(h.fm, settings)
    assert report.ok and (report.warm_builds, report.cold_builds) == (1, 1)
    assert [r["base_version"] for r in report.rows() if r["build"] == "cold"] == [8]
    h.check_loadable([h.latest])
    # After a host restart (power loss) the unsynced marker may be stale beside a newer DB: a marker written
    # under another boot is never trusted, so every copy is rebuilt from the checkpoint.
    close_replicas()
    for store in h.stores:
        marker = os.path.join(replica_dir(work_root(settings), h.fm.root_uri, store), MARKER)
        with open(marker) as f:
            data = json.load(f)
        assert data["boot_id"] == host_boot_id()
        with open(marker, "w") as f:
            json.dump({**data, "boot_id": "a-previous-boot"}, f)
    h.batches(4)
    report = create_snapshots(h.fm, settings)
    assert report.ok and (report.warm_builds, report.cold_builds) == (0, 2)
    h.check_loadable([h.latest])


def test_below_the_threshold_and_dry_run_write_nothing(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    h = make_local_history()
    h.batches(3)
    before = all_files(h.root)
    report = create_snapshots(h.fm, settings)
    assert report.ok and report.candidates == 0 and report.max_chain_length == 3
    assert all_files(h.root) == before
    h.batch()
    before = all_files(h.root)
    dry = create_snapshots(h.fm, settings, dry_run=True)
    assert dry.candidates == 2 and dry.snapshots == 0
    assert [r["action"] for r in dry.rows()] == ["would snapshot"] * 2
    assert "would snapshot 2 in" in dry.summary() and "file(s)" not in dry.summary(), "no count of files it cannot know"
    assert all_files(h.root) == before


def test_a_store_requested_at_a_version_is_snapshotted_below_the_threshold(
    make_local_history: Callable[..., History], settings: MaintenanceSettings, tmp_path
) -> None:
    """`due_at` (the checkpoint sensor's early requests): due once the store committed the version, whatever its
    chain; not again once a snapshot that new exists, nor before it committed the version."""
    h = make_local_history()
    h.batches(2)
    first, second = h.stores
    report = create_snapshots(h.fm, settings, stores=h.stores, due_at={first: 2, second: 3})
    assert report.ok and report.snapshots == 1
    assert [(r["store"], r["action"]) for r in report.rows()] == [(str(first), "snapshot")]
    again = create_snapshots(h.fm, settings, stores=h.stores, due_at={first: 2, second: 3})
    assert again.ok and again.candidates == 0
    assert _load_latest(h, str(tmp_path)) == [2, None]


def test_without_a_work_dir_copies_are_warm_within_the_process(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    h = make_local_history()
    s = MaintenanceSettings(**{**settings.to_json(), "work_dir": None})
    h.batches(4)
    assert create_snapshots(h.fm, s).cold_builds == 2
    h.batches(4)
    assert create_snapshots(h.fm, s).warm_builds == 2
    shutil.rmtree(work_root(s), ignore_errors=True)
    close_replicas()


def test_snapshot_run_is_recorded_and_cataloged(
    make_local_history: Callable[..., History], settings: MaintenanceSettings, catalog: Catalog
) -> None:
    h = make_local_history()
    h.batches(5)
    report = create_snapshots(h.fm, settings, catalog=catalog, orchestrator_run_id="dagster-123")
    assert report.ok and report.run_id is not None
    (run,) = catalog.runs(h.fm.root_uri)
    assert (run.kind, run.status, run.orchestrator_run_id, run.file_count, run.byte_count) == (
        "snapshot",
        "succeeded",
        "dagster-123",
        report.files,
        report.bytes,
    )
    assert {
        (c.operator, c.partition, c.snapshot_version, c.chain_length) for c in catalog.chain_lengths(h.fm.root_uri)
    } == {
        ("agg", 0, 5, 0),
        ("agg", 1, 5, 0),
    }
    assert catalog.leases(h.fm.root_uri) == []  # released


def test_the_catalog_hears_of_a_runs_snapshots_from_its_own_listing(
    make_history: Callable[..., History], settings: MaintenanceSettings, catalog: Catalog, tmp_path, monkeypatch
) -> None:
    """A snapshot run tells the catalog what it wrote from its inventory: no store directory is listed again
    and no manifest read back (on S3: three LISTs and a GET per store saved). The catalog then holds what a
    rebuild from the location holds, but for the times of the files the run wrote (its clock's, not the
    location's), which the next full sync takes from the location."""
    h = make_history(operators={"agg": 2, "dedup": 1})
    h.batches(3, losing=1)
    sync_catalog(catalog, h.fm)
    h.batches(settings.snapshot_threshold, losing=1)
    subdirs = {d for s in h.stores for d in (s.changelog_dir(), s.snapshot_dir(), s.sst_dir())}
    listed: list[str] = []
    read: list[str] = []
    real_list, real_read = h.fm.list, h.fm.read_bytes

    def listing(prefix: str = "", **kw: Any) -> Any:
        listed.append(prefix)
        return real_list(prefix, **kw)

    def read_bytes(path: str) -> bytes:
        read.append(path)
        return real_read(path)

    def committing_meanwhile(view: InventoryView, inventory: Inventory, serves: Any) -> None:
        """The writer commits a batch after the run's listing, before its sync: the view lacks its changelogs."""
        h.batches(1)
        real_view(view, inventory, serves)

    real_view = InventoryView.__init__
    monkeypatch.setattr(h.fm, "list", listing)
    monkeypatch.setattr(h.fm, "read_bytes", read_bytes)
    monkeypatch.setattr(InventoryView, "__init__", committing_meanwhile)
    report = create_snapshots(h.fm, settings, catalog=catalog)
    assert report.ok and report.snapshots == len(h.stores)
    assert not subdirs & set(listed), f"store directories listed again: {sorted(subdirs & set(listed))}"
    assert not [p for p in read if "/snapshots/" in p], "a manifest the run wrote was read back"
    monkeypatch.undo()
    agg0 = h.stores[0]
    committed = {v for v, _, _ in catalog.committed_versions(h.fm.root_uri, agg0.operator, agg0.partition)}
    assert max(committed) == h.latest - 1, "the batch committed after the listing is left for the next sync"

    fresh = Catalog.open(f"sqlite:///{tmp_path / 'fresh.db'}", upgrade=True)
    try:
        rebuild_catalog(fresh, h.fm)
        uri = h.fm.root_uri
        known = {(c.operator, c.partition, c.snapshot_version) for c in catalog.chain_lengths(uri)}
        assert known == {(s.operator, s.partition, h.latest - 1) for s in h.stores}

        def timeless(export: dict[str, list[tuple[Any, ...]]]) -> dict[str, list[tuple[Any, ...]]]:
            files = [(*r[:7], r[8]) for r in export["files"]]  # without mtime
            return {**export, "files": files}

        sync_catalog(catalog, h.fm)  # the batch committed after the run's listing, with its changelogs
        assert timeless(catalog_export(catalog, uri)) == timeless(catalog_export(fresh, uri))
        sync_catalog(catalog, h.fm, full=True)
        assert catalog_export(catalog, uri) == catalog_export(fresh, uri)
    finally:
        fresh.close()
