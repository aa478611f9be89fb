"""When a store is due for a snapshot (`statekeeper.maintenance.snapshot_policy`), the policy the maintenance loop
and the checkpoint sensor share: the crossing version, the lead ahead of the threshold and the landed lag."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statekeeper.maintenance.settings import MaintenanceSettings, SnapshotSchedule
from statekeeper.maintenance.snapshot_policy import crossing_version, landed_lag, snapshot_lead
from statekeeper.sql import StoreChain
from statekeeper.store.layout import StoreId


@settings(max_examples=60, deadline=None)
@given(
    threshold=st.integers(1, 50),
    spread=st.sampled_from([0.0, 0.5, 0.9]),
    phase=st.booleans(),
    partition=st.integers(0, 31),
    since=st.integers(0, 500),
    chain_length=st.integers(0, 200),
    lead=st.integers(0, 49),
)
def test_a_store_crosses_at_its_point_then_every_threshold(
    threshold: int, spread: float, phase: bool, partition: int, since: int, chain_length: int, lead: int
) -> None:
    """Due (a crossing) exactly when the chain reached its point (`snapshot_due_at`) less the lead; the crossing is
    the newest version of the chain at the point plus a whole number of thresholds."""
    policy = MaintenanceSettings(
        snapshot_threshold=threshold,
        snapshot_spread=0.0 if phase else spread,
        snapshot_schedule=SnapshotSchedule.PHASE if phase else SnapshotSchedule.THRESHOLD,
    )
    store = StoreId("agg", partition)
    point = max(1, policy.snapshot_due_at("agg", partition, since) - lead)
    crossed = crossing_version(policy, store, since + chain_length, chain_length, lead)
    if chain_length < point:
        assert crossed is None
    else:
        assert crossed is not None and since + point <= crossed <= since + chain_length
        assert (crossed - since - point) % threshold == 0 and since + chain_length - crossed < threshold
    assert (crossing_version(policy, store, since + chain_length, chain_length) is not None) == (
        chain_length >= policy.snapshot_due_at("agg", partition, since)
    ), "without a lead: due at the point `statekeeper maintain` draws"


@pytest.mark.parametrize(
    ("lag", "threshold", "lead"), [(0, 10, 0), (8, 10, 0), (9, 10, 1), (12, 10, 4), (40, 10, 9), (9, 1, 0)]
)
def test_snapshot_lead_lands_snapshots_before_twice_the_threshold(lag: int, threshold: int, lead: int) -> None:
    assert snapshot_lead(lag, threshold) == lead
    if lead < threshold - 1:
        assert threshold - lead + lag <= 2 * threshold - threshold // 4


def test_snapshot_lag_after_an_outage_falls_back_within_a_few_snapshots() -> None:
    """A snapshot that landed hours of commits after its request (the daemon was down) puts the lead at its cap,
    not for hours: the lag is kept under 2 x threshold and falls halfway with each on-time landing."""
    threshold = 10

    def landed(lag: int, version: int, snapshot: int) -> int:
        chain = StoreChain("agg", 0, snapshot, "c", snapshot, 0, None)
        new_lag, stores = landed_lag([chain], {"agg/0": version}, lag, threshold)
        assert stores == ({"agg/0"} if snapshot >= version else set())
        return new_lag

    lag = landed(0, 10, 3_610)
    assert lag == 2 * threshold and snapshot_lead(lag, threshold) == threshold - 1
    lags = [lag := landed(lag, 100 * n, 100 * n + 5) for n in range(1, 4)]
    assert lags == [12, 8, 6] and snapshot_lead(lags[-1], threshold) == 0
    assert landed(lag, 500, 499) == lag, "a snapshot older than the version requested at is not the answer"
