"""One long-running maintainer: expire, snapshot and clean orphans of a root every few seconds.

Running the three ``statekeeper`` commands from cron or a shell loop starts three processes per cycle,
each importing the stack, opening the catalog and rebuilding its warm replicas' view from disk: that
fixed cost dominates a maintainer of many small stores (see docs/benchmarks.md, fleet). This loop
keeps one process, one catalog connection, the local replicas of the stores
(`statekeeper.maintenance.replica`) and the parsed commit records and manifests
(`statekeeper.maintenance.inventory`) across cycles, and takes the maintenance leases of all the
stores it finds free in one catalog transaction per cycle, so a cycle costs its listings and the work
it finds. ``statekeeper maintain ROOT [ROOT ...] --every SECONDS`` runs it.

One process maintains any number of roots (the checkpoints of many queries), one after the other in each
cycle. A long-running maintainer outlives what goes wrong at run time: a cycle of a root that raises (its
bucket unreachable, the catalog down) is logged and reported as failed, and the next cycle tries again;
the other roots go on. Only a root that is wrong when the maintainer starts stops it (a typo). A root whose
chains run past twice the snapshot threshold, its writers outpacing the maintainer, is named in a warning.

Expiry goes first: a store's base moves when a commit makes its oldest retained version load from a
newer snapshot, not when a snapshot is written (with ``min_versions_to_retain`` >= 2 a new snapshot
is never the base at once), so what the commits since the last cycle made unneeded is deleted before
a snapshot round of many stores, not after it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from statekeeper.maintenance.expiry import expire_versions
from statekeeper.maintenance.health import chain_bound
from statekeeper.maintenance.inventory import Inventory, check_root, require_present
from statekeeper.maintenance.leasing import cycle_leases
from statekeeper.maintenance.orphans import clean_orphans
from statekeeper.maintenance.replica_pool import raise_open_file_limit
from statekeeper.maintenance.reports import Report, SnapshotReport
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_builds import create_snapshots
from statekeeper.store.errors import ConfigurationError
from statekeeper.store.files import CheckpointFileManager
from statekeeper.store.layout import StoreId
from statekeeper.store.rocks import release_free_heap

if TYPE_CHECKING:
    from statekeeper.sql.catalog import Catalog

log = logging.getLogger(__name__)


@dataclass
class CycleResult:
    cycle: int
    seconds: float
    reports: list[Report] = field(default_factory=list)
    listing_seconds: float = 0.0
    """Spent listing the roots (once each per cycle; the operations' own seconds are in their reports)."""

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.reports)

    def summary(self) -> str:
        roots = {r.root for r in self.reports}
        parts = [
            (f"{r.root} " if len(roots) > 1 else "")
            + f"{r.kind}: {r.files} file(s) in {r.seconds:.2f}s"
            + (f", {len(r.errors)} error(s)" if r.errors else "")
            for r in self.reports
        ]
        return f"cycle {self.cycle} ({self.seconds:.2f}s, listing {self.listing_seconds:.2f}s): " + "; ".join(parts)


Roots = CheckpointFileManager | Sequence[CheckpointFileManager]
"""One checkpoint root's file manager, or several (the CLI opens them)."""


CYCLE = "cycle"
"""The kind of the report of a root's cycle that raised (its error), beside the operations' reports."""

BEHIND_WARNING_SECONDS = 60.0
"""While a root's chains are past their bound, how often the loop says so again."""


def maintain(
    roots: Roots,
    settings: MaintenanceSettings,
    *,
    every: float,
    catalog: Catalog | None = None,
    cycles: int | None = None,
    stop: threading.Event | None = None,
    on_cycle: Callable[[CycleResult], None] | None = None,
    stores: Iterable[StoreId] | None = None,
) -> list[CycleResult]:
    """Run cycles (expire, snapshot, clean orphans of each root in turn) starting every `every` seconds.

    Stops after `cycles` cycles, or when `stop` is set. A cycle with errors does not stop the loop (the
    next one retries), nor does a root's cycle that raises (its `CYCLE` report names the error); a root that
    is not a checkpoint root when the loop starts raises `ConfigurationError` at once. `stores`: only these
    stores of every root (their commit records stay: other stores' versions may need them). With
    `settings.snapshot_round_seconds`, a round of a root starts the builds of stores due early for that long and
    leaves the rest to the next cycle, so the cycles, and the expiry each starts with, keep coming when a round
    is long. The results of every cycle are returned (only the last 100 are kept).
    """
    fms = _checked_roots(roots)
    wanted = None if stores is None else frozenset(stores)
    stop = stop or threading.Event()
    raise_open_file_limit()  # a replica of every store stays open across cycles
    results: list[CycleResult] = []
    known: dict[str, list[StoreId]] = {}  # per root, the stores its previous cycle found
    behind: dict[str, float] = {}  # per root past its chains' bound, when the loop last said so
    n = 0
    while not stop.is_set() and (cycles is None or n < cycles):
        n += 1
        t0 = time.monotonic()
        result = CycleResult(n, 0.0)
        for fm in fms:
            if stop.is_set():
                break
            try:
                known[fm.root_uri] = _cycle(fm, settings, catalog, wanted, known.get(fm.root_uri, []), result)
                _say_if_behind(fm.root_uri, result.reports, settings, behind)
            except Exception as e:  # a long-running maintainer outlives it: the next cycle tries again
                error = f"cycle {n} of {fm.root_uri} failed: {type(e).__name__}: {e}"
                log.error("%s", error, exc_info=log.isEnabledFor(logging.DEBUG))
                result.reports.append(Report(CYCLE, fm.root_uri, errors=[error]))
        result.seconds = time.monotonic() - t0
        log.info("%s", result.summary())
        release_free_heap()
        if on_cycle is not None:
            on_cycle(result)
        results = [*results[-99:], result]
        if cycles is not None and n >= cycles:
            break
        stop.wait(max(0.0, every - result.seconds))
    return results


def _say_if_behind(
    root: str, reports: Sequence[Report], settings: MaintenanceSettings, behind: dict[str, float]
) -> None:
    """Warn while a snapshot round of `root` finds a chain past twice the snapshot threshold (the bound the
    `chains_within_twice_threshold` asset check holds): the maintainer is not keeping up with the writers, and
    loads replay that many changelogs. Said once every `BEHIND_WARNING_SECONDS`, and once when it is over."""
    snapshots = next((r for r in reports if isinstance(r, SnapshotReport) and r.root == root), None)
    if snapshots is None:
        return
    longest, bound = snapshots.max_chain_length, chain_bound(settings.snapshot_threshold)
    now = time.monotonic()
    if longest <= bound:
        if behind.pop(root, None) is not None:
            log.warning("%s: every chain is within twice the snapshot threshold (%d) again", root, bound)
    elif now - behind.get(root, -BEHIND_WARNING_SECONDS) >= BEHIND_WARNING_SECONDS:
        behind[root] = now
        log.warning(
            "%s: the maintainer is falling behind: a store's chain reached %d changelogs since its snapshot, past "
            "twice the snapshot threshold (%d); give it build processes (--build-processes), move some of its "
            "roots to another maintainer, or raise the threshold (docs/maintenance.md, Command line)",
            root,
            longest,
            bound,
        )


def _checked_roots(roots: Roots) -> list[CheckpointFileManager]:
    """The roots, each checked to be a checkpoint root (`check_root`), none given twice."""
    fms = [roots] if isinstance(roots, CheckpointFileManager) else list(roots)
    if not fms:
        raise ConfigurationError("maintain needs at least one checkpoint root")
    seen: set[str] = set()
    for fm in fms:
        if fm.root_uri in seen:
            raise ConfigurationError(f"checkpoint root {fm.root_uri} is given twice")
        seen.add(fm.root_uri)
        check_root(fm)
    return fms


def _cycle(
    fm: CheckpointFileManager,
    settings: MaintenanceSettings,
    catalog: Catalog | None,
    wanted: frozenset[StoreId] | None,
    known: list[StoreId],
    result: CycleResult,
) -> list[StoreId]:
    """One cycle of one root, its reports appended to `result`; returns the stores it found.

    One lease per store per cycle, held (and renewed) through the three operations, released here: the
    stores the previous cycle found (`known`) are taken before this cycle's listing, so that listing is one
    taken under their leases, and what the operations delete and write is kept in it, so none lists them
    again (`Inventory.rescan_store`) unless a deletion or snapshot failed. New stores (and all of them in
    the first cycle) are leased by the first operation that needs them, then listed again.
    """
    require_present(fm)  # before the leases, which would create a local root gone since the last cycle
    with cycle_leases(fm, settings, catalog, stores=known) as leases:
        inv = Inventory.scan(fm, parallelism=settings.parallelism, leased=leases.held_stores(), stores=wanted)
        result.listing_seconds += inv.seconds
        found = [s for s in inv.store_ids() if wanted is None or s in wanted]
        leases.take_free(found)  # the new ones
        for op in (expire_versions, create_snapshots, clean_orphans):
            result.reports.append(op(fm, settings, catalog=catalog, inventory=inv, stores=wanted))
    return found


__all__ = ["CYCLE", "CycleResult", "maintain"]
