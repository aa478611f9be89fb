"""Chain length and snapshot lag per store as plotted metadata; an error check when a chain passes 2x the threshold."""

from __future__ import annotations

from statekeeper.orchestration.assets import SNAPSHOTS
from statekeeper.orchestration.checks import CHAINS_BOUNDED
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

    result = run_job(orch, SNAPSHOTS)  # caught up
    md = materialization(result, SNAPSHOTS)
    assert md["chain_length_max"] == 0 and md["snapshot_lag_seconds_max"] == 0
    passed, _ = check(result, CHAINS_BOUNDED)
    assert passed
