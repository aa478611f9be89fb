"""A cold replica build (snapshot, verify --rebuild) that meets a snapshot which restores but will not open,
and is not yet known bad, takes the bad-snapshot path (DESIGN invariants 10 and 14): it builds from an older
base, exactly, and the snapshot is known unopenable from then on (never an expiry base), instead of failing
the build with RocksDB's raw exception."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.parsed_cache import UNOPENABLE_SNAPSHOTS
from statekeeper.maintenance.replica import Replica
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_checks import forget
from statekeeper.store import StateStore, StoreConfig
from statekeeper.store.formats.snapshot import SnapshotManifest
from tests.maintenance.helpers import History, clobber, snapshotted_history


def test_a_cold_build_passes_over_a_snapshot_that_will_not_open(
    make_local_history: Callable[..., History], settings: MaintenanceSettings, tmp_path: Path
) -> None:
    forget()
    h = snapshotted_history(make_local_history, settings)
    store = h.stores[0]
    files = Inventory.scan(h.fm, use_cache=False).files_of(store)
    (newest, cid) = max(files.manifests)
    path = files.manifests[(newest, cid)].path
    m = SnapshotManifest.from_bytes(h.fm.read_bytes(path), path)
    clobber(h.root, path, dataclasses.replace(m, db_files={**m.db_files, "CURRENT": b"MANIFEST-999999\n"}).to_bytes())
    files = Inventory.scan(h.fm, use_cache=False).files_of(store)
    snapshots = {v: files.manifest_data[(v, c)] for (v, c) in files.manifests}
    assert len(snapshots) >= 2, "an older snapshot to fall back on"
    latest = h.latest
    committed = Inventory.scan(h.fm, use_cache=False).committed_ids(store)
    replica = Replica(h.fm, store, str(tmp_path / "replica"))
    try:
        stats = replica.ensure(latest, committed[latest], committed, snapshots)
        assert stats.base_version is not None and stats.base_version < newest, stats
        held = {cf: dict(replica.items(cf)) for cf in replica.column_families()}
    finally:
        replica.close()
    with StateStore(h.fm, store.operator, store.partition, config=StoreConfig(local_dir=str(tmp_path / "w"))) as s:
        s.load(latest, committed[latest])
        loaded = {cf: dict(s.items(cf=cf)) for cf in s.column_families()}
    assert {cf: kv for cf, kv in held.items() if kv} == {cf: kv for cf, kv in loaded.items() if kv}
    assert (h.fm.root_uri, store, path) in UNOPENABLE_SNAPSHOTS
