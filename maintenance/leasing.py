"""One maintainer per store (DESIGN invariants 5 and 15): the single place maintenance takes its leases.

The lease lives with the store: `statekeeper.maintenance.root_leases` keeps it in the checkpoint root
(``_leases/``, an exclusive create per epoch), so any two maintainers of one root exclude each other,
whatever catalog each uses or none, on one host or many. It is renewed in the background while the work
runs, and every destructive step calls `LeaseGuard.check()` first (fencing), which raises `LeaseLostError`
once the lease was lost. With a catalog, the catalog's lease row (`statekeeper.sql.leases`) is taken
beside it, so the catalog shows who maintains what (and a row held there still stops the store); the root's
lease is the authority.

The maintenance loop runs snapshot, expiry and orphan cleanup one after the other on the same stores:
inside `cycle_leases` a store's lease is taken the first time an operation needs it and held, renewed
as usual, until the cycle ends, so a store costs one acquisition and one release per cycle instead of
three. Given the stores it will visit, the cycle takes every free one at its start: one listing of
``_leases/`` and one create per store, and one catalog transaction (`Catalog.acquire_leases`); a store held
elsewhere is left to the per-store path, which waits for it up to the lease timeout and then reports it busy.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Protocol

from statekeeper.maintenance.deployment import record_catalog
from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.root_leases import (
    Hold,
    LeaseLostError,
    MaintenanceBusyError,
    RootLeases,
    StoreLease,
    default_owner,
)
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.store.files import CheckpointFileManager
from statekeeper.store.layout import StoreId

if TYPE_CHECKING:
    from statekeeper.maintenance.plan import StorePlan
    from statekeeper.sql.catalog import Catalog
    from statekeeper.sql.leases import Lease


log = logging.getLogger(__name__)


class LeaseGuard(Protocol):
    def check(self) -> None:
        """Raise unless this maintainer still holds the store (call before each destructive step)."""


class _Guard:
    """A store's lease in the root, and its catalog row if there is a catalog: `check` fences on both."""

    def __init__(self, root: StoreLease, row: Lease | None) -> None:
        self.root = root
        self.row = row

    def check(self) -> None:
        self.root.check()
        if self.row is not None:
            from statekeeper.sql.errors import LeaseLostError as RowLost

            try:
                self.row.check()
            except RowLost as e:
                raise LeaseLostError(str(e)) from None


def _poll(settings: MaintenanceSettings) -> float:
    return min(0.5, max(0.05, settings.lease_timeout_seconds / 20))


def _leases(fm: CheckpointFileManager, settings: MaintenanceSettings) -> RootLeases:
    return RootLeases(fm, ttl=settings.lease_ttl_seconds, owner=default_owner())


class CycleLeases:
    """The leases a maintenance cycle holds on one root: taken on first use, released when the cycle ends."""

    def __init__(self, fm: CheckpointFileManager, settings: MaintenanceSettings, catalog: Catalog | None) -> None:
        self.fm = fm
        self.root_uri = fm.root_uri
        self.settings = settings
        self.catalog = catalog
        self.leases = _leases(self.fm, settings)
        if catalog is not None:  # the first maintainer with a catalog records it as the deployment's
            record_catalog(self.fm, catalog.engine.url)
        self.rows: list[Lease] = []
        self.held: dict[StoreId, LeaseGuard] = {}
        self.busy: dict[StoreId, MaintenanceBusyError] = {}
        self.store_locks: dict[StoreId, threading.Lock] = {}
        self.lock = threading.Lock()

    def guard(self, root_uri: str, store: StoreId) -> LeaseGuard:
        with self.lock:
            store_lock = self.store_locks.setdefault(store, threading.Lock())
        with store_lock:  # one acquisition per store even when an operation runs stores on threads
            if store in self.held:
                return self.held[store]
            if store in self.busy:  # refused once this cycle: do not wait out the timeout again
                raise MaintenanceBusyError(str(self.busy[store]))
            try:
                self.leases.take(store, timeout=self.settings.lease_timeout_seconds, poll_interval=_poll(self.settings))
                self.leases.keep_alive()
                row = self._row(store)
            except MaintenanceBusyError as e:
                self.leases.release([store])
                self.busy[store] = e
                raise
            guard = _Guard(self.leases.guard(store), row)
            with self.lock:
                self.held[store] = guard
            return guard

    def _row(self, store: StoreId) -> Lease | None:
        """The catalog's row of the store's lease (for display; a row held elsewhere still refuses)."""
        if self.catalog is None:
            return None
        from statekeeper.sql.errors import LeaseUnavailableError

        try:
            row = self.catalog.acquire_lease(
                self.root_uri,
                (store.operator, store.partition),
                ttl=self.settings.lease_ttl_seconds,
                timeout=self.settings.lease_timeout_seconds,
                poll_interval=_poll(self.settings),
            )
        except LeaseUnavailableError as e:
            raise MaintenanceBusyError(str(e)) from None
        row.keep_alive()
        with self.lock:
            self.rows.append(row)
        return row

    def held_stores(self) -> frozenset[StoreId]:
        """The stores whose lease this cycle holds now."""
        with self.lock:
            return frozenset(self.held)

    def take_free(self, stores: Sequence[StoreId]) -> None:
        """Take the leases of every store of `stores` nobody holds (not this cycle either): one listing of the
        root's ``_leases/`` and a create per store, and with a catalog its rows in one transaction."""
        with self.lock:
            stores = [s for s in stores if s not in self.held]
        if not stores:
            return
        taken = [s for s, got in self.leases.take_free(stores).items() if isinstance(got, Hold)]
        if not taken:
            return
        self.leases.keep_alive()
        rows: dict[StoreId, Lease | None] = dict.fromkeys(taken)
        if self.catalog is not None:
            from statekeeper.sql.leases import scope_of

            row, _ = self.catalog.acquire_leases(
                self.root_uri, [(s.operator, s.partition) for s in taken], ttl=self.settings.lease_ttl_seconds
            )
            scopes = set(row.scopes) if row is not None else set()
            refused = [s for s in taken if scope_of((s.operator, s.partition)) not in scopes]
            self.leases.release(refused)  # left to the per-store path, which waits for the catalog's row
            rows = {s: row for s in taken if s not in refused}
            if row is not None:
                row.keep_alive()
                with self.lock:
                    self.rows.append(row)
        with self.lock:
            self.held.update((s, _Guard(self.leases.guard(s), r)) for s, r in rows.items())

    def release(self) -> None:
        with ExitStack() as stack:  # every lease is released even if one release fails
            stack.callback(self.leases.release_all)
            for row in self.rows:
                stack.callback(row.release)


_cycle: contextvars.ContextVar[CycleLeases | None] = contextvars.ContextVar("statekeeper_cycle_leases", default=None)
"""The leases of the running maintenance loop's cycle (`CycleLeases.root_uri` names its root). A context variable,
so only the loop's own work shares the leases (its per-store pools run in copies of its context,
`statekeeper.maintenance.workers.run_each`); any other caller in the process, or a second loop, takes
its own leases and is excluded by them as before."""


ROOT_FILES = StoreId("_root", 0)
"""The lease of a root's own files (commit records, batch files, orphans outside the stores): taken, in the root
only, by whoever deletes them, so two maintainers never delete root-level files at once. Its epoch files live under
``_leases/_root/00000/`` like a store's; an operator named ``_root`` would share partition 0's lease with them,
which only serialises more."""


@contextmanager
def root_files_lease(
    fm: CheckpointFileManager, settings: MaintenanceSettings, catalog: Catalog | None
) -> Iterator[LeaseGuard | None]:
    """Hold `ROOT_FILES` for the block (inside `cycle_leases` of the same root and catalog: until the cycle ends,
    one create a cycle), waiting up to the lease timeout; None when another maintainer holds it, which deletes
    them: this one deletes none. No catalog row: the root's lease is the authority, and a store's run keeps
    its one catalog transaction."""
    cycle = _cycle.get()
    uri = fm.root_uri
    shared = cycle is not None and cycle.root_uri == uri and cycle.catalog is catalog
    if cycle is not None and shared:
        leases = cycle.leases
    else:
        leases = _leases(cycle.fm if cycle is not None and cycle.root_uri == uri else fm, settings)
    try:
        guard: LeaseGuard | None = None
        try:
            if not leases.holding(ROOT_FILES):
                leases.take(ROOT_FILES, timeout=settings.lease_timeout_seconds, poll_interval=_poll(settings))
                leases.keep_alive()
            guard = leases.guard(ROOT_FILES)
        except MaintenanceBusyError as e:
            log.info("root files of %s left to their lease's holder: %s", uri, e)
        yield guard
    finally:
        if not shared:
            leases.release_all()


@contextmanager
def cycle_leases(
    fm: CheckpointFileManager,
    settings: MaintenanceSettings,
    catalog: Catalog | None,
    stores: Sequence[StoreId] = (),
) -> Iterator[CycleLeases]:
    """Within the block, `store_lease` on `fm`'s root (with this `catalog`) keeps each store's lease until
    the block ends: one acquisition and one release per store for all the operations run inside it.
    The free ones of `stores` are taken at once when the block starts (one listing of the root's leases);
    more with `CycleLeases.take_free`."""
    cycle = CycleLeases(fm, settings, catalog)
    token = _cycle.set(cycle)
    try:
        cycle.take_free(stores)
        yield cycle
    finally:
        _cycle.reset(token)
        cycle.release()


def held_stores(root_uri: str, catalog: Catalog | None) -> frozenset[StoreId]:
    """The stores of `root_uri` whose lease the running `cycle_leases` block (with this `catalog`) holds now:
    an operation's listing of them, taken inside the block, needs no second listing under the lease."""
    cycle = _cycle.get()
    if cycle is None or cycle.root_uri != root_uri or cycle.catalog is not catalog:
        return frozenset()
    return cycle.held_stores()


def scan_under_leases(
    fm: CheckpointFileManager,
    settings: MaintenanceSettings,
    catalog: Catalog | None,
    *,
    progress: bool = False,
    stores: list[StoreId] | None = None,
) -> Inventory:
    """An operation's own listing of the root (or of `stores`), knowing which stores it lists under the
    leases the running `cycle_leases` block holds (see `held_stores`)."""
    leased = held_stores(fm.root_uri, catalog)
    return Inventory.scan(fm, parallelism=settings.parallelism, progress=progress, stores=stores, leased=leased)


@contextmanager
def store_lease(
    fm: CheckpointFileManager, store: StoreId, settings: MaintenanceSettings, catalog: Catalog | None
) -> Iterator[LeaseGuard]:
    """Hold the maintenance lease of `store` for the block; `MaintenanceBusyError` if another has it.

    Inside `cycle_leases` of the same root and catalog, the lease stays held after the block (until the cycle ends).
    """
    cycle = _cycle.get()
    uri = fm.root_uri
    if cycle is not None and cycle.root_uri == uri and cycle.catalog is catalog:
        yield cycle.guard(uri, store)
        return
    one = CycleLeases(cycle.fm if cycle is not None and cycle.root_uri == uri else fm, settings, catalog)
    try:
        yield one.guard(uri, store)
    finally:
        one.release()


__all__ = [
    "ROOT_FILES",
    "CycleLeases",
    "LeaseGuard",
    "cycle_leases",
    "held_stores",
    "planned_store",
    "root_files_lease",
    "scan_under_leases",
    "store_lease",
]


@contextmanager
def planned_store(
    inv: Inventory, store: StoreId, settings: MaintenanceSettings, catalog: Catalog | None
) -> Iterator[tuple[StorePlan, LeaseGuard]]:
    """Under the store's lease, re-list it and plan it; a plan with problems deletes nothing. The caller deletes
    through a `Deleter` that keeps `inv`'s view of the store true (a deletion that fails has the store listed
    again by the next operation)."""
    from statekeeper.maintenance.plan import plan_store

    with store_lease(inv.fm, store, settings, catalog) as lease:
        inv.rescan_store(store)
        plan = plan_store(inv, store, settings)
        if plan.blocked:
            raise RuntimeError("; ".join(plan.problems))
        yield plan, lease
