"""Catalog queries on real checkpoints: files of a version, chain lengths, retention plans, run history."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from statekeeper.maintenance.catalog_sync import sync_catalog
from statekeeper.sql import Catalog, CatalogConfigError, NotInCatalogError
from statekeeper.store import StateStore, open_file_manager
from statekeeper.store.files import CheckpointFileManager
from statekeeper.store.layout import commit_path
from tests.sql.histories import History


@pytest.fixture
def history(tmp_path: Path) -> Iterator[History]:
    """8 batches, losing attempts every 3rd, snapshots of every store at versions 3 and 6."""
    h = History(tmp_path.joinpath("ckpt").as_uri())
    h.run(8, retry_every=3, snapshot_every=3)
    yield h
    h.close()


def load_state(fm: CheckpointFileManager, key: tuple[str, int], version: int) -> dict[bytes, bytes]:
    store = StateStore(fm, *key)
    try:
        store.load(version)
        return dict(store.items())
    finally:
        store.close()


def test_files_for_version_are_exactly_what_a_load_needs(catalog: Catalog, history: History, tmp_path: Path) -> None:
    sync_catalog(catalog, history.fm)
    uri = history.fm.root_uri
    for key in history.store_keys():
        for v in range(1, history.version + 1):
            vf = catalog.files_for_version(uri, *key, v)
            assert vf.loadable and vf.checkpoint_id == history.committed_id(key, v)
            base = max((s for s in history.snapshots[key] if s <= v), default=None)
            assert vf.snapshot_version == base
            assert [f.version for f in vf.changelogs] == list(range((base or 0) + 1, v + 1))
            assert (vf.manifest is not None) == (base is not None) and (len(vf.ssts) > 0) == (base is not None)
            # Copy only those files, and the commit records of the lineage they hold (a load checks each against
            # its record, invariant 13), to a new root: the version loads there.
            copy = open_file_manager(tmp_path.joinpath(f"copy-{key[0]}-{key[1]}-{v}").as_uri())
            records = [commit_path(u) for u in range(base or 1, v + 1)]
            for path in [*(f.path for f in vf.files), *records]:
                with copy.create(path) as out:
                    out.write(history.fm.read_bytes(path))
            assert load_state(copy, key, v) == history.states[key][v]
    zero = catalog.files_for_version(uri, "agg", 0, 0)
    assert zero.files == [] and zero.loadable
    with pytest.raises(NotInCatalogError, match="version 9 of store agg/0"):
        catalog.files_for_version(uri, "agg", 0, 9)
    with pytest.raises(NotInCatalogError, match="store agg/7"):
        catalog.files_for_version(uri, "agg", 7, 1)
    with pytest.raises(NotInCatalogError, match="not in the catalog"):
        catalog.files_for_version("file:///nowhere", "agg", 0, 1)


def test_files_for_version_reports_missing_files(catalog: Catalog, history: History) -> None:
    sync_catalog(catalog, history.fm)
    uri = history.fm.root_uri
    vf = catalog.files_for_version(uri, "agg", 0, 8)
    gone = [vf.changelogs[0].path, vf.ssts[0].path]
    history.fm.delete_many(gone)
    sync_catalog(catalog, history.fm, full=True)
    after = catalog.files_for_version(uri, "agg", 0, 8)
    assert not after.loadable and after.missing == [gone[1], gone[0]]
    assert after.to_json()["missing"] == after.missing


def test_chain_lengths(catalog: Catalog, history: History) -> None:
    sync_catalog(catalog, history.fm)
    uri = history.fm.root_uri
    chains = catalog.chain_lengths(uri)
    assert [(c.operator, c.partition) for c in chains] == history.store_keys()
    for c in chains:
        assert (c.latest_version, c.snapshot_version, c.chain_length) == (8, 6, 2)
        assert c.latest_checkpoint_id == history.committed_id((c.operator, c.partition), 8)
    history.batch()
    history.batch()
    history.snapshot(("join", 0))
    sync_catalog(catalog, history.fm)
    by_store = {(c.operator, c.partition): c.chain_length for c in catalog.chain_lengths(uri)}
    assert by_store == {("agg", 0): 4, ("agg", 1): 4, ("join", 0): 0}
    assert [(c.operator, c.partition) for c in catalog.chain_lengths(uri, min_length=4)] == [("agg", 0), ("agg", 1)]
    # A deleted snapshot no longer counts.
    snap = catalog.files_for_version(uri, "join", 0, 10).manifest
    assert snap is not None
    catalog.mark_deleted(uri, [snap.path])
    assert {c.operator: c.chain_length for c in catalog.chain_lengths(uri) if c.operator == "join"} == {"join": 4}


@pytest.mark.parametrize(
    ("retain", "base", "manifests"), [(1, 6, 1), (3, 6, 1), (6, 3, 0), (8, None, 0), (50, None, 0)]
)
def test_retention_plan_keeps_every_retained_version_loadable(
    catalog: Catalog, history: History, tmp_path: Path, retain: int, base: int | None, manifests: int
) -> None:
    sync_catalog(catalog, history.fm)
    uri = history.fm.root_uri
    plan = catalog.retention_plan(uri, retain)
    assert plan.to_json()["total_files"] == plan.total_files
    keys = history.store_keys()
    for s in plan.stores:
        key = (s.operator, s.partition)
        assert (s.latest_version, s.retain_from, s.base_snapshot_version) == (8, max(1, 9 - retain), base)
        kinds = [f.kind for f in s.files]
        assert kinds.count("changelog") == (base or 0)
        assert kinds.count("manifest") == manifests
        # Nothing a retained version needs is in the plan.
        needed = {f.path for v in range(s.retain_from, 9) for f in catalog.files_for_version(uri, *key, v).files}
        assert not needed & {f.path for f in s.files}
        # Every committed changelog at or below the base is in it; no losing attempt is.
        committed = {history.committed_id(key, v) for v in range(1, (base or 0) + 1)}
        assert {f.checkpoint_id for f in s.files if f.kind == "changelog"} == committed - {None}
    assert [(s.operator, s.partition) for s in plan.stores] == keys
    # Apply it: every retained version still loads and equals the model.
    result = history.fm.delete_many(plan.paths)
    assert not result.errors
    catalog.mark_deleted(uri, plan.paths)
    for key in keys:
        for v in range(max(1, 9 - retain), 9):
            assert load_state(history.fm, key, v) == history.states[key][v]
    # Once applied, the same setting has nothing more to delete.
    assert catalog.retention_plan(uri, retain).total_files == 0


def test_retention_plan_options(catalog: Catalog, history: History) -> None:
    sync_catalog(catalog, history.fm)
    uri = history.fm.root_uri
    for bad in (0, -1):
        with pytest.raises(CatalogConfigError, match="at least 1 version"):
            catalog.retention_plan(uri, bad)
    only = catalog.retention_plan(uri, 2, operator="agg", partition=1)
    assert [(s.operator, s.partition) for s in only.stores] == [("agg", 1)]
    with_commits = catalog.retention_plan(uri, 2, commit_records=True)
    assert [f.path for f in with_commits.commit_records] == [commit_path(v) for v in range(1, 7)]
    assert with_commits.total_files == catalog.retention_plan(uri, 2).total_files + 6


def test_run_history(catalog: Catalog) -> None:
    uri = "file:///ckpt"
    with catalog.record_run(uri, "snapshot", orchestrator_run_id="run-1") as run:
        run.stores, run.files, run.bytes = 3, 4, 5000
        run.details["uploaded"] = 2
    with pytest.raises(RuntimeError, match="disk on fire"), catalog.record_run(uri, "expire", dry_run=True) as run:
        run.files = 7
        raise RuntimeError("disk on fire")
    with catalog.record_run(uri, "orphans") as run:
        run.errors.append("state/x: permission denied")
    other = catalog.start_run("s3://b/other", "verify")
    catalog.finish_run(other, stores=1)
    runs = catalog.runs(uri)
    assert [r.kind for r in runs] == ["orphans", "expire", "snapshot"]
    orphans, expire, snap = runs
    assert (snap.status, snap.store_count, snap.file_count, snap.byte_count) == ("succeeded", 3, 4, 5000)
    assert snap.details == {"uploaded": 2} and snap.orchestrator_run_id == "run-1" and not snap.dry_run
    assert snap.seconds is not None and snap.seconds >= 0
    assert (expire.status, expire.dry_run, expire.file_count, expire.error_count) == ("failed", True, 7, 1)
    assert expire.errors is not None and "disk on fire" in expire.errors
    assert (orphans.status, orphans.errors) == ("failed", "state/x: permission denied")
    assert [r.kind for r in catalog.runs(uri, kind="expire")] == ["expire"]
    assert [r.kind for r in catalog.runs(uri, status="succeeded")] == ["snapshot"]
    assert len(catalog.runs()) == 4 and len(catalog.runs(limit=2)) == 2
    assert catalog.runs("s3://b/other")[0].to_json()["stores"] == 1
    with pytest.raises(CatalogConfigError):
        catalog.finish_run(other, status="running")
    with pytest.raises(NotInCatalogError):
        catalog.finish_run(10**6)


def test_runs_after_reads_on_from_an_id_outside_the_orchestrator(catalog: Catalog) -> None:
    uri = "s3://b/ckpt"
    ids = [catalog.start_run(uri, "snapshot") for _ in range(3)]
    dagster = catalog.start_run(uri, "expire", orchestrator_run_id="a-dagster-run")
    elsewhere = catalog.start_run("s3://b/other", "expire")
    catalog.finish_run(ids[2], files=4)
    assert [r.id for r in catalog.runs_after(uri, 0)] == ids  # oldest first, this root's, none of Dagster's
    assert [r.id for r in catalog.runs_after(uri, ids[1])] == [ids[2]]
    assert [r.id for r in catalog.runs_after(uri, ids[2], also=[ids[0]])] == [ids[0]]
    assert [r.id for r in catalog.runs_after(uri, ids[0], outside_orchestrator=False)] == [ids[1], ids[2], dagster]
    assert [r.id for r in catalog.runs_after(uri, 0, limit=2)] == ids[:2]
    assert catalog.runs_after(uri, ids[1])[0].file_count == 4
    assert [r.id for r in catalog.runs_after("s3://b/other", 0)] == [elsewhere]


def test_roots_are_kept_apart(catalog: Catalog, tmp_path: Path) -> None:
    a = History(tmp_path.joinpath("a").as_uri(), operators={"agg": 1}, seed=1).run(3, snapshot_every=2)
    b = History(tmp_path.joinpath("b").as_uri(), operators={"agg": 1}, seed=2).run(5, snapshot_every=0)
    try:
        for h in (a, b):
            sync_catalog(catalog, h.fm)
        assert catalog.roots() == sorted([a.fm.root_uri, b.fm.root_uri])
        assert [c.latest_version for c in catalog.chain_lengths(a.fm.root_uri)] == [3]
        assert [c.chain_length for c in catalog.chain_lengths(b.fm.root_uri)] == [5]
        assert all(f.path in {i.path for i in a.fm.list("")} for f in catalog.files(a.fm.root_uri))
        with catalog.record_run(a.fm.root_uri, "snapshot"), catalog.acquire_lease(a.fm.root_uri, ("agg", 0)):
            catalog.reset_root(a.fm.root_uri)  # derived rows only: run history and leases stay
            assert catalog.files(a.fm.root_uri) == [] and catalog.stores(a.fm.root_uri) == []
            assert len(catalog.leases(a.fm.root_uri)) == 1
        assert len(catalog.runs(a.fm.root_uri)) == 1
        catalog.forget_root(a.fm.root_uri)
        assert catalog.roots() == [b.fm.root_uri] and catalog.runs(a.fm.root_uri) == []
        assert len(catalog.files(b.fm.root_uri)) == len(list(b.fm.list("")))
    finally:
        a.close()
        b.close()
