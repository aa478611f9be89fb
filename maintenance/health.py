"""How far behind maintenance is, per store: chain length and snapshot lag, from one inventory.

A fleet of stores stays bounded only if every store is snapshotted before its chain of changelogs
grows long. Two numbers say how well maintenance keeps up, for dashboards (Dagster metadata), asset
checks and the fleet benchmark:

- **chain length**: changelogs a load of the latest version replays (latest - newest intact snapshot);
- **snapshot lag**: seconds since the oldest version no snapshot covers was committed (0 when the
  newest version has a snapshot): how long state has waited for a snapshot.

`store_health` reads them from an `Inventory` (one listing; parsed commit records and manifests are
cached per process); `health_from_chains` from the catalog's `chain_lengths`, without a listing.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.plan import plan_store
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.sql.lineage import StoreChain
from statekeeper.store.layout import StoreId


def chain_bound(threshold: int) -> int:
    """The longest chain a store of a fleet that maintenance keeps up with shows: twice the snapshot threshold
    (a store reaches the threshold, then waits for its round). Past it, loads replay more than they were sized
    for: the `chains_within_twice_threshold` check fails and the maintenance loop warns."""
    return 2 * threshold


@dataclass(frozen=True, slots=True)
class StoreHealth:
    store: StoreId
    latest: int
    snapshot_version: int
    """Version of the newest intact snapshot (0: none)."""
    chain_length: int
    lag_seconds: float


@dataclass(frozen=True, slots=True)
class FleetHealth:
    """Percentiles over the stores of a root (nearest rank)."""

    stores: int
    chain_p50: int
    chain_p99: int
    chain_max: int
    lag_p50: float
    lag_p99: float
    lag_max: float

    def metadata(self) -> dict[str, int | float]:
        return {
            "chain_length_p50": self.chain_p50,
            "chain_length_p99": self.chain_p99,
            "chain_length_max": self.chain_max,
            "snapshot_lag_seconds_p50": round(self.lag_p50, 3),
            "snapshot_lag_seconds_p99": round(self.lag_p99, 3),
            "snapshot_lag_seconds_max": round(self.lag_max, 3),
        }


def store_health(inv: Inventory, settings: MaintenanceSettings, *, now: float | None = None) -> list[StoreHealth]:
    """Chain length and snapshot lag of every store of `inv` with a committed version."""
    now = time.time() if now is None else now
    out: list[StoreHealth] = []
    for store in inv.store_ids():
        plan = plan_store(inv, store, settings, now=now)
        if plan.latest is None:
            continue
        snap = plan.snapshot[0] if plan.snapshot else 0
        lag = 0.0
        if plan.chain_length > 0:
            record = inv.records.get(snap + 1)
            lag = max(0.0, now - record.created_at) if record is not None else math.nan
        out.append(StoreHealth(store, plan.latest, snap, plan.chain_length, lag))
    return out


def health_from_chains(chains: list[StoreChain], *, now: float | None = None) -> list[StoreHealth]:
    """The same numbers from the catalog (`Catalog.chain_lengths`, synced beforehand)."""
    now = time.time() if now is None else now
    out: list[StoreHealth] = []
    for c in chains:
        lag = 0.0
        if c.chain_length > 0:
            lag = math.nan if c.pending_since is None else max(0.0, now - c.pending_since.timestamp())
        store = StoreId(c.operator, c.partition)
        out.append(StoreHealth(store, c.latest_version, c.snapshot_version or 0, c.chain_length, lag))
    return out


def _rank(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


def summarize(health: list[StoreHealth]) -> FleetHealth:
    if not health:
        return FleetHealth(0, 0, 0, 0, 0.0, 0.0, 0.0)
    chains = sorted(float(h.chain_length) for h in health)
    lags = sorted(h.lag_seconds for h in health if not math.isnan(h.lag_seconds)) or [0.0]
    return FleetHealth(
        len(health),
        int(_rank(chains, 0.5)),
        int(_rank(chains, 0.99)),
        int(chains[-1]),
        _rank(lags, 0.5),
        _rank(lags, 0.99),
        lags[-1],
    )


__all__ = ["FleetHealth", "StoreHealth", "chain_bound", "health_from_chains", "store_health", "summarize"]
