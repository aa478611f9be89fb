"""Orphan cleanup: losing attempts, unreferenced SSTs and unfinished writes go once older than the grace
period; anything that may still be in flight stays; the dry run reports files and bytes."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import pytest

from statekeeper.maintenance.expiry import expire_versions
from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.orphans import clean_orphans
from statekeeper.maintenance.replica import Replica
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_builds import create_snapshots
from statekeeper.sql import Catalog
from statekeeper.store.files import LocalFileManager
from statekeeper.store.files.s3 import S3FileManager
from statekeeper.store.files.s3.capabilities import PROBE_PREFIX
from statekeeper.store.layout import LEASES_DIR
from tests.maintenance.helpers import History, leftovers
from tests.maintenance.helpers import all_files as all_root_files

JUNK_SST = "ab" * 20 + ".sst"


def start_unfinished_write(h: History) -> Any:
    """A write that never finished: a local temp file, or an S3 multipart upload never completed."""
    path = h.stores[0].sst("cd" * 20 + ".sst")
    if isinstance(h.fm, LocalFileManager):
        out = h.fm.create(path)
        out.write(b"half of an SST")
        return out
    assert isinstance(h.fm, S3FileManager)
    key = h.fm.key_prefix + path
    up = h.fm.client.create_multipart_upload(Bucket=h.fm.bucket, Key=key)
    h.fm.client.upload_part(Bucket=h.fm.bucket, Key=key, UploadId=up["UploadId"], PartNumber=1, Body=b"x" * 100)
    return None


def losing_snapshot(h: History, tmp: str) -> str:
    """A snapshot of an attempt that lost its version (as a zombie maintainer could have written)."""
    s = h.stores[0]
    loser = next(
        p
        for p in all_files(h.root)
        if p.startswith(f"{s.prefix}/changelogs/")
        and p.endswith(".changelog")
        and p.split("_")[-1].split(".")[0] != h.committed[int(p.rsplit("/", 1)[1][:20])][s][0]
    )
    v = int(loser.rsplit("/", 1)[1][:20])
    cid = loser.rsplit("_", 1)[1].split(".")[0]
    committed = {u: h.committed[u][s][0] for u in range(1, v)} | {v: cid}
    r = Replica(h.fm, s, tempfile.mkdtemp(dir=tmp))
    try:
        r.ensure(v, cid, committed, {})
        r.db.put(b"zombie-only-key", b"x" * 5000)
        return r.snapshot(set()).manifest_path
    finally:
        r.destroy()


def all_files(root: str) -> dict[str, int]:
    """The root's files but the maintainers' lease epochs, which every run replaces (root_leases.py)."""
    return {p: size for p, size in all_root_files(root).items() if not p.startswith(f"{LEASES_DIR}/")}


def test_orphans_go_after_the_grace_period_and_in_flight_files_stay(
    make_history: Callable[..., History], settings: MaintenanceSettings, tmp_path, request: pytest.FixtureRequest
) -> None:
    h = make_history()
    h.batches(5, losing=1)
    create_snapshots(h.fm, settings)
    h.batches(2, losing=1)
    h.fm.create(h.stores[1].sst(JUNK_SST)).close()  # an SST whose snapshot crashed before its manifest
    zombie_manifest = losing_snapshot(h, str(tmp_path))
    out = start_unfinished_write(h)
    h.batch(commit=False)  # the next batch is in flight: its changelogs have no commit record yet
    pending = {s.changelog(v, c) for s, v, c in h.pending}

    patient = MaintenanceSettings(**{**settings.to_json(), "orphan_grace_seconds": 3600})
    before = all_files(h.root)
    kept = clean_orphans(h.fm, patient)
    assert kept.ok, kept.errors
    local = isinstance(h.fm, LocalFileManager)
    # moto dates every multipart upload in 2010: already past grace; s3rver lists none (docs/s3.md)
    assert kept.files == (1 if request.node.callspec.params["checkpoint_root"] == "s3" else 0)
    assert all_files(h.root) == before
    # losing changelogs, the junk SST, the zombie manifest (its SSTs are still referenced), pending, temp
    assert kept.kept_in_flight == 2 * 7 + 2 + len(pending) + (1 if local else 0)

    report = clean_orphans(h.fm, settings)
    assert report.ok, report.errors
    after = all_files(h.root)
    assert pending <= set(after), "changelogs of a version newer than the newest commit are never touched"
    assert zombie_manifest not in after and h.stores[1].sst(JUNK_SST) not in after
    assert report.changelogs == 2 * 7 and report.manifests == 1
    assert report.ssts >= 2  # the junk SST and the zombie snapshot's own SSTs
    assert report.temp_files + report.incomplete_uploads == (1 if local else 0)
    inv = Inventory.scan(h.fm)
    assert not any(f.temps for f in inv.stores.values())
    h.check_loadable(range(1, h.latest + 1))  # orphan cleanup never makes a committed version unloadable
    assert expire_versions(h.fm, settings).ok
    assert leftovers(h.root, settings) == [], "nothing is left that is neither retained nor possibly in flight"
    if out is not None:
        out.cancel()


def test_dry_run_reports_files_and_bytes_and_deletes_nothing(
    make_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    h = make_history()
    h.batches(4, losing=2)
    before = all_files(h.root)
    dry = clean_orphans(h.fm, settings, dry_run=True)
    assert all_files(h.root) == before
    losers = {p for p in before if p.endswith(".changelog")} - {
        s.changelog(v, h.committed[v][s][0]) for v in range(1, h.latest + 1) for s in h.stores
    }
    assert dry.ok and dry.files == len(losers) == 2 * 4 * 2
    assert dry.bytes == sum(before[p] for p in losers)
    assert {r["path"] for r in dry.rows()} == losers and {r["action"] for r in dry.rows()} == {"would delete"}
    real = clean_orphans(h.fm, settings)
    assert (real.files, real.bytes) == (dry.files, dry.bytes)
    assert set(before) - set(all_files(h.root)) == losers


def test_orphan_run_is_recorded_and_marks_files_deleted(
    make_local_history: Callable[..., History], settings: MaintenanceSettings, catalog: Catalog
) -> None:
    from statekeeper.maintenance.catalog_sync import sync_catalog

    h = make_local_history()
    h.batches(3, losing=1)
    sync_catalog(catalog, h.fm, full=True)
    assert len(catalog.losing_attempts(h.fm.root_uri)) == 6
    report = clean_orphans(h.fm, settings, catalog=catalog)
    assert report.ok and report.files == 6
    deleted = {f.path for f in catalog.files(h.fm.root_uri, states=["deleted"])}
    assert {r["path"] for r in report.rows()} <= deleted
    (run,) = catalog.runs(h.fm.root_uri)
    assert (run.kind, run.status, run.file_count) == ("clean-orphans", "succeeded", 6)


def test_old_temp_file_of_a_commit_record_is_removed_but_a_young_one_stays(tmp_path, settings) -> None:
    h = History((tmp_path / "root").as_uri())
    try:
        h.batches(2)
        fm = h.fm
        assert isinstance(fm, LocalFileManager)
        out = fm.create("commits/00000000000000000009.commit")
        out.write(b"partial")
        temp = next(fm.list_temp_files("commits/"))
        patient = MaintenanceSettings(**{**settings.to_json(), "orphan_grace_seconds": 60})
        assert clean_orphans(h.fm, patient).kept_in_flight == 1
        old = os.path.getmtime(os.path.join(fm.root_path, temp.path)) - 120
        os.utime(os.path.join(fm.root_path, temp.path), (old, old))
        report = clean_orphans(h.fm, patient)
        assert report.temp_files == 1 and report.ok
        assert list(fm.list_temp_files("")) == []
        out.cancel()
    finally:
        h.close()


def test_a_capability_probe_left_by_a_killed_process_is_an_unfinished_write(tmp_path, settings) -> None:
    """The S3 file manager's conditional-write probe (`_statekeeper_probe_<id>` at the root) is deleted at once;
    a process killed in between leaves it: ours, so an orphan after the grace period, not a foreign file."""
    h = History((tmp_path / "root").as_uri())
    try:
        h.batches(2)
        probe = f"{PROBE_PREFIX}{'e' * 32}"
        assert isinstance(h.fm, LocalFileManager)
        path = os.path.join(h.fm.root_path, probe)
        with open(path, "wb") as f:  # as the probe's PUT would leave it
            f.write(b"1")
        patient = MaintenanceSettings(**{**settings.to_json(), "orphan_grace_seconds": 60})
        young = clean_orphans(h.fm, patient)
        assert young.ok and young.kept_in_flight == 1 and young.foreign_files == 0 and not young.warnings
        os.utime(path, (os.path.getmtime(path) - 120,) * 2)
        report = clean_orphans(h.fm, patient)
        assert report.ok and report.temp_files == 1
        assert not os.path.exists(path)
    finally:
        h.close()
