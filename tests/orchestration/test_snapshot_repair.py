"""Snapshot repair through Dagster: a truncated snapshot manifest is replaced by the snapshot job and
expired by the expiry job, whose `retained_versions_loadable` check passes (local and S3)."""

from __future__ import annotations

from statekeeper.maintenance.inventory import Inventory
from statekeeper.orchestration.assets import RETAINED, SNAPSHOTS
from statekeeper.orchestration.checks import CHAINS, LOADABLE
from statekeeper.store import StateStore
from statekeeper.store.files import open_file_manager
from statekeeper.store.layout import StoreId
from tests.maintenance.helpers import clobber
from tests.orchestration.conftest import RETAIN, THRESHOLD, Orch
from tests.orchestration.test_maintenance_assets import check, materialization, run_job


def test_snapshot_and_expiry_jobs_repair_a_truncated_manifest(orch: Orch) -> None:
    orch.writer.commit(THRESHOLD)
    run_job(orch, SNAPSHOTS)
    fm = open_file_manager(orch.root)
    store = StoreId("agg", 0)
    bad = max(Inventory.scan(fm, use_cache=False).files_of(store).manifests.values(), key=lambda e: e.path).path
    data = fm.read_bytes(bad)
    clobber(orch.root, bad, data[: len(data) // 2])
    latest = orch.writer.commit(1)
    with StateStore(orch.root, "agg", 0) as fresh:  # the load repairs around it
        fresh.load(latest)
        assert fresh.last_load is not None and fresh.last_load.repaired_snapshots == 1

    result = run_job(orch, SNAPSHOTS)  # the chain of agg/0 (1) is below the threshold: a repair
    md = materialization(result, SNAPSHOTS)
    assert md["snapshots"] == 1
    assert [r.data["store"] for r in md["details"].records if r.data["action"] == "snapshot"] == ["agg/0"]
    passed, _ = check(result, CHAINS)
    assert passed

    orch.writer.commit(RETAIN)
    result = run_job(orch, RETAINED)
    passed, chk = check(result, LOADABLE)
    assert passed, chk
    assert not fm.exists(bad)
    with StateStore(orch.root, "agg", 0) as fresh:
        fresh.load(orch.writer.version)
        assert fresh.last_load is not None and fresh.last_load.repaired_snapshots == 0
