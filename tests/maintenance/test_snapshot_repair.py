"""Snapshot repair (DESIGN invariant 10), end to end on local disk and S3.

A snapshot is damaged behind the store's back (a bit flip in an SST, a missing SST, a truncated
manifest). Then: every retained version still loads to the model's state, with a warning naming the
file and the repair counted; verify reports the bad snapshot; expiry deletes none of the changelogs
the repair replays; the next snapshot run writes a fresh snapshot (even below the chain threshold);
once retention moves past the bad snapshot, expiry and orphan cleanup remove it and verify is clean.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import pytest

from statekeeper.maintenance.expiry import expire_versions
from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.orphans import clean_orphans
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_builds import create_snapshots
from statekeeper.maintenance.snapshot_checks import forget
from statekeeper.maintenance.verify import verify_root
from statekeeper.store import StateStore, StoreConfig
from statekeeper.store.formats.snapshot import SnapshotManifest
from tests.maintenance.helpers import History, all_files, clobber, content, leftovers

DAMAGES = ("sst bit flip", "missing sst", "truncated manifest")


def _damage(h: History, damage: str) -> str:
    """Damage the newest snapshot of the history's only store; returns the path of the damaged file."""
    store = h.stores[0]
    files = Inventory.scan(h.fm, use_cache=False).files_of(store)
    key = max(files.manifests)
    manifest_path = files.manifests[key].path
    data = h.fm.read_bytes(manifest_path)
    manifest = SnapshotManifest.from_bytes(data, manifest_path)
    sst = store.sst(max(manifest.sst_files, key=lambda f: f.size).remote_name)
    if damage == "sst bit flip":
        raw = bytearray(h.fm.read_bytes(sst))
        raw[len(raw) // 2] ^= 0x10
        clobber(h.root, sst, bytes(raw))
        return sst
    if damage == "missing sst":
        clobber(h.root, sst, None)
        return sst
    clobber(h.root, manifest_path, data[: len(data) // 2])
    return manifest_path


def _load_repaired(h: History, version: int, tmp: str, caplog: pytest.LogCaptureFixture, bad: str) -> None:
    store = h.stores[0]
    caplog.clear()
    probe = StateStore(h.fm, store.operator, store.partition, config=StoreConfig(local_dir=tmp))
    try:
        ckpt, state = h.committed[version][store]
        with caplog.at_level(logging.WARNING, logger="statekeeper.store.loading"):
            probe.load(version, ckpt)
        assert content(probe) == state
        assert probe.last_load is not None and probe.last_load.repaired_snapshots == 1
        assert probe.last_plan is not None and probe.last_plan.repairs == 1
        probe.abort()
    finally:
        probe.close()
    assert any(r.levelname == "WARNING" and bad in r.getMessage() for r in caplog.records), caplog.text


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_bad_snapshot_is_repaired_reported_and_replaced(
    make_history: Callable[..., History],
    settings: MaintenanceSettings,
    tmp_path: object,
    caplog: pytest.LogCaptureFixture,
    damage: str,
) -> None:
    h = make_history(operators={"agg": 1}, keys=200)
    h.batches(5)
    assert create_snapshots(h.fm, settings).snapshots == 1  # at version 5
    h.batches(3)  # latest 8; retained 6..8 load from the snapshot at 5
    bad = _damage(h, damage)
    forget()  # what this process knew of the SSTs it uploaded: maintenance runs in another process
    changelogs_before = {p for p in all_files(h.root) if p.endswith(".changelog")}

    # Loads repair: the right state, a warning naming the file, the repair counted.
    _load_repaired(h, h.latest, os.path.join(str(tmp_path), "probe"), caplog, bad)
    h.check_loadable(h.retained(settings))

    # Verify reports the bad snapshot.
    report = verify_root(h.fm, settings)
    assert not report.ok and any(bad.rpartition("/")[2] in e for e in report.errors), report.errors

    # Expiry keeps every changelog the repair replays (from version 1: there is no older snapshot).
    expiry = expire_versions(h.fm, settings)
    assert not expiry.ok and expiry.files == 0
    assert changelogs_before <= set(all_files(h.root))
    h.check_loadable(h.retained(settings))

    # The next snapshot run writes a fresh snapshot although the chain (3) is below the threshold (4).
    snap = create_snapshots(h.fm, settings)
    assert snap.ok and snap.snapshots == 1, (snap.errors, snap.rows())
    store = h.stores[0]
    probe = StateStore(h.fm, store.operator, store.partition, config=StoreConfig(local_dir=str(tmp_path) + "/p2"))
    try:
        probe.load(h.latest, h.committed[h.latest][store][0])
        assert probe.last_load is not None and probe.last_load.snapshot_version == h.latest
        assert probe.last_load.repaired_snapshots == 0
    finally:
        probe.close()

    # Retention moves past the bad snapshot: expiry and orphan cleanup remove it; verify is clean.
    h.batches(settings.min_versions_to_retain - 1)
    expiry = expire_versions(h.fm, settings)
    assert expiry.ok, expiry.errors
    orphans = clean_orphans(h.fm, settings)
    assert orphans.ok, orphans.errors
    expire_versions(h.fm, settings)
    clean_orphans(h.fm, settings)
    assert bad not in all_files(h.root) or damage == "missing sst"
    assert leftovers(h.root, settings) == []
    verified = verify_root(h.fm, settings, rebuild=True)
    assert verified.ok, verified.errors
    h.check_loadable(h.retained(settings))


def test_a_repair_is_not_deferred_past_a_rounds_deadline(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    """`snapshot_round_seconds` defers only stores due early by the spread: a store whose newest snapshot is bad is
    rebuilt although its chain is far under the threshold and the round's time is up."""
    h = make_local_history(operators={"agg": 1}, keys=200)
    h.batches(5)
    assert create_snapshots(h.fm, settings).snapshots == 1
    h.batches(1)
    _damage(h, "missing sst")
    forget()
    spread = settings.with_(snapshot_threshold=8, snapshot_spread=0.5, snapshot_round_seconds=1e-9)
    report = create_snapshots(h.fm, spread)
    assert [row["action"] for row in report.items] == ["snapshot"], report.items
    h.check_loadable(h.retained(settings))
