"""What the fleet benchmark (`bench.fleet.beside`) samples from outside the maintainer every few seconds:
chains, snapshot lag, files and bytes of every root, against what the retained versions need."""

from __future__ import annotations

from dataclasses import dataclass, replace

from bench.fleet.maintainers import FleetParams


@dataclass
class Sample:
    t: float
    version: int
    """The oldest root's newest committed version (all roots commit in lock step)."""
    chain_p50: int
    chain_p99: int
    chain_max: int
    lag_max: float
    files: int
    bytes: int
    live_bytes: int
    bound_bytes: int
    """The target: 1.2 x what the retained versions need (the changelogs after each store's base, the
    snapshots from the base on with their SSTs, the commit records from the floor on)."""


def sample(roots: list[str], p: FleetParams, t: float) -> Sample:
    """One sample over every store of every root, `t` seconds into the run."""
    from statekeeper.maintenance.health import StoreHealth, store_health, summarize
    from statekeeper.maintenance.inventory import Inventory
    from statekeeper.maintenance.plan import plan_root
    from statekeeper.maintenance.settings import MaintenanceSettings
    from statekeeper.store.files import open_file_manager

    settings = MaintenanceSettings(
        snapshot_threshold=p.threshold,
        min_versions_to_retain=p.retain,
        orphan_grace_seconds=p.orphan_grace,
        load_grace_seconds=p.load_grace,
    )
    # what the retained versions need, with no grace at all: anything more is lag or waste
    strict_settings = replace(settings, load_grace_seconds=0.0, orphan_grace_seconds=0.0)
    health: list[StoreHealth] = []
    latest: list[int] = []
    live = needed = files = size = 0
    for root in roots:
        inv = Inventory.scan(open_file_manager(root))
        health += store_health(inv, settings)
        latest.append(inv.latest)
        for store in inv.store_ids():
            held = inv.files_of(store)
            if held.manifest_data:
                newest = max(held.manifest_data)
                live += held.manifests[newest].size + sum(s.size for s in held.manifest_data[newest].sst_files)
        strict = plan_root(inv, strict_settings)
        needed += sum(e.size for plan in strict.stores.values() for e in plan.needed)
        needed += sum(e.size for v, e in inv.commit_files.items() if v >= strict.floor)
        entries = list(inv.all_entries())
        files += len(entries)
        size += sum(e.size for e in entries)
    fleet = summarize(health)
    return Sample(
        round(t, 1),
        min(latest),
        fleet.chain_p50,
        fleet.chain_p99,
        fleet.chain_max,
        round(fleet.lag_max, 1),
        files,
        size,
        live,
        int(1.2 * needed),
    )
