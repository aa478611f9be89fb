"""Bad input is refused loudly and deletes nothing (DESIGN invariants 4 and 7): corrupt manifests,
missing SSTs, foreign files, bad settings, paths and roots outside the checkpoint root."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from statekeeper.maintenance import snapshot_checks
from statekeeper.maintenance.deletion import delete_entries, validate_deletable
from statekeeper.maintenance.expiry import expire_versions
from statekeeper.maintenance.file_kinds import CHANGELOG, FileEntry
from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.orphans import clean_orphans
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_builds import create_snapshots
from statekeeper.maintenance.verify import verify_root
from statekeeper.store.errors import ConfigurationError
from statekeeper.store.files import open_file_manager
from statekeeper.store.files.s3.capabilities import PROBE_PREFIX
from statekeeper.store.layout import StoreId, commit_path
from tests.maintenance.helpers import History, all_files, clobber, snapshotted_history


def _store_files(h: History, store: StoreId) -> dict[str, int]:
    return {p: s for p, s in all_files(h.root).items() if p.startswith(store.prefix + "/")}


def _maintain(h: History, settings: MaintenanceSettings) -> list[str]:
    """Expiry and orphan cleanup; their errors."""
    errors: list[str] = []
    for op in (expire_versions, clean_orphans):
        errors += op(h.fm, settings).errors
    return errors


@pytest.mark.parametrize("damage", ["corrupt manifest", "missing SST"])
def test_a_broken_snapshot_stops_deletions_in_its_store(
    make_history: Callable[..., History], settings: MaintenanceSettings, damage: str
) -> None:
    _broken_snapshot(make_history, settings, damage)


@pytest.mark.parametrize("damage", ["truncated manifest", "resized SST"])
def test_more_broken_snapshots_on_local_disk(
    make_local_history: Callable[..., History], settings: MaintenanceSettings, damage: str
) -> None:
    _broken_snapshot(make_local_history, settings, damage)


def _broken_snapshot(make: Callable[..., History], settings: MaintenanceSettings, damage: str) -> None:
    h = snapshotted_history(make, settings)
    bad, good = h.stores
    inv = Inventory.scan(h.fm)
    (key, manifest) = max(inv.files_of(bad).manifests.items())
    sst = sorted(inv.files_of(bad).manifest_data[key].sst_files, key=lambda f: f.remote_name)[0]
    if damage == "corrupt manifest":
        data = bytearray(h.fm.read_bytes(manifest.path))
        data[20] ^= 0xFF
        clobber(h.root, manifest.path, bytes(data))
        named = manifest.path
    elif damage == "truncated manifest":
        clobber(h.root, manifest.path, h.fm.read_bytes(manifest.path)[:30])
        named = manifest.path
    elif damage == "missing SST":
        clobber(h.root, bad.sst(sst.remote_name), None)
        named = sst.remote_name
    else:
        clobber(h.root, bad.sst(sst.remote_name), b"short")
        named = sst.remote_name
    before = _store_files(h, bad)
    errors = _maintain(h, settings)
    assert errors and all(named in e for e in errors if f"store {bad}" in e), errors
    assert any(named in e for e in errors)
    assert _store_files(h, bad) == before, "nothing of the damaged store is deleted"
    assert commit_path(1) in all_files(h.root), "commit records stay while a store cannot be planned"
    h.check_loadable(h.retained(settings), [good])  # the healthy store was maintained as usual
    assert len(_store_files(h, good)) < len(before)
    report = verify_root(h.fm, settings)
    assert not report.ok and any(named in e for e in report.errors)
    assert report.stores_failed == 1 and report.stores_ok == 1
    # Snapshot creation deletes nothing either; it builds from an intact base (which may heal the store).
    create_snapshots(h.fm, settings)
    assert before.items() <= _store_files(h, bad).items()


def test_foreign_files_are_reported_never_deleted(
    make_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    h = snapshotted_history(make_history, settings)
    bad, good = h.stores
    foreign = {
        "notes.txt": b"operator notes",
        "commits/README": b"x",
        f"{bad.prefix}/changelogs/00000000000000000001_nothex.changelog": b"not ours",
        f"{bad.prefix}/sst/backup.sst": b"copy",
        "state/agg/1/changelogs/x": b"partition not zero-padded",
    }
    for path, data in foreign.items():
        clobber(h.root, path, data)
    before = _store_files(h, bad)
    expired = expire_versions(h.fm, settings)
    orphans = clean_orphans(h.fm, settings)
    for path in foreign:
        assert path in all_files(h.root)
        # inside a store's own prefix: an error (the store is left alone); elsewhere: a warning only
        reported = expired.errors + orphans.errors if path.startswith(bad.prefix) else expired.warnings
        assert any(path in e for e in reported), f"{path} is not reported"
        assert path.startswith(bad.prefix) or not any(path in e for e in expired.errors + orphans.errors)
    assert orphans.foreign_files == len(foreign)
    assert before.items() <= _store_files(h, bad).items(), "a store with foreign files is left alone"
    assert commit_path(1) in all_files(h.root), "foreign files under commits/ keep every commit record"
    h.check_loadable(h.retained(settings), [good])
    assert orphans.changelogs > 0  # the healthy store's losing attempts went


def test_an_unreadable_commit_record_stops_every_deletion(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    h = snapshotted_history(make_local_history, settings)
    clobber(h.root, commit_path(3), b"SKCR garbage")
    before = all_files(h.root)
    errors = _maintain(h, settings)
    assert any(commit_path(3) in e for e in errors)
    assert {p for p in all_files(h.root) if not p.endswith((".sst", ".manifest"))} == {
        p for p in before if not p.endswith((".sst", ".manifest"))
    }


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"min_versions_to_retain": 0}, "min_versions_to_retain=0"),
        ({"min_versions_to_retain": -3}, "min_versions_to_retain=-3"),
        ({"snapshot_threshold": 0}, "snapshot_threshold=0"),
        ({"orphan_grace_seconds": -1}, "orphan_grace_seconds=-1"),
        ({"delete_batch_size": 1001}, "delete_batch_size=1001"),
        ({"parallelism": 0}, "parallelism=0"),
        ({"min_versions_to_retain": 2.5}, "min_versions_to_retain=2.5"),
        ({"orphan_grace_seconds": float("nan")}, "orphan_grace_seconds=nan"),
        ({"catalog_history_seconds": -1.0}, "catalog_history_seconds=-1.0"),
    ],
)
def test_bad_settings_name_the_setting(overrides: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        MaintenanceSettings(**overrides)  # type: ignore[arg-type]


def test_settings_from_the_environment() -> None:
    s = MaintenanceSettings.from_env({"STATEKEEPER_MIN_VERSIONS_TO_RETAIN": "7", "STATEKEEPER_WORK_DIR": "/w"})
    assert (s.min_versions_to_retain, s.work_dir, s.snapshot_threshold) == (7, "/w", 10)
    assert MaintenanceSettings.from_env({}, orphan_grace_seconds=5).orphan_grace_seconds == 5
    with pytest.raises(ConfigurationError, match="STATEKEEPER_MIN_VERSIONS_TO_RETAIN='many'"):
        MaintenanceSettings.from_env({"STATEKEEPER_MIN_VERSIONS_TO_RETAIN": "many"})
    with pytest.raises(ConfigurationError, match="min_versions_to_retain=0"):
        MaintenanceSettings.from_env({"STATEKEEPER_MIN_VERSIONS_TO_RETAIN": "0"})


@pytest.mark.parametrize("path", ["../outside.changelog", "/etc/passwd", "state/../../x.changelog", "a//b"])
def test_a_path_outside_the_root_is_refused_before_anything_is_deleted(
    make_local_history: Callable[..., History], path: str
) -> None:
    h = make_local_history()
    h.batches(2, losing=1)
    before = all_files(h.root)
    victim = next(p for p in before if p.endswith(".changelog"))
    entries = [FileEntry(victim, CHANGELOG, 1, 0.0), FileEntry(path, CHANGELOG, 1, 0.0)]
    with pytest.raises(ConfigurationError, match=r"refusing to delete"):
        delete_entries(h.fm, entries, batch_size=10)
    assert all_files(h.root) == before
    with pytest.raises(ConfigurationError):
        validate_deletable([FileEntry("notes.txt", "foreign", 1, 0.0)])


def test_symlinks_out_of_the_root_are_not_followed(tmp_path, settings: MaintenanceSettings) -> None:
    outside = tmp_path / "outside"
    (outside / "changelogs").mkdir(parents=True)
    precious = outside / "changelogs" / "00000000000000000001_00000000000000000000000000000000.changelog"
    precious.write_bytes(b"someone else's data")
    h = History((tmp_path / "root").as_uri())
    try:
        h.batches(3, losing=1)
        os.symlink(outside, tmp_path / "root" / "state" / "agg" / "00007")
        report = clean_orphans(h.fm, settings)
        assert precious.read_bytes() == b"someone else's data"
        assert any("state/agg/00007" in e for e in report.errors)
        assert report.changelogs == 6
    finally:
        h.close()


def test_roots_that_are_not_checkpoint_roots_are_refused(tmp_path, settings: MaintenanceSettings) -> None:
    home = tmp_path / "home"
    (home / "documents").mkdir(parents=True)
    (home / "documents" / "thesis.tex").write_text("do not delete")
    for op in (create_snapshots, expire_versions, clean_orphans, verify_root):
        with pytest.raises(ConfigurationError, match="does not look like a statekeeper checkpoint root"):
            op(open_file_manager(home.as_uri()), settings)
        with pytest.raises(ConfigurationError, match="does not exist"):
            op(open_file_manager(str(tmp_path / "typo")), settings)
    assert (home / "documents" / "thesis.tex").read_text() == "do not delete"
    with pytest.raises(ConfigurationError, match="file system root"):
        expire_versions(open_file_manager("/"), settings)
    with pytest.raises(ConfigurationError, match="unsupported checkpoint root scheme"):
        expire_versions(open_file_manager("ftp://host/x"), settings)


def test_a_root_holding_only_a_starting_jobs_capability_probe_is_ours(tmp_path, settings: MaintenanceSettings) -> None:
    """A job's S3 file manager writes (and deletes) `_statekeeper_probe_<id>` at the root before its first
    commit: a maintainer looking at that moment must see an empty checkpoint root, not a foreign one (the
    soak found this on a loaded machine)."""
    root = tmp_path / "root"
    root.mkdir()
    (root / f"{PROBE_PREFIX}{'a' * 32}").write_bytes(b"1")
    fm = open_file_manager(root.as_uri())
    for op in (create_snapshots, expire_versions, clean_orphans, verify_root):
        assert op(fm, settings).ok
    (root / "notes.txt").write_text("someone else's")
    with pytest.raises(ConfigurationError, match=r"notes\.txt"):
        verify_root(fm, settings)


def test_a_work_dir_inside_the_root_is_refused(tmp_path, settings: MaintenanceSettings) -> None:
    h = History((tmp_path / "root").as_uri())
    try:
        h.batches(5)
        inside = MaintenanceSettings(**{**settings.to_json(), "work_dir": str(tmp_path / "root" / "work")})
        with pytest.raises(ConfigurationError, match=r"work_dir .* is inside the checkpoint root"):
            create_snapshots(h.fm, inside)
        assert not (tmp_path / "root" / "work").exists()
    finally:
        h.close()


def test_inventory_classifies_by_the_exact_layout() -> None:
    from statekeeper.maintenance.file_kinds import classify

    cid = "0" * 32
    assert classify(f"commits/{1:020d}.commit").kind == "commit"
    assert classify("commits/1.commit").kind == "foreign"
    assert classify(f"state/agg/00000/changelogs/{3:020d}_{cid}.changelog").kind == "changelog"
    assert classify(f"state/agg/00000/snapshots/{3:020d}_{cid}.changelog").kind == "foreign"
    assert classify(f"state/agg/00000/snapshots/{3:020d}_{cid}.manifest").version == 3
    assert classify("state/agg/00000/sst/" + "a" * 40 + ".sst").kind == "sst"
    assert classify("state/agg/00000/sst/000012.sst").kind == "foreign"
    assert classify("state/agg/0/sst/" + "a" * 40 + ".sst").kind == "foreign"
    tmp = f"state/agg/00000/changelogs/.{3:020d}_{cid}.changelog.{'f' * 32}.tmp"
    assert classify(tmp, temp_listing=True).kind == "temp"
    assert classify("state/agg/00000/changelogs/.notes.tmp", temp_listing=True).kind == "foreign"
    assert classify(tmp).kind == "foreign"  # a temp name in a normal listing (S3) is not ours


def test_a_dry_run_over_a_corrupt_base_lists_only_what_expiry_deletes(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    h = snapshotted_history(make_local_history, settings)
    bad = h.stores[0]
    snapshot_checks.forget()  # another maintainer process than the one that built the snapshots:
    expire_versions(h.fm, settings, dry_run=True)  # it proves the bases (snapshot 9), so expiry may move onto them
    inv = Inventory.scan(h.fm)
    manifests = inv.files_of(bad).manifest_data
    key = max(manifests)
    older = {f.remote_name for k, m in manifests.items() if k != key for f in m.sst_files}
    sst = bad.sst(min({f.remote_name for f in manifests[key].sst_files} - older))
    data = bytearray(h.fm.read_bytes(sst))
    data[len(data) // 2] ^= 0xFF  # same size, wrong checksum: the proven base is corrupt now
    clobber(h.root, sst, bytes(data))
    snapshot_checks.forget()  # a later maintainer process: it has not hashed that SST yet
    before = all_files(h.root)
    dry = expire_versions(h.fm, settings, dry_run=True)
    assert all_files(h.root) == before
    real = expire_versions(h.fm, settings)
    gone = sorted(set(before) - set(all_files(h.root)))
    assert real.blocked_stores == dry.blocked_stores == 1 and commit_path(1) in all_files(h.root)
    assert sorted(r["path"] for r in real.rows()) == gone
    assert sorted(r["path"] for r in dry.rows()) == gone, "the dry run lists exactly what the run deletes"
    assert (real.files, real.bytes, real.commit_records) == (len(gone), sum(before[p] for p in gone), 0)
    assert (dry.files, dry.bytes, dry.commit_records) == (real.files, real.bytes, real.commit_records)
