"""A snapshot is a base only once it has opened (DESIGN invariant 14), end to end on local disk and S3.

The snapshot's manifest parses, its checksum is right and every SST matches the SHA-256 the manifest
records, yet RocksDB cannot open what it restores: the embedded CURRENT or MANIFEST was rewritten, an SST was
replaced by other bytes re-hashed into the manifest, or an SST is restored under a wrong local name (each
rewritten with the product's own manifest encoder). Then: every retained version still loads exactly, the
repair counted; verify exits non-zero naming the manifest; expiry keeps the changelogs and commit records
a load replays around it; `statekeeper snapshot` writes a fresh one; after that every retained version
loads from it and expiry moves on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from statekeeper.maintenance.expiry import expire_versions
from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_builds import create_snapshots
from statekeeper.maintenance.snapshot_checks import forget
from statekeeper.maintenance.verify import verify_root
from statekeeper.store import StateStore, StoreConfig
from statekeeper.store.formats.snapshot import SnapshotManifest, SstFile
from tests.maintenance.helpers import History, all_files, clobber, content

DAMAGES = ("CURRENT", "MANIFEST", "no CURRENT", "SST content", "SST local name")


def _unopenable(h: History, damage: str) -> str:
    """Rewrite the newest snapshot so that it passes every checksum but cannot open; returns its manifest path."""
    store = h.stores[0]
    files = Inventory.scan(h.fm, use_cache=False).files_of(store)
    path = files.manifests[max(files.manifests)].path
    m = SnapshotManifest.from_bytes(h.fm.read_bytes(path), path)
    db_files = dict(m.db_files)
    ssts = list(m.sst_files)
    if damage == "CURRENT":
        db_files["CURRENT"] = b"MANIFEST-999999\n"
    elif damage == "MANIFEST":
        name = next(n for n in db_files if n.startswith("MANIFEST-"))
        db_files[name] = hashlib.sha256(b"not a rocksdb manifest").digest() * 8
    elif damage == "no CURRENT":
        del db_files["CURRENT"]
    elif damage == "SST content":
        i = max(range(len(ssts)), key=lambda j: ssts[j].size)
        data = hashlib.sha256(b"other bytes").digest() * (ssts[i].size // 32 + 1)
        data = data[: ssts[i].size]
        digest = hashlib.sha256(data).hexdigest()
        remote = f"{digest[:40]}.sst"
        clobber(h.root, store.sst(remote), data)
        ssts[i] = SstFile(ssts[i].local_name, remote, len(data), digest)
    else:
        i = max(range(len(ssts)), key=lambda j: ssts[j].size)
        ssts[i] = dataclasses.replace(ssts[i], local_name="999999.sst")
    clobber(h.root, path, dataclasses.replace(m, db_files=db_files, sst_files=tuple(ssts)).to_bytes())
    return path


def _load(h: History, version: int, local: str) -> StateStore:
    store = h.stores[0]
    probe = StateStore(h.fm, store.operator, store.partition, config=StoreConfig(local_dir=local))
    probe.load(version, h.committed[version][store][0])
    return probe


@pytest.mark.parametrize("damage", DAMAGES)
def test_an_unopenable_snapshot_is_repaired_reported_kept_out_of_expiry_and_rebuilt(
    make_history: Callable[..., History],
    settings: MaintenanceSettings,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    checkpoint_root: str,
    damage: str,
) -> None:
    if not checkpoint_root.startswith("file:") and damage not in ("MANIFEST", "SST local name"):
        pytest.skip("on S3 two of the damages suffice (the others run on local disk)")
    h = make_history(operators={"agg": 1}, keys=200)
    h.batches(5)
    assert create_snapshots(h.fm, settings).snapshots == 1  # at version 5
    h.batches(3)  # latest 8; retained 6..8 load from the snapshot at 5
    bad = _unopenable(h, damage)
    forget()  # maintenance runs in another process: it knows nothing of the snapshot it wrote
    before = set(all_files(h.root))
    store = h.stores[0]

    # Loads repair: the right state, a warning naming the manifest, the repair counted.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="statekeeper.store.loading"):
        probe = _load(h, h.latest, str(tmp_path / "probe"))
    try:
        assert content(probe) == h.committed[h.latest][store][1]
        assert probe.last_load is not None and probe.last_load.repaired_snapshots == 1
        probe.abort()
    finally:
        probe.close()
    assert any(bad.rpartition("/")[2] in r.getMessage() for r in caplog.records), caplog.text
    h.check_loadable(h.retained(settings))

    # Verify exits non-zero naming the manifest.
    report = verify_root(h.fm, settings)
    assert not report.ok and any(bad.rpartition("/")[2] in e for e in report.errors), report.errors
    from statekeeper.maintenance.cli import main as cli_main

    capsys.readouterr()
    assert cli_main(["verify", h.root]) != 0
    forget()

    # Expiry keeps every changelog and commit record a load replays around it.
    expire_versions(h.fm, settings)
    assert before <= set(all_files(h.root)), sorted(before - set(all_files(h.root)))
    h.check_loadable(h.retained(settings))

    # `statekeeper snapshot` writes a fresh one though the chain (3) is below the threshold (4).
    forget()
    snap = create_snapshots(h.fm, settings)
    assert snap.ok and snap.snapshots == 1, (snap.errors, snap.rows())
    probe = _load(h, h.latest, str(tmp_path / "p2"))
    try:
        assert probe.last_load is not None and probe.last_load.snapshot_version == h.latest
        assert probe.last_load.repaired_snapshots == 0
    finally:
        probe.close()

    # Retention moves on: every retained version loads exactly, before and after expiry.
    h.batches(settings.min_versions_to_retain - 1)
    forget()
    expiry = expire_versions(h.fm, settings)
    assert expiry.ok, expiry.errors
    h.check_loadable(h.retained(settings))
    assert verify_root(h.fm, settings).ok


def test_expiry_proves_a_new_base_before_deleting_below_it(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    """A snapshot this process did not write becomes the base only once expiry has opened and checked it."""
    h = make_local_history(operators={"agg": 1}, keys=50)
    h.batches(5)
    assert create_snapshots(h.fm, settings).snapshots == 1
    h.batches(3)
    forget()
    expiry = expire_versions(h.fm, settings)
    assert expiry.ok and expiry.files > 0, expiry.errors  # proven by opening it: the changelogs below go
    h.check_loadable(h.retained(settings))


def test_a_manifest_records_what_its_snapshot_holds(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    """The manifest records what its snapshot holds; a snapshot that opens to other content is no base."""
    h = make_local_history(operators={"agg": 1}, keys=50)
    h.batches(5)
    assert create_snapshots(h.fm, settings).snapshots == 1
    files = Inventory.scan(h.fm, use_cache=False).files_of(h.stores[0])
    path = files.manifests[max(files.manifests)].path
    m = SnapshotManifest.from_bytes(h.fm.read_bytes(path), path)
    assert m.key_count is not None and m.content_sha256 is not None
    # Recorded as what the snapshot holds, not an estimate: the model's keys.
    assert m.key_count == sum(len(kv) for kv in h.committed[5][h.stores[0]][1].values())


def test_a_manifest_of_another_version_under_a_snapshots_name_is_not_restored(
    make_local_history: Callable[..., History], settings: MaintenanceSettings, tmp_path: Path
) -> None:
    """The older snapshot's manifest, every checksum and SST right, copied under the newer snapshot's name: a load
    restoring it would start from the older state and replay only the changelogs above the newer base, so it
    returned other state without an error. The manifest's identity is checked against its name: the load repairs
    around it (counted) and verify names it."""
    h = make_local_history()
    h.batches(5)
    create_snapshots(h.fm, settings)
    h.batches(4)
    create_snapshots(h.fm, settings)
    store = h.stores[0]
    manifests = Inventory.scan(h.fm, use_cache=False).files_of(store).manifests
    assert len(manifests) == 2
    older, newer = (manifests[k].path for k in sorted(manifests))
    clobber(h.root, newer, h.fm.read_bytes(older))
    forget()
    cid, state = h.committed[h.latest][store]
    probe = StateStore(h.fm, store.operator, store.partition, config=StoreConfig(local_dir=str(tmp_path / "load")))
    try:
        probe.load(h.latest, cid)
        assert content(probe) == state, "the load returned the older snapshot's state"
        assert probe.last_load is not None and probe.last_load.repaired_snapshots == 1
    finally:
        probe.close()
    report = verify_root(h.fm, settings)
    assert any(newer in e and "its name says" in e for e in report.errors), report.errors
