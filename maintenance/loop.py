"""One long-running maintainer: expire, snapshot and clean orphans of a root every few seconds.

Running the three ``statekeeper`` commands from cron or a shell loop starts three processes per cycle,
each importing the stack, opening the catalog and rebuilding its warm replicas' view from disk: that
fixed cost dominates a maintainer of many small stores (see docs/benchmarks.md, fleet). This loop
keeps one process, one catalog connection, the warm local copies of the stores
(`statekeeper.maintenance.replica`) and the parsed commit records and manifests
(`statekeeper.maintenance.inventory`) across cycles, and takes the maintenance leases of all the
stores it finds free in one catalog transaction per cycle, so a cycle costs its listings and the work
it finds. ``statekeeper maintain ROOT --every SECONDS`` runs it.

Expiry goes first: a store's base moves when a commit makes its oldest retained version load from a
newer snapshot, not when a snapshot is written (with ``min_versions_to_retain`` >= 2 a new snapshot
is never the base at once), so what the commits since the last cycle made unneeded is deleted before
a snapshot round of many stores, not after it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from statekeeper.maintenance.expiry import expire_versions
from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.leasing import cycle_leases
from statekeeper.maintenance.orphans import clean_orphans
from statekeeper.maintenance.reports import Report
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshots import create_snapshots, raise_open_file_limit
from statekeeper.store.files import CheckpointFileManager, open_file_manager
from statekeeper.store.layout import StoreId

if TYPE_CHECKING:
    from statekeeper.sql.catalog import Catalog

log = logging.getLogger(__name__)


@dataclass
class CycleResult:
    cycle: int
    seconds: float
    reports: list[Report] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.reports)

    def summary(self) -> str:
        parts = [
            f"{r.kind}: {r.files} file(s)" + (f", {len(r.errors)} error(s)" if r.errors else "") for r in self.reports
        ]
        return f"cycle {self.cycle} ({self.seconds:.2f}s): " + "; ".join(parts)


def maintain(
    root: str | CheckpointFileManager,
    settings: MaintenanceSettings,
    *,
    every: float,
    catalog: Catalog | None = None,
    cycles: int | None = None,
    stop: threading.Event | None = None,
    on_cycle: Callable[[CycleResult], None] | None = None,
) -> list[CycleResult]:
    """Run cycles (expire, snapshot, clean orphans) starting every `every` seconds.

    Stops after `cycles` cycles, or when `stop` is set. A cycle with errors does not stop the loop
    (the next one retries); the results of every cycle are returned (only the last 100 are kept).
    """
    stop = stop or threading.Event()
    raise_open_file_limit()  # a warm copy of every store stays open across cycles
    fm = open_file_manager(root) if isinstance(root, str) else root
    results: list[CycleResult] = []
    known: list[StoreId] | None = None  # the stores the previous cycle found
    n = 0
    while not stop.is_set() and (cycles is None or n < cycles):
        n += 1
        t0 = time.monotonic()
        result = CycleResult(n, 0.0)
        # One lease per store per cycle, held (and renewed) through the three operations, released
        # here: the stores the previous cycle found are taken before this cycle's listing, so that
        # listing is one taken under their leases, and what the operations delete and write is kept in
        # it, so none lists them again (`Inventory.rescan_store`) unless a deletion or snapshot failed.
        # New stores (and all of them in the first cycle) are leased by the first operation that needs
        # them, then listed again.
        with cycle_leases(fm.root_uri, settings, catalog, stores=known or ()) as leases:
            inv = Inventory.scan(fm, parallelism=settings.parallelism, leased=leases.held_stores())
            leases.take_free(inv.store_ids())  # the new ones
            for op in (expire_versions, create_snapshots, clean_orphans):
                result.reports.append(op(fm, settings, catalog=catalog, inventory=inv))
        known = inv.store_ids()
        result.seconds = time.monotonic() - t0
        log.info("%s", result.summary())
        if on_cycle is not None:
            on_cycle(result)
        results = [*results[-99:], result]
        if cycles is not None and n >= cycles:
            break
        stop.wait(max(0.0, every - result.seconds))
    return results


__all__ = ["CycleResult", "maintain"]
