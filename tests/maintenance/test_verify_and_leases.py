"""Verification finds what would stop a retained version from loading; one maintainer per store."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from statekeeper.maintenance.expiry import expire_versions
from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.leasing import store_lease
from statekeeper.maintenance.replica import Replica
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_builds import create_snapshots
from statekeeper.maintenance.verify import verify_root
from statekeeper.sql import Catalog
from tests.maintenance.helpers import History, all_files, clobber, snapshotted_history


def test_a_healthy_root_verifies_with_rebuilds(
    make_history: Callable[..., History], settings: MaintenanceSettings, catalog: Catalog
) -> None:
    h = snapshotted_history(make_history, settings)
    report = verify_root(h.fm, settings, rebuild=True, catalog=catalog)
    assert report.ok, report.errors
    assert report.versions == 2 * 3 and report.stores_ok == 2
    assert report.rebuilt >= 2 * 2  # latest loaded + the snapshot at 9 replayed from 5, per store
    assert report.ssts > 0 and report.changelogs > 0
    expire_versions(h.fm, settings)
    after = verify_root(h.fm, settings, rebuild=True)
    assert after.ok, after.errors
    (run,) = catalog.runs(h.fm.root_uri)
    assert (run.kind, run.status) == ("verify", "succeeded")


def test_verify_names_damaged_and_missing_files(
    make_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    h = snapshotted_history(make_history, settings)
    a, b = h.stores
    v = h.latest
    changelog = a.changelog(v, h.committed[v][a][0])
    data = bytearray(h.fm.read_bytes(changelog))
    data[-30] ^= 0x55  # inside the last block
    clobber(h.root, changelog, bytes(data))
    missing = b.changelog(v - 1, h.committed[v - 1][b][0])
    clobber(h.root, missing, None)
    report = verify_root(h.fm, settings, rebuild=True)
    assert not report.ok and report.stores_failed == 2
    assert any(changelog in e and "checksum" in e for e in report.errors), report.errors
    assert any(missing in e and "missing" in e for e in report.errors), report.errors


def test_sst_checksums_and_a_snapshot_that_differs_from_its_changelogs(
    make_history: Callable[..., History], settings: MaintenanceSettings, tmp_path
) -> None:
    h = snapshotted_history(make_history, settings)
    a, b = h.stores
    inv = Inventory.scan(h.fm)
    _key, manifest = max(inv.files_of(a).manifest_data.items())
    sst = manifest.sst_files[0]
    data = bytearray(h.fm.read_bytes(a.sst(sst.remote_name)))
    data[len(data) // 2] ^= 0x01
    clobber(h.root, a.sst(sst.remote_name), bytes(data))  # same size, other content
    assert verify_root(h.fm, settings, checksums=False).stores_failed == 0
    report = verify_root(h.fm, settings)
    assert any(sst.remote_name in e and "checksum" in e for e in report.errors), report.errors

    # A snapshot of b's committed version 11 whose content is not what its changelogs give.
    v = h.latest
    r = Replica(h.fm, b, str(tmp_path / "forger"))
    try:
        r.ensure(v, h.committed[v][b][0], {u: h.committed[u][b][0] for u in range(1, v + 1)}, {})
        r.db.put(b"not-in-any-changelog", b"!")
        forged = r.snapshot(set()).manifest_path
    finally:
        r.destroy()
    report = verify_root(h.fm, settings, rebuild=True, stores=[b])
    assert any(forged in e and "differs from the replay" in e for e in report.errors), report.errors


def test_a_store_leased_by_another_maintainer_is_skipped_with_a_clear_error(
    make_local_history: Callable[..., History], settings: MaintenanceSettings, catalog: Catalog
) -> None:
    h = snapshotted_history(make_local_history, settings)
    a, _b = h.stores
    uri = h.fm.root_uri
    with catalog.acquire_lease(uri, (a.operator, a.partition), owner="other-host:4242", ttl=60):
        before = {p: s for p, s in all_files(h.root).items() if p.startswith(a.prefix)}
        report = expire_versions(h.fm, settings, catalog=catalog)
        assert any("other-host:4242" in e and f"store {a}" in e for e in report.errors), report.errors
        assert {p: s for p, s in all_files(h.root).items() if p.startswith(a.prefix)} == before
        assert report.changelogs > 0, "the other store was expired as usual"
    (run,) = catalog.runs(uri)
    assert run.status == "failed" and "other-host:4242" in (run.errors or "")


def test_the_second_maintainer_waits_for_the_lease(
    make_local_history: Callable[..., History], settings: MaintenanceSettings, catalog: Catalog
) -> None:
    h = snapshotted_history(make_local_history, settings)
    a = h.stores[0]
    lease = catalog.acquire_lease(h.fm.root_uri, (a.operator, a.partition), owner="first", ttl=60)
    threading.Timer(1.0, lease.release).start()
    patient = MaintenanceSettings(**{**settings.to_json(), "lease_timeout_seconds": 20})
    t0 = time.monotonic()
    report = expire_versions(h.fm, patient, catalog=catalog)
    assert report.ok, report.errors
    assert time.monotonic() - t0 >= 0.9
    assert catalog.leases(h.fm.root_uri) == []


def test_without_a_catalog_the_roots_lease_keeps_maintainers_apart(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    h = snapshotted_history(make_local_history, settings)
    h.batches(2)
    a = h.stores[0]
    with store_lease(h.fm, a, settings, None):
        report = create_snapshots(h.fm, settings)
        report2 = expire_versions(h.fm, settings)
    for r in (report, report2):
        assert any(f"store {a}" in e and "holds its lease" in e and "_leases/" in e for e in r.errors), r.errors
    assert report.snapshots == 1 and report2.changelogs > 0  # the other store went ahead
    assert expire_versions(h.fm, settings).ok


def test_verify_beside_a_maintainer_reports_only_what_is_really_broken(
    make_local_history: Callable[..., History], settings: MaintenanceSettings, monkeypatch
) -> None:
    """Verification takes no lease: between its listing and its reads the writers commit on and a maintainer
    snapshots and expires what the retained window left. It verifies the stores that failed again on a fresh
    listing, so only a file that is really gone is reported."""
    h = snapshotted_history(make_local_history, settings)
    b = h.stores[1]
    scan = Inventory.scan
    listings: list[Inventory] = []
    lost: list[str] = []

    def listing_then_maintenance(*args: object, **kwargs: object) -> Inventory:
        inv = scan(*args, **kwargs)  # type: ignore[arg-type]
        if kwargs.get("use_cache", True):
            return inv  # the maintainer's own listings
        listings.append(inv)
        if len(listings) == 1:  # the writers and a maintainer move on after the first listing
            h.batches(6)
            create_snapshots(h.fm, settings)
            h.batches(2)
            assert expire_versions(h.fm, settings).files > 0
            for path in lost:
                clobber(h.root, path, None)
        return inv

    monkeypatch.setattr(Inventory, "scan", staticmethod(listing_then_maintenance))
    report = verify_root(h.fm, settings)
    assert {e.path for e in listings[0].all_entries()} - set(all_files(h.root)), "nothing listed was expired"
    assert len(listings) == 2, "the stores that failed on the stale listing were not verified again"
    assert report.ok, report.errors
    assert report.stores_ok == 2 and report.versions == 2 * settings.min_versions_to_retain

    listings.clear()
    v = h.latest + 8  # the newest version once the writers moved on: retained, and its changelog lost
    original = h.batch

    def batch_losing_the_newest(**kw: object) -> int:
        version = original(**kw)  # type: ignore[arg-type]
        if version == v:
            lost.append(b.changelog(v, h.committed[v][b][0]))
        return version

    monkeypatch.setattr(h, "batch", batch_losing_the_newest)
    report = verify_root(h.fm, settings)
    assert lost and not report.ok and report.stores_failed == 1
    assert any(lost[0] in e and "missing" in e for e in report.errors), report.errors
