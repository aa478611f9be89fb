"""When a store is due for a snapshot: the one definition `statekeeper maintain` and the checkpoint sensor share.

A store's chain is due at its point (`MaintenanceSettings.snapshot_due_at`: the threshold, less the spread's draw,
or the distance to its phase). The maintenance loop builds a store once its chain reached that point; the
checkpoint sensor requests a snapshot at the version where the chain crossed it (`crossing_version`, the same
test), `snapshot_lead` commits early when the root's snapshots land late (`landed_lag`).
"""

from __future__ import annotations

from collections.abc import Iterable

from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.sql.lineage import StoreChain
from statekeeper.store.layout import StoreId


def crossing_version(
    settings: MaintenanceSettings, store: StoreId, latest: int, chain_length: int, lead: int = 0
) -> int | None:
    """The version at which the store's chain (`chain_length` changelogs up to `latest`) last crossed its point, less
    `lead` changelogs, then every threshold more; None: not yet (the store is not due)."""
    threshold = settings.snapshot_threshold
    since = latest - chain_length  # where the chain starts: its newest snapshot, or a full-state changelog
    first = max(1, settings.snapshot_due_at(store.operator, store.partition, since) - lead)
    if chain_length < first:
        return None
    return since + first + threshold * ((chain_length - first) // threshold)


def snapshot_lead(lag: int, threshold: int) -> int:
    """How many commits before the threshold a store's snapshot is requested, so that with the root's snapshot
    lag it lands before the chain passes 2 x threshold, with a quarter of the threshold to spare: none while
    snapshots land within about 3/4 of a threshold of their request, at most threshold - 1."""
    return max(0, min(threshold - 1, lag - threshold + threshold // 4))


def landed_lag(chains: Iterable[StoreChain], waiting: dict[str, int], lag: int, threshold: int) -> tuple[int, set[str]]:
    """The root's snapshot lag after this tick, and the stores whose snapshot landed: `lag`, updated with the
    snapshots that answered a request (the newest snapshot of a store at or after the version it was first
    requested at). Kept under 2 x threshold, where the lead is at its cap already, so that after an outage
    (hours of commits before a snapshot landed) it falls back within a few snapshots."""
    landed = {
        store: c.snapshot_version - waiting[store]
        for c in chains
        if c.snapshot_version is not None
        and (store := f"{c.operator}/{c.partition}") in waiting
        and c.snapshot_version >= waiting[store]
    }
    if not landed:
        return lag, set()
    newest = min(max(landed.values()), 2 * threshold)
    return max(newest, (lag + newest) // 2), set(landed)


__all__ = ["crossing_version", "landed_lag", "snapshot_lead"]
