"""Expiry keeps the newest versions loadable and deletes exactly what none of them needs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from statekeeper.maintenance.expiry import expire_versions
from statekeeper.maintenance.file_kinds import classify
from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_builds import create_snapshots
from statekeeper.sql import Catalog
from statekeeper.store import StateStore, StoreConfig
from statekeeper.store.errors import LineageError
from statekeeper.store.layout import LEASES_DIR, commit_path
from tests.maintenance.helpers import History, all_files


def _kinds(paths: set[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in paths:
        kind = p.rsplit(".", 1)[1]
        out[kind] = out.get(kind, 0) + 1
    return out


def test_expiry_keeps_retained_versions_and_deletes_the_rest(
    make_history: Callable[..., History], settings: MaintenanceSettings, tmp_path
) -> None:
    h = make_history()
    h.batches(5)  # versions 1..5
    assert create_snapshots(h.fm, settings).snapshots == 2  # snapshot at 5
    h.batches(4)  # 6..9
    assert create_snapshots(h.fm, settings).snapshots == 2  # snapshot at 9
    h.batches(3)  # 10..12: retained 10..12 load from the snapshot at 9
    before = all_files(h.root)
    report = expire_versions(h.fm, settings)
    assert report.ok, report.errors
    # the maintainers' own lease epochs come and go with every run (root_leases.py); expiry deleted the rest:
    gone = {p for p in set(before) - set(all_files(h.root)) if not p.startswith(f"{LEASES_DIR}/")}
    # changelogs 1..9 and the manifest at 5 of both stores; commit records 1..8 (below the base, 9)
    assert _kinds(gone)["changelog"] == 2 * 9
    assert _kinds(gone)["manifest"] == 2
    assert _kinds(gone)["commit"] == 8
    assert commit_path(9) in all_files(h.root)
    assert (report.changelogs, report.manifests, report.commit_records) == (18, 2, 8)
    assert report.files == len(gone) and report.bytes == sum(before[p] for p in gone)
    assert report.retained_versions == 2 * 3
    h.check_loadable(h.retained(settings))
    probe = StateStore(h.fm, "agg", 0, config=StoreConfig(local_dir=str(tmp_path / "probe")))
    with pytest.raises((LineageError, FileNotFoundError)):
        probe.load(4, h.committed[4][h.stores[0]][0])  # expired for good
    probe.close()
    again = expire_versions(h.fm, settings)
    assert again.ok and again.files == 0


def test_expired_ssts_go_only_when_no_surviving_snapshot_references_them(
    make_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    h = make_history(keys=2000)
    s = MaintenanceSettings(**{**settings.to_json(), "min_versions_to_retain": 1})
    for _ in range(3):
        h.batches(4)
        create_snapshots(h.fm, s)
    inv = Inventory.scan(h.fm)
    refs = {
        st: [{x.remote_name for x in m.sst_files} for _, m in sorted(inv.files_of(st).manifest_data.items())]
        for st in h.stores
    }
    report = expire_versions(h.fm, s)
    assert report.ok and report.manifests == 4
    after = Inventory.scan(h.fm)
    for st in h.stores:
        kept = set(after.files_of(st).ssts)
        assert kept == refs[st][-1], "exactly the SSTs of the surviving (newest) snapshot remain"
        assert report.ssts >= 0
    h.check_loadable([h.latest])


def test_no_snapshot_means_nothing_expires(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    h = make_local_history()
    h.batches(8)
    before = all_files(h.root)
    report = expire_versions(h.fm, settings)
    assert report.ok and report.files == 0
    assert all_files(h.root) == before
    h.check_loadable([1, h.latest])


def test_dry_run_reports_exactly_what_a_real_run_deletes(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    h = make_local_history()
    h.batches(5)
    create_snapshots(h.fm, settings)
    h.batches(4)
    before = all_files(h.root)
    dry = expire_versions(h.fm, settings, dry_run=True)
    assert all_files(h.root) == before, "a dry run deletes nothing"
    assert dry.ok and dry.files > 0
    assert {r["action"] for r in dry.rows()} == {"would delete"}
    real = expire_versions(h.fm, settings)
    assert {r["path"] for r in real.rows()} == {r["path"] for r in dry.rows()}
    assert (real.files, real.bytes) == (dry.files, dry.bytes)


def test_in_flight_changelogs_are_never_touched(
    make_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    h = make_history()
    h.batches(5)
    create_snapshots(h.fm, settings)
    h.batches(3)
    h.batch(commit=False)  # a batch whose commit record is not written yet
    pending = {s.changelog(v, c) for s, v, c in h.pending}
    s = MaintenanceSettings(**{**settings.to_json(), "min_versions_to_retain": 1})
    expire_versions(h.fm, s, dry_run=False)
    assert pending <= set(all_files(h.root))
    h.commit_log.commit(h.latest + 1, {"agg": [c for _, _, c in h.pending]})  # the driver catches up


def test_small_batches_in_parallel_and_catalog_bookkeeping(
    make_local_history: Callable[..., History], settings: MaintenanceSettings, catalog: Catalog
) -> None:
    from statekeeper.maintenance.catalog_sync import sync_catalog

    h = make_local_history(operators={"agg": 3})
    h.batches(5)
    create_snapshots(h.fm, settings)
    h.batches(4)
    sync_catalog(catalog, h.fm)
    plan = catalog.retention_plan(h.fm.root_uri, settings.min_versions_to_retain, commit_records=True)
    s = MaintenanceSettings(**{**settings.to_json(), "delete_batch_size": 2, "parallelism": 3})
    report = expire_versions(h.fm, s, catalog=catalog, orchestrator_run_id="run-7")
    assert report.ok, report.errors
    deleted = {r["path"] for r in report.rows()}
    state_files = {p for p in deleted if not p.startswith("commits/")}
    assert state_files == {p for p in plan.paths if not p.startswith("commits/")}, "expiry and the catalog agree"
    # Commit records: expiry keeps them from the base snapshot on (so the chain after it stays classifiable);
    # the catalog's query would delete down to the oldest retained version.
    assert deleted - state_files <= set(plan.paths)
    states = {f.path: f.state for f in catalog.files(h.fm.root_uri, states=["deleted"])}
    assert deleted <= set(states)
    (run,) = catalog.runs(h.fm.root_uri, kind="expire")
    assert (run.status, run.file_count, run.orchestrator_run_id) == ("succeeded", report.files, "run-7")
    h.check_loadable(h.retained(settings))


@pytest.mark.parametrize(
    ("load_grace", "orphan_grace", "expired"),
    [
        pytest.param(300, 0, 0, id="younger-than-the-load-grace"),
        pytest.param(0, 3600, 2 * 5, id="the-orphan-grace-does-not-hold-it-back"),
    ],
)
def test_a_snapshot_becomes_the_base_once_older_than_the_load_grace(
    make_local_history: Callable[..., History],
    settings: MaintenanceSettings,
    load_grace: float,
    orphan_grace: float,
    expired: int,
) -> None:
    """A load that listed the snapshots just before a new one was written may still read the old files,
    for as long as a load takes (`load_grace_seconds`), whatever the orphan grace."""
    h = make_local_history()
    h.batches(5)
    create_snapshots(h.fm, settings)
    h.batches(4)
    s = MaintenanceSettings(
        **{**settings.to_json(), "load_grace_seconds": load_grace, "orphan_grace_seconds": orphan_grace}
    )
    before = all_files(h.root)
    report = expire_versions(h.fm, s)
    assert report.ok and report.changelogs == expired
    if not expired:
        assert report.files == 0 and all_files(h.root) == before
        assert expire_versions(h.fm, settings).changelogs == 2 * 5


def test_raising_the_retention_after_an_expiry_is_not_an_error(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    from statekeeper.maintenance.orphans import clean_orphans
    from statekeeper.maintenance.plan import plan_store

    h = make_local_history()
    h.batches(5, losing=1)
    create_snapshots(h.fm, settings)
    h.batches(2)
    short = MaintenanceSettings(**{**settings.to_json(), "min_versions_to_retain": 1})
    assert expire_versions(h.fm, short).ok
    long = MaintenanceSettings(**{**settings.to_json(), "min_versions_to_retain": 5})
    inv = Inventory.scan(h.fm)
    plan = plan_store(inv, h.stores[0], long)
    assert not plan.blocked and plan.retain_from == 5 and plan.notes  # versions 3 and 4 are gone for good
    for op in (expire_versions, clean_orphans):
        report = op(h.fm, long)
        assert report.ok, report.errors
    h.check_loadable(range(5, h.latest + 1))


def test_the_catalog_hears_of_a_run_in_few_statements(
    make_local_history: Callable[..., History], settings: MaintenanceSettings, catalog: Catalog
) -> None:
    """One `mark_expired` per store (before its first deletion) and one `mark_deleted` per run, whatever
    the number of stores, kinds of file and delete batches; every deleted file ends `deleted`."""
    from statekeeper.maintenance.catalog_sync import sync_catalog

    h = make_local_history(operators={"agg": 3})
    h.batches(5)
    create_snapshots(h.fm, settings)
    h.batches(4)
    create_snapshots(h.fm, settings)
    h.batches(4)
    sync_catalog(catalog, h.fm)
    calls: dict[str, list[list[str]]] = {"mark_expired": [], "mark_deleted": []}
    for name, paths_seen in calls.items():
        real = getattr(catalog, name)

        def spy(uri: str, paths: list[str], real: Callable[..., int] = real, seen: list[list[str]] = paths_seen) -> int:
            seen.append(list(paths))
            return real(uri, paths)

        setattr(catalog, name, spy)
    s = MaintenanceSettings(**{**settings.to_json(), "delete_batch_size": 2, "parallelism": 3})
    report = expire_versions(h.fm, s, catalog=catalog)
    assert report.ok, report.errors
    deleted = {r["path"] for r in report.rows()}
    state_files = {p for p in deleted if not p.startswith("commits/")}
    kinds = {p.rsplit(".", 1)[1] for p in state_files}
    assert {"manifest", "changelog"} <= kinds, "the run deletes manifests and changelogs in separate steps"
    stores_expired = len({classify(p).store for p in state_files})
    # one per store, plus one for the root's commit records
    assert len(calls["mark_expired"]) == stores_expired + (1 if deleted - state_files else 0)
    assert state_files <= {p for paths in calls["mark_expired"] for p in paths}
    assert len(calls["mark_deleted"]) == 1 and set(calls["mark_deleted"][0]) == deleted
    assert deleted <= {f.path for f in catalog.files(h.fm.root_uri, states=["deleted"])}
    h.check_loadable(h.retained(settings))


def test_a_shared_listing_drops_what_expiry_deleted_and_a_failed_deletion_lists_the_store_again(
    make_history: Callable[..., History], settings: MaintenanceSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The maintenance loop's cycle shares one listing: what expiry deleted leaves each store's view (which is
    not listed again), so the view is exactly the store's files and the snapshot that follows plans from it (not
    from the plan made before the deletions); a store whose deletion failed is listed again."""
    h = make_history()
    h.batches(5)
    assert create_snapshots(h.fm, settings).snapshots == 2  # at 5
    h.batches(4)
    assert create_snapshots(h.fm, settings).snapshots == 2  # at 9
    h.batches(4)  # 10..13: expiry deletes the snapshot at 5; a snapshot at 13 is due
    failing, clean = h.stores
    real_delete = h.fm.delete_many

    def delete_many(paths: Any) -> Any:
        paths = list(paths)
        result = real_delete([p for p in paths if not p.startswith(f"{failing.prefix}/")])
        result.errors.update({p: "injected failure" for p in paths if p.startswith(f"{failing.prefix}/")})
        return result

    monkeypatch.setattr(h.fm, "delete_many", delete_many)
    inv = Inventory.scan(h.fm, leased=h.stores)  # as the loop lists under the cycle's leases
    report = expire_versions(h.fm, settings, inventory=inv)
    assert report.files > 0 and any("injected failure" in e for e in report.errors)
    assert inv.is_current(clean), "a store whose deletions all went is not listed again"
    assert not inv.is_current(failing), "a store whose deletion failed is listed again"
    on_disk = {p for p in all_files(h.root) if p.startswith(f"{clean.prefix}/")}
    assert {e.path for e in inv.files_of(clean).entries()} == on_disk
    snapshots = create_snapshots(h.fm, settings, inventory=inv, stores=[clean])
    assert snapshots.ok and snapshots.snapshots == 1, snapshots.errors
    assert inv.is_current(clean), "nor after its snapshot: what it wrote joined the view"
    on_disk = {p for p in all_files(h.root) if p.startswith(f"{clean.prefix}/")}
    assert {e.path for e in inv.files_of(clean).entries()} == on_disk
    h.check_loadable(h.retained(settings))
