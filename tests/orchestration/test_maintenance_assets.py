"""Snapshot, expiry and orphan-cleanup jobs (with their checks) on real local and S3 checkpoints."""

from __future__ import annotations

from typing import Any

import pytest
from dagster import AssetKey

from statekeeper.orchestration.assets import ORPHANS, RETAINED, SNAPSHOTS, parse_stores
from statekeeper.orchestration.checks import CHAINS, LOADABLE, NO_ORPHANS
from statekeeper.orchestration.jobs import JOB_NAMES
from statekeeper.sql import Catalog
from statekeeper.store import StateStore
from statekeeper.store.errors import ConfigurationError
from statekeeper.store.files import open_file_manager
from statekeeper.store.layout import StoreId
from tests.orchestration.conftest import RETAIN, THRESHOLD, Orch


def run_job(orch: Orch, asset: str, **kw: Any) -> Any:
    job = orch.defs.resolve_job_def(JOB_NAMES[asset])
    result = job.execute_in_process(partition_key=orch.root, instance=orch.instance, **kw)
    assert result.success
    return result


def materialization(result: Any, asset: str) -> dict[str, Any]:
    mats = [e for e in result.get_asset_materialization_events() if e.asset_key == AssetKey(asset)]
    assert len(mats) == 1
    return {k: v.value for k, v in mats[0].materialization.metadata.items()}


def check(result: Any, name: str) -> tuple[bool, dict[str, Any]]:
    evals = [e for e in result.get_asset_check_evaluations() if e.check_name == name]
    assert len(evals) == 1
    return evals[0].passed, {k: v.value for k, v in evals[0].metadata.items()}


def catalog_run(orch: Orch, run_id: str, kind: str) -> Any:
    runs = [r for r in orch.catalog.runs(orch.root, kind=kind) if r.orchestrator_run_id == run_id and not r.dry_run]
    assert len(runs) == 1, runs
    return runs[0]


def test_snapshot_job(orch: Orch) -> None:
    orch.writer.commit(THRESHOLD + 1)
    result = run_job(orch, SNAPSHOTS)
    md = materialization(result, SNAPSHOTS)
    assert md["snapshots"] == 2 and md["candidates"] == 2
    assert md["max_chain_length_after"] == 0  # after the run: every store loads from its snapshot
    assert md["max_chain_length_before"] == THRESHOLD + 1  # what the run found
    assert md["files"] > 0 and md["bytes"] > 0 and md["seconds"] > 0
    assert {r.data["store"] for r in md["details"].records} >= {"agg/0", "agg/1"}
    passed, chk = check(result, CHAINS)
    assert passed and chk["max_chain_length_after"] == 0
    run = catalog_run(orch, result.run_id, "snapshot")
    assert run.status == "succeeded" and md["catalog_run_id"] == run.id
    # a fresh store loads the latest version from the snapshot
    with StateStore(orch.root, "agg", 0) as fresh:
        fresh.load(THRESHOLD + 1)
        assert fresh.get(b"p0-k0") is not None

    # only the stores the sensor named
    orch.writer.commit(THRESHOLD)
    result = run_job(orch, SNAPSHOTS, run_config={"ops": {SNAPSHOTS: {"config": {"stores": [f"agg/1@{THRESHOLD}"]}}}})
    md = materialization(result, SNAPSHOTS)
    assert md["snapshots"] == 1
    passed, chk = check(result, CHAINS)
    assert passed is True and chk["max_chain_length_after"] == THRESHOLD  # agg/0 waits at the threshold: within


def test_expiry_job(orch: Orch) -> None:
    orch.writer.commit(THRESHOLD)
    run_job(orch, SNAPSHOTS)
    orch.writer.commit(RETAIN + 2)
    dry = run_job(orch, RETAINED, run_config={"ops": {RETAINED: {"config": {"dry_run": True}}}})
    would = materialization(dry, RETAINED)
    assert would["dry_run"] == 1 and would["files"] > 0
    result = run_job(orch, RETAINED)
    md = materialization(result, RETAINED)
    assert md["dry_run"] == 0 and md["files"] == would["files"] and md["bytes"] > 0
    assert md["changelogs"] > 0
    passed, chk = check(result, LOADABLE)
    assert passed, chk
    run = catalog_run(orch, result.run_id, "expire")
    assert run.file_count == md["files"]


def test_a_run_takes_the_leases_of_its_stores_in_one_catalog_transaction(
    orch: Orch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a cycle of the maintenance loop: one acquisition, renewal and release for the run, not one per store."""
    orch.writer.commit(THRESHOLD)
    run_job(orch, SNAPSHOTS)
    orch.writer.commit(RETAIN + 2)
    together: list[set[str]] = []
    one_by_one: list[object] = []
    acquire_leases, acquire_lease = Catalog.acquire_leases, Catalog.acquire_lease

    def counted_group(self: Catalog, uri: str, stores: list[tuple[str, int]], **kw: Any) -> Any:
        lease, refused = acquire_leases(self, uri, stores, **kw)
        together.append(set(lease.scopes) if lease is not None else set())
        return lease, refused

    def counted_single(self: Catalog, uri: str, store: Any = None, **kw: Any) -> Any:
        one_by_one.append(store)
        return acquire_lease(self, uri, store, **kw)

    marked: list[list[str]] = []
    mark_expired = Catalog.mark_expired

    def counted_marks(self: Catalog, uri: str, paths: Any) -> int:
        marked.append(list(paths))
        return mark_expired(self, uri, marked[-1])

    monkeypatch.setattr(Catalog, "acquire_leases", counted_group)
    monkeypatch.setattr(Catalog, "acquire_lease", counted_single)
    monkeypatch.setattr(Catalog, "mark_expired", counted_marks)
    for asset in (RETAINED, SNAPSHOTS):
        together.clear()
        orch.writer.commit(THRESHOLD)
        result = run_job(orch, asset)
        assert materialization(result, asset)["files"] > 0, f"{asset} changed both stores"
        assert together == [{"agg/0", "agg/1"}] and one_by_one == [], f"{asset}: {together}, {one_by_one}"
        assert orch.catalog.leases(orch.root) == [], "released when the run's operation ends"
    # the expiry run's files of both stores marked in one catalog statement (commit records go after them)
    of_stores = [{p.split("/")[2] for p in paths if p.startswith("state/")} for paths in marked]
    assert [s for s in of_stores if s] == [{"00000", "00001"}], marked


def test_a_run_leaves_a_store_held_elsewhere_untouched(orch: Orch) -> None:
    """Invariant 5 with the run's group lease: the store another maintainer holds is refused by name and
    not touched; the others are expired; the holder's lease stays, the run's own are released."""
    orch.writer.commit(THRESHOLD)
    run_job(orch, SNAPSHOTS)
    orch.writer.commit(RETAIN + 2)
    fm = open_file_manager(orch.root)

    def files_of(prefix: str) -> dict[str, int]:
        return {i.path: i.size for i in fm.list(prefix)}

    held_before, free_before = files_of("state/agg/00001/"), files_of("state/agg/00000/")
    job = orch.defs.resolve_job_def(JOB_NAMES[RETAINED])
    with orch.catalog.acquire_lease(orch.root, ("agg", 1), owner="other-host:4242", ttl=60):
        result = job.execute_in_process(partition_key=orch.root, instance=orch.instance, raise_on_error=False)
        assert [(lease.scope, lease.owner) for lease in orch.catalog.leases(orch.root)] == [
            ("agg/1", "other-host:4242")
        ], "the run released its own leases"
    assert not result.success
    failure = [e for e in result.all_events if e.is_step_failure]
    assert failure and "other-host:4242" in str(failure[0].step_failure_data.error)
    assert files_of("state/agg/00001/") == held_before, "the held store is untouched"
    assert set(files_of("state/agg/00000/")) < set(free_before), "the free store is expired"


def test_orphan_cleanup_job(orch: Orch) -> None:
    orch.writer.commit(2)
    orch.writer.losing_attempt()  # a losing attempt of version 3 ...
    orch.writer.commit(1)  # ... once version 3 is committed with another id
    result = run_job(orch, ORPHANS)
    md = materialization(result, ORPHANS)
    assert md["files"] >= 1 and md["changelogs"] >= 1
    passed, chk = check(result, NO_ORPHANS)
    assert passed and chk["orphans_past_grace"] == 0
    assert catalog_run(orch, result.run_id, "clean-orphans")


def test_snapshot_config_names_stores_and_the_versions_they_were_requested_at() -> None:
    assert parse_stores([]) is None
    specs = ["agg/0@12", "agg/1", "agg/0@10", "agg/1@7", "agg/2"]
    assert parse_stores(specs) == {StoreId("agg", 0): 10, StoreId("agg", 1): 7, StoreId("agg", 2): None}


@pytest.mark.parametrize("spec", ["agg", "agg/x", "agg/0@", "agg/0@x", "agg/0@-1"])
def test_a_bad_store_in_the_snapshot_config_is_named(spec: str) -> None:
    with pytest.raises(ConfigurationError, match=f"invalid store '{spec}'"):
        parse_stores(["agg/1", spec])


def test_the_orphan_check_run_alone_fails_where_its_dry_run_could_not_look(orch: Orch) -> None:
    """A store holding a foreign file is left alone by orphan cleanup, so its orphans go uncounted: the check (run
    alone, as from the Checks tab) fails naming the file, not passes with 0 orphans beside the error."""
    from dagster import AssetCheckKey

    orch.writer.commit(2)
    orch.writer.losing_attempt()
    orch.writer.commit(1)
    foreign = "state/agg/00000/changelogs/00000000000000000001_nothex.changelog"
    with open_file_manager(orch.root).create(foreign) as f:
        f.write(b"not ours")
    job = orch.defs.resolve_job_def(JOB_NAMES[ORPHANS]).get_subset(
        asset_selection=set(), asset_check_selection={AssetCheckKey(AssetKey(ORPHANS), NO_ORPHANS)}
    )
    result = job.execute_in_process(partition_key=orch.root, instance=orch.instance, raise_on_error=False)
    passed, chk = check(result, NO_ORPHANS)
    assert not passed and chk["errors"] >= 1 and foreign in chk["first_errors"]
