"""The Spark driver's batch files have an owner and an expiry: they go with their version's commit record."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from statekeeper.maintenance.expiry import expire_versions
from statekeeper.maintenance.file_kinds import BATCH, FOREIGN, classify
from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.orphans import clean_orphans
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_builds import create_snapshots
from statekeeper.store.files import open_file_manager
from statekeeper.store.layout import batch_path, commit_path, event_time_path
from tests.maintenance.helpers import History, all_files


def _write_batch_file(h: History, batch: int) -> str:
    path = batch_path("agg", batch)
    with h.fm.create(path, exclusive=True) as out:
        out.write(b'{"batch_id": %d, "timestamp_ms": 0, "num_partitions": 2}' % batch)
    return path


def test_batch_files_are_in_the_layout() -> None:
    k = classify(batch_path("agg", 4))
    assert (k.kind, k.version, k.store) == (BATCH, 5, None), "batch 4 commits version 5"
    k = classify(event_time_path("agg", 4))  # the watermark of batch 4 goes with it
    assert (k.kind, k.version, k.store) == (BATCH, 5, None)
    for foreign in (
        "spark/agg/batches/4.json",
        "spark/agg/batches/x.json",
        "spark/agg/other/00000000000000000004.json",
    ):
        assert classify(foreign).kind == FOREIGN, foreign
    temp = f"spark/agg/batches/.{batch_path('agg', 4).rsplit('/', 1)[1]}.{'a' * 32}.tmp"
    assert classify(temp, temp_listing=True).kind == "temp"


def test_batch_files_expire_with_their_commit_records(
    make_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    h = make_history()
    for _ in range(12):  # versions 1..12, each batch's file written before its first attempt, as the driver does
        _write_batch_file(h, h.latest)
        h.batch()
        if h.latest in (5, 9):
            assert create_snapshots(h.fm, settings).ok
    in_flight = _write_batch_file(h, h.latest)  # batch 12 (version 13) is running
    inv = Inventory.scan(h.fm)
    assert len(inv.batch_files) == 13 and not inv.foreign

    report = expire_versions(h.fm, settings)  # retained 10..12 load from the snapshot at 9: the floor
    assert report.ok and not report.warnings, (report.errors, report.warnings)
    assert report.batch_files == 8 and report.commit_records == 8
    left = set(all_files(h.root))
    assert {p for p in left if p.startswith("spark/")} == {batch_path("agg", b) for b in range(8, 13)}
    assert in_flight in left and commit_path(9) in left and commit_path(8) not in left
    h.check_loadable(h.retained(settings))

    # A batch file left below the oldest commit record (an expiry killed between the two deletes): a rerun
    # of expiry takes it; with a store blocked (no floor), orphan cleanup does once past the grace period.
    stray = _write_batch_file(h, 3)
    again = expire_versions(h.fm, settings)
    assert again.ok and again.batch_files == 1 and stray not in all_files(h.root)
    stray = _write_batch_file(h, 3)
    h.fm.create("state/agg/00001/notes.txt").close()  # someone else's file blocks store agg/1
    patient = MaintenanceSettings(**{**settings.to_json(), "orphan_grace_seconds": 3600})
    kept = clean_orphans(h.fm, patient)
    assert kept.batch_files == 0 and stray in all_files(h.root)
    gone = clean_orphans(h.fm, settings)
    assert gone.batch_files == 1 and stray not in all_files(h.root)
    assert in_flight in all_files(h.root), "the running batch's file is never touched"


def test_a_root_with_only_the_first_batch_file_is_a_checkpoint_root(tmp_path: Path) -> None:
    """The driver writes batch 0's file before any state or commit record exists: a new root, not a typo."""
    fm = open_file_manager(tmp_path.as_uri())
    with fm.create(batch_path("agg", 0), exclusive=True) as out:
        out.write(b"{}")
    report = expire_versions(fm, MaintenanceSettings())
    assert report.ok and not report.warnings and report.files == 0
    assert batch_path("agg", 0) in {i.path for i in fm.list("")}
