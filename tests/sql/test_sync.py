"""Catalog sync from real checkpoints: incremental == full rebuild, idempotency, deletions, bad files."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from statekeeper.maintenance.catalog_sync import CatalogSyncError, classify, rebuild_catalog, sync_catalog
from statekeeper.sql import Catalog
from statekeeper.store.layout import StoreId, batch_path, commit_path, heartbeat_path
from tests.catalog_export import catalog_export
from tests.sql.histories import History


@pytest.fixture
def history(checkpoint_root: str) -> Iterator[History]:
    h = History(checkpoint_root)
    yield h
    h.close()


def exports_equal(a: dict[str, list[tuple[object, ...]]], b: dict[str, list[tuple[object, ...]]]) -> None:
    assert a.keys() == b.keys()
    for key, rows in a.items():
        other = b[key]
        assert rows == other, f"{key} differs: only left {set(rows) - set(other)}, only right {set(other) - set(rows)}"


def test_classify_names() -> None:
    s = StoreId("agg", 3)
    cid = "0" * 31 + "1"
    assert classify(commit_path(5)).kind == "commit"
    c = classify(s.changelog(7, cid))
    assert (c.kind, c.operator, c.partition, c.version, c.checkpoint_id) == ("changelog", "agg", 3, 7, cid)
    assert classify(s.manifest(7, cid)).kind == "manifest"
    assert classify(s.sst("ab" * 20 + ".sst")).kind == "sst"
    # The inventory's reading of temp names (one reading): ours only from a local temp listing, and only
    # when the name they would be published under is a checkpoint file.
    temp = s.changelog(7, cid).rpartition("/")
    temp_path = f"{temp[0]}/.{temp[2]}.{'ab' * 16}.tmp"
    t = classify(temp_path, temp_listing=True)
    assert (t.kind, t.operator, t.partition, t.version) == ("temp", "agg", 3, 7)
    assert classify(temp_path).kind == "foreign"  # an S3 object with a temp-looking name is not ours
    assert classify(f"state/agg/00003/changelogs/.x.{'ab' * 16}.tmp", temp_listing=True).kind == "foreign"
    batch = classify(batch_path("agg", 4))  # the driver's files are ours (issue: nothing of ours is foreign)
    assert (batch.kind, batch.version) == ("batch", 5)
    assert classify(heartbeat_path("agg", 1_700_000_000_000)).kind == "heartbeat"
    for foreign in (
        "README",
        "spark/agg/batches/x.json",
        "spark/agg/notes/1.json",
        "commits/5.commit",
        "state/agg/3/changelogs/x",
        "state/agg/00003/sst/x.bin",
        f"state/agg/00003/snapshots/{7:020d}_{cid}.changelog",
        "state/agg/00003/other/x.sst",
    ):
        assert classify(foreign).kind == "foreign", foreign


def test_full_sync_records_lineage(catalog: Catalog, history: History) -> None:
    history.run(6, retry_every=2, snapshot_every=3)
    history.pending_attempt(("agg", 0))
    result = sync_catalog(catalog, history.fm, full=True)
    uri = history.fm.root_uri
    assert result.errors == [] and result.commits == 6 and result.snapshots == 6
    assert catalog.stores(uri)[0].scope == "agg/0"
    for key in history.store_keys():
        versions = catalog.committed_versions(uri, *key)
        assert [v for v, _, _ in versions] == list(range(1, 7))
        for v, cid, parent in versions:
            assert cid == history.committed_id(key, v)
            assert parent == history.committed_id(key, v - 1)
    assert sorted(catalog.losing_attempts(uri)) == sorted(history.losing)
    files = {f.path: f for f in catalog.files(uri)}
    for op, part, v, cid in history.losing:
        assert files[StoreId(op, part).changelog(v, cid)].state == "orphan"
    op, part, v, cid = history.pending[0]
    assert files[StoreId(op, part).changelog(v, cid)].state == "live"
    assert all(f.state == "live" for f in files.values() if f.kind in ("commit", "sst", "manifest"))
    exp = catalog_export(catalog, uri)
    outcomes = {(a[0], a[1], a[2], a[3]): a[4] for a in exp["attempts"]}
    assert outcomes[(op, part, v, cid)] == "pending"
    assert sum(1 for o in outcomes.values() if o == "committed") == 6 * len(history.store_keys())
    # Every listed file is in the catalog with its size.
    listed = {i.path: i.size for i in history.fm.list("")}
    assert {p: f.size for p, f in files.items()} == listed
    summary = catalog.summary(uri)
    assert (summary["stores"], summary["latest_version"], summary["snapshots"]) == (3, 6, 6)
    assert summary["losing_attempts"] == len(history.losing)
    assert (summary["present_files"], summary["present_bytes"]) == (len(listed), sum(listed.values()))
    assert summary["files"]["changelog"]["orphan"]["files"] == len(history.losing)
    assert summary["last_full_sync_at"] is not None


def test_incremental_at_every_step_equals_rebuild(
    catalog: Catalog, catalog_factory: Callable[[], Catalog], history: History
) -> None:
    """Sync after every single write; the result equals a rebuild from the location alone."""
    uri = history.fm.root_uri

    def on_step(_what: str) -> None:
        sync_catalog(catalog, history.fm)

    history.on_step = on_step
    history.run(7, retry_every=2, snapshot_every=3)
    history.pending_attempt(("join", 0))
    history.snapshot(("agg", 1), version=5)  # an older version's snapshot, written late
    sync_catalog(catalog, history.fm, full=True)  # the late snapshot is below the cursor: a full pass
    incremental = catalog_export(catalog, uri)
    fresh = catalog_factory()
    rebuild_catalog(fresh, history.fm)
    exports_equal(incremental, catalog_export(fresh, uri))
    # ... and a rebuild in place after dropping the root's rows gives the same again.
    rebuild_catalog(catalog, history.fm)
    exports_equal(incremental, catalog_export(catalog, uri))


def test_incremental_only_equals_rebuild(
    catalog: Catalog, catalog_factory: Callable[[], Catalog], history: History
) -> None:
    """Without any full pass: syncs between batches catch up with everything a normal history writes."""
    uri = history.fm.root_uri
    for i in range(1, 7):
        history.batch(retry=i % 2 == 0, snapshot=i % 3 == 0)
        if i % 2:
            sync_catalog(catalog, history.fm)
    history.pending_attempt(("agg", 1))
    sync_catalog(catalog, history.fm)
    fresh = catalog_factory()
    rebuild_catalog(fresh, history.fm)
    exports_equal(catalog_export(catalog, uri), catalog_export(fresh, uri))


def test_a_sync_of_named_stores_lists_only_theirs_and_the_others_catch_up(
    catalog: Catalog, catalog_factory: Callable[[], Catalog], history: History
) -> None:
    """What a maintainer runs after writing some stores' snapshots: no listing of the others' directories."""
    uri = history.fm.root_uri
    history.run(3, retry_every=0, snapshot_every=0)
    sync_catalog(catalog, history.fm)
    history.batch(snapshot=True)
    first, *others = [StoreId(*k) for k in history.store_keys()]
    r = sync_catalog(catalog, history.fm, stores=[first])
    assert (r.commits, r.snapshots) == (1, 1)
    known = {f.path for f in catalog.files(uri)}
    assert {p for p in known if p.startswith(first.prefix + "/")} == {
        i.path for i in history.fm.list(first.prefix + "/")
    }, "the named store is synced: its new changelog, manifest and SSTs"
    for store in others:
        unlisted = {i.path for i in history.fm.list(store.prefix + "/")} - known
        assert any(p.endswith(".changelog") for p in unlisted), f"{store} was listed"
    sync_catalog(catalog, history.fm)  # an unrestricted sync catches the others up
    fresh = catalog_factory()
    rebuild_catalog(fresh, history.fm)
    exports_equal(catalog_export(catalog, uri), catalog_export(fresh, uri))
    with pytest.raises(ValueError, match="full sync"):
        sync_catalog(catalog, history.fm, full=True, stores=[first])


def test_syncs_are_idempotent(catalog: Catalog, history: History) -> None:
    uri = history.fm.root_uri
    history.run(5, retry_every=2, snapshot_every=2)
    first = sync_catalog(catalog, history.fm)
    assert first.files_new > 0
    before = catalog_export(catalog, uri, include_history=True)
    again = sync_catalog(catalog, history.fm)
    assert (again.commits, again.files_new, again.snapshots, again.reads) == (0, 0, 0, 0)
    full = sync_catalog(catalog, history.fm, full=True)
    assert (full.files_new, full.files_deleted, full.reads) == (0, 0, 0)
    assert catalog_export(catalog, uri, include_history=True) == before
    rebuild_catalog(catalog, history.fm)
    r1 = catalog_export(catalog, uri, include_history=True)
    rebuild_catalog(catalog, history.fm)
    assert catalog_export(catalog, uri, include_history=True) == r1 == before


def test_incremental_reads_only_what_is_new(catalog: Catalog, history: History) -> None:
    history.run(4, retry_every=0, snapshot_every=0)
    sync_catalog(catalog, history.fm)
    history.batch()
    r = sync_catalog(catalog, history.fm)
    assert r.commits == 1 and r.reads == 1  # one commit record, no header or manifest
    assert r.files_new == 1 + len(history.store_keys())  # the commit record and one changelog per store
    history.batch(snapshot=True)
    r = sync_catalog(catalog, history.fm)
    assert r.snapshots == len(history.store_keys()) and r.reads == 1 + len(history.store_keys())


def test_full_sync_marks_deleted_files_and_finds_strays(catalog: Catalog, history: History) -> None:
    uri = history.fm.root_uri
    history.run(6, retry_every=3, snapshot_every=3)
    sync_catalog(catalog, history.fm)
    store = StoreId("agg", 0)
    # Strays: a foreign file, an SST no manifest references, a losing attempt of v2 written late.
    with history.fm.create("notes/README.txt") as out:
        out.write(b"not ours")
    with history.fm.create(batch_path("agg", 5)) as out:  # the driver's: recorded as its kind
        out.write(b"{}")
    stray_sst = store.sst("f" * 40 + ".sst")
    with history.fm.create(stray_sst) as out:
        out.write(b"junk")
    late = history.fm.read_bytes(store.changelog(2, history.committed_id(("agg", 0), 2) or ""))
    zombie = store.changelog(2, "e" * 32)
    with history.fm.create(zombie) as out:
        out.write(late)
    # Deletions: the changelogs of v1..v2 of agg/0 and the v3 snapshot manifest of agg/1.
    gone = [store.changelog(v, history.committed_id(("agg", 0), v) or "") for v in (1, 2)]
    manifest = StoreId("agg", 1).manifest(3, history.committed_id(("agg", 1), 3) or "")
    history.fm.delete_many([*gone, manifest])

    inc = sync_catalog(catalog, history.fm)
    assert inc.files_deleted == 0 and inc.files_new == 0  # incremental sees neither
    full = sync_catalog(catalog, history.fm, full=True)
    assert full.files_deleted == 3 and full.files_new == 4
    hist = {f.path: f for f in catalog.files(uri, states=["live", "orphan", "expired", "deleted"])}
    assert all(hist[p].state == "deleted" for p in [*gone, manifest])
    assert hist["notes/README.txt"].kind == "foreign" and hist["notes/README.txt"].state == "live"
    assert (hist[batch_path("agg", 5)].kind, hist[batch_path("agg", 5)].version) == ("batch", 6)
    assert hist[stray_sst].state == "orphan"
    assert hist[zombie].state == "orphan"
    assert ("agg", 0, 2, "e" * 32) in catalog.losing_attempts(uri)
    # The SSTs only the deleted manifest referenced are orphans now; shared ones stay live.
    snaps = {s[4]: s for s in catalog_export(catalog, uri, include_history=True)["snapshots"]}
    assert snaps[manifest][-1] is True  # deleted
    present = catalog_export(catalog, uri)
    assert manifest not in {s[4] for s in present["snapshots"]}
    live_refs = {sst for m, sst, _ in present["snapshot_ssts"]}
    for path, f in hist.items():
        if f.kind == "sst" and f.state != "deleted":
            assert f.state == ("live" if path in live_refs else "orphan"), path
    # Present files equal what a rebuild from the location alone finds.
    export_before = catalog_export(catalog, uri)
    rebuild_catalog(catalog, history.fm)
    exports_equal(export_before, catalog_export(catalog, uri))


def test_mark_deleted_and_expired(catalog: Catalog, history: History) -> None:
    uri = history.fm.root_uri
    history.run(4, retry_every=0, snapshot_every=2)
    sync_catalog(catalog, history.fm)
    plan = catalog.retention_plan(uri, 1)
    assert plan.paths
    assert catalog.mark_expired(uri, plan.paths) == len(plan.paths)
    assert {f.state for f in catalog.files(uri) if f.path in set(plan.paths)} == {"expired"}
    sync_catalog(catalog, history.fm)  # a sync keeps the expiry mark while the files exist
    assert {f.state for f in catalog.files(uri) if f.path in set(plan.paths)} == {"expired"}
    history.fm.delete_many(plan.paths)
    assert catalog.mark_deleted(uri, plan.paths) == len(plan.paths)
    assert not set(plan.paths) & {f.path for f in catalog.files(uri)}
    full = sync_catalog(catalog, history.fm, full=True)
    assert full.files_deleted == 0


def test_parent_from_changelog_header_when_commit_records_are_gone(catalog: Catalog, history: History) -> None:
    uri = history.fm.root_uri
    history.run(5, retry_every=0, snapshot_every=0)
    history.fm.delete_many([commit_path(v) for v in (1, 2, 3)])
    r = rebuild_catalog(catalog, history.fm)
    assert r.commits == 2 and r.reads == 2 + len(history.store_keys())  # one header per store, for v4
    for key in history.store_keys():
        assert catalog.committed_versions(uri, *key) == [
            (v, history.committed_id(key, v), history.committed_id(key, v - 1)) for v in (4, 5)
        ]


def test_unreadable_files_are_named_and_retried(catalog: Catalog, history: History) -> None:
    uri = history.fm.root_uri
    history.run(4, retry_every=0, snapshot_every=2)
    sync_catalog(catalog, history.fm)
    history.batch(snapshot=True)
    store = StoreId("agg", 0)
    manifest = store.manifest(5, history.committed_id(("agg", 0), 5) or "")
    good = history.fm.read_bytes(manifest)
    history.fm.delete_many([manifest])
    with history.fm.create(manifest) as out:
        out.write(good[:-7])  # truncated
    with pytest.raises(CatalogSyncError) as err:
        sync_catalog(catalog, history.fm)
    assert manifest in str(err.value)
    assert err.value.result.snapshots == len(history.store_keys()) - 1
    # SSTs of that store keep their state: nothing is declared orphan from a manifest we could not read.
    assert all(f.state == "live" for f in catalog.files(uri, kinds=["sst"], operator="agg", partition=0))
    # Fixed: the next incremental sync reads it (the cursor did not move past it).
    history.fm.delete_many([manifest])
    with history.fm.create(manifest) as out:
        out.write(good)
    r = sync_catalog(catalog, history.fm)
    assert r.errors == [] and r.snapshots == 1
    fresh_export = catalog_export(catalog, uri)
    rebuild_catalog(catalog, history.fm)
    exports_equal(fresh_export, catalog_export(catalog, uri))


def test_sync_records_a_run_when_asked(catalog: Catalog, history: History) -> None:
    history.run(2, retry_every=0, snapshot_every=0)
    sync_catalog(catalog, history.fm, record_run=True, orchestrator_run_id="dagster-run-1")
    (run,) = catalog.runs(history.fm.root_uri)
    assert run.kind == "catalog-incremental" and run.status == "succeeded"
    assert run.orchestrator_run_id == "dagster-run-1" and run.file_count > 0 and run.store_count == 3


def test_a_file_listed_again_is_written_only_when_it_changed(catalog: Catalog, history: History) -> None:
    """Syncs skip the rows a listing repeats unchanged, but a file rewritten in place gets its new size."""
    uri = history.fm.root_uri
    history.run(2, retry_every=0, snapshot_every=0)
    with history.fm.create("notes/README.txt") as out:
        out.write(b"v1")
    sync_catalog(catalog, history.fm, full=True)
    history.fm.delete_many(["notes/README.txt"])
    with history.fm.create("notes/README.txt") as out:
        out.write(b"version two")
    again = sync_catalog(catalog, history.fm, full=True)
    assert again.files_new == 0
    (notes,) = [f for f in catalog.files(uri) if f.path == "notes/README.txt"]
    assert notes.size == len(b"version two")
