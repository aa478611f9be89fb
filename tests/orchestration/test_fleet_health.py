"""Chain length and snapshot lag per store as plotted metadata; an error check when a chain passes 2x the threshold."""

from __future__ import annotations

import time

from statekeeper.maintenance.catalog_sync import sync_catalog
from statekeeper.maintenance.health import health_from_chains, store_health
from statekeeper.maintenance.inventory import Inventory
from statekeeper.orchestration.assets import SNAPSHOTS
from statekeeper.orchestration.checks import CHAINS_BOUNDED
from statekeeper.store import open_file_manager
from tests.orchestration.conftest import THRESHOLD, Orch
from tests.orchestration.test_maintenance_assets import check, materialization, run_job


def test_per_store_chain_and_lag_metadata_and_the_twice_threshold_check(orch: Orch) -> None:
    orch.writer.commit(2 * THRESHOLD + 1)
    # only agg/0 is snapshotted (as if the maintainer had fallen behind on agg/1)
    result = run_job(orch, SNAPSHOTS, run_config={"ops": {SNAPSHOTS: {"config": {"stores": ["agg/0"]}}}})
    md = materialization(result, SNAPSHOTS)
    assert md["chain_length/agg/0"] == 0 and md["snapshot_lag_seconds/agg/0"] == 0
    assert md["chain_length/agg/1"] == 2 * THRESHOLD + 1 and md["snapshot_lag_seconds/agg/1"] > 0
    assert md["chain_length_max"] == 2 * THRESHOLD + 1 and md["stores_with_series"] == 2
    passed, chk = check(result, CHAINS_BOUNDED)
    assert not passed and chk["stores_over_limit"] == 1 and chk["chain_length_limit"] == 2 * THRESHOLD

    result = run_job(orch, SNAPSHOTS)  # caught up; the check says what this run found (agg/1 still over the bound)
    md = materialization(result, SNAPSHOTS)
    assert md["chain_length_max"] == 0 and md["snapshot_lag_seconds_max"] == 0
    passed, chk = check(result, CHAINS_BOUNDED)
    assert not passed and chk["stores_over_limit"] == 0 and chk["max_chain_length_before"] == 2 * THRESHOLD + 1
    passed, _ = check(run_job(orch, SNAPSHOTS), CHAINS_BOUNDED)  # a run that found every chain within it
    assert passed


def test_the_catalogs_health_equals_the_listings(orch: Orch) -> None:
    """The assets plot health from the catalog (no listing of the root): it must say what a listing says."""
    orch.writer.commit(2 * THRESHOLD + 1)
    run_job(orch, SNAPSHOTS, run_config={"ops": {SNAPSHOTS: {"config": {"stores": ["agg/0"]}}}})
    orch.writer.commit(2)  # agg/0: two versions past its snapshot; agg/1: none yet
    sync_catalog(orch.catalog, open_file_manager(orch.root))

    now = time.time()
    settings = orch.resources["maintenance"].settings()
    listed = sorted(store_health(Inventory.scan(open_file_manager(orch.root)), settings, now=now), key=str)
    cataloged = sorted(health_from_chains(orch.catalog.chain_lengths(orch.root), now=now), key=str)
    assert [(h.store, h.latest, h.snapshot_version, h.chain_length) for h in cataloged] == [
        (h.store, h.latest, h.snapshot_version, h.chain_length) for h in listed
    ]
    assert [h.chain_length for h in cataloged] == [2, 2 * THRESHOLD + 3]
    for c, li in zip(cataloged, listed, strict=True):
        assert c.lag_seconds > 0 and abs(c.lag_seconds - li.lag_seconds) < 0.01
