"""One maintainer per store (DESIGN invariant 5).

With a catalog, the lease is a row in the catalog (`statekeeper.sql.leases`): it works across hosts, expires
`lease_ttl_seconds` after a crash, and is renewed in the background while the work runs; every
destructive step calls `check()` first, which raises once the lease was lost.

Without a catalog, a lock file (``flock``) per store under ``<work_dir or $TMPDIR>/statekeeper-locks``
keeps maintainers **on the same host** apart; maintainers on different hosts are not excluded, so
production deployments pass a catalog.

The maintenance loop runs snapshot, expiry and orphan cleanup one after the other on the same stores:
inside `cycle_leases` a store's lease is taken the first time an operation needs it and held, renewed
as usual, until the cycle ends, so a store costs one acquisition and one release per cycle instead of
three (the lease's TTL, fencing and refusal when held elsewhere are unchanged). Given the stores it will
visit, the cycle takes every free one at its start in a single catalog transaction
(`Catalog.acquire_leases`): one lease row per store as before, but one acquisition, one renewal thread
and one release for all of them; a store held elsewhere is left to the per-store path, which waits
for it up to the lease timeout and then reports it busy.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import fcntl
import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import TYPE_CHECKING, Protocol

from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.store.errors import StatekeeperError
from statekeeper.store.layout import StoreId

if TYPE_CHECKING:
    from statekeeper.maintenance.plan import StorePlan
    from statekeeper.sql.catalog import Catalog
    from statekeeper.store.files import CheckpointFileManager

LOCK_DIR = "statekeeper-locks"


class MaintenanceBusyError(StatekeeperError):
    """Another maintainer works on the store and did not finish within the lease timeout."""


class LeaseGuard(Protocol):
    def check(self) -> None:
        """Raise unless this maintainer still holds the store (call before each destructive step)."""


class _FileLockGuard:
    def check(self) -> None:
        return None  # a held flock cannot be lost


def lock_path(root_uri: str, store: StoreId, work_dir: str | None) -> str:
    base = os.path.join(work_dir or tempfile.gettempdir(), LOCK_DIR)
    digest = hashlib.sha256(root_uri.encode()).hexdigest()[:16]
    return os.path.join(base, f"{digest}.{store.operator}.{store.partition:05d}.lock")


class CycleLeases:
    """The leases a maintenance cycle holds on one root: taken on first use, released when the cycle ends."""

    def __init__(self, root_uri: str, settings: MaintenanceSettings, catalog: Catalog | None) -> None:
        self.root_uri = root_uri
        self.settings = settings
        self.catalog = catalog
        self.entered: list[AbstractContextManager[LeaseGuard]] = []
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
            lease = _acquire(root_uri, store, self.settings, self.catalog)
            try:
                guard = lease.__enter__()
            except MaintenanceBusyError as e:
                self.busy[store] = e
                raise
            with self.lock:
                self.entered.append(lease)
                self.held[store] = guard
            return guard

    def held_stores(self) -> frozenset[StoreId]:
        """The stores whose lease this cycle holds now."""
        with self.lock:
            return frozenset(self.held)

    def take_free(self, stores: Sequence[StoreId]) -> None:
        """Take the leases of every store of `stores` nobody holds (not this cycle either): the catalog's in one
        transaction, or without a catalog this host's lock files."""
        with self.lock:
            stores = [s for s in stores if s not in self.held]
        if self.catalog is None:  # this host's lock files, each tried once
            for store in stores:
                lock = _file_lock(self.root_uri, store, self.settings, timeout=0.0)
                with contextlib.suppress(MaintenanceBusyError):  # left to the per-store path, which waits
                    guard = lock.__enter__()
                    with self.lock:
                        self.entered.append(lock)
                        self.held[store] = guard
            return
        if not stores:
            return
        from statekeeper.sql.leases import scope_of

        lease, _ = self.catalog.acquire_leases(
            self.root_uri, [(s.operator, s.partition) for s in stores], ttl=self.settings.lease_ttl_seconds
        )
        if lease is None:
            return
        lease.keep_alive()
        taken = set(lease.scopes)
        with self.lock:
            self.entered.append(lease)
            self.held.update((s, lease) for s in stores if scope_of((s.operator, s.partition)) in taken)

    def release(self) -> None:
        with ExitStack() as stack:  # every lease is released even if one release fails
            for lease in self.entered:
                stack.push(lease)


_cycle: contextvars.ContextVar[CycleLeases | None] = contextvars.ContextVar("statekeeper_cycle_leases", default=None)
"""The leases of the running maintenance loop's cycle (`CycleLeases.root_uri` names its root). A context variable,
so only the loop's own work shares the leases (its per-store pools run in copies of its context,
`statekeeper.maintenance.workers.run_each`); any other caller in the process, or a second loop, takes
its own leases and is excluded by them as before."""


@contextmanager
def cycle_leases(
    root_uri: str, settings: MaintenanceSettings, catalog: Catalog | None, stores: Sequence[StoreId] = ()
) -> Iterator[CycleLeases]:
    """Within the block, `store_lease` on `root_uri` (with this `catalog`) keeps each store's lease until
    the block ends: one acquisition and one release per store for all the operations run inside it.
    The free ones of `stores` are taken at once when the block starts (one catalog transaction); more
    with `CycleLeases.take_free`."""
    cycle = CycleLeases(root_uri, settings, catalog)
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
    root_uri: str, store: StoreId, settings: MaintenanceSettings, catalog: Catalog | None
) -> Iterator[LeaseGuard]:
    """Hold the maintenance lease of `store` for the block; `MaintenanceBusyError` if another has it.

    Inside `cycle_leases` of the same root and catalog, the lease stays held after the block (until the cycle ends).
    """
    cycle = _cycle.get()
    if cycle is not None and cycle.root_uri == root_uri and cycle.catalog is catalog:
        yield cycle.guard(root_uri, store)
        return
    with _acquire(root_uri, store, settings, catalog) as guard:
        yield guard


@contextmanager
def _acquire(
    root_uri: str, store: StoreId, settings: MaintenanceSettings, catalog: Catalog | None
) -> Iterator[LeaseGuard]:
    if catalog is not None:
        from statekeeper.sql.errors import LeaseUnavailableError

        try:
            lease = catalog.acquire_lease(
                root_uri,
                (store.operator, store.partition),
                ttl=settings.lease_ttl_seconds,
                timeout=settings.lease_timeout_seconds,
                poll_interval=min(0.5, max(0.05, settings.lease_timeout_seconds / 20)),
            )
        except LeaseUnavailableError as e:
            raise MaintenanceBusyError(str(e)) from None
        try:
            lease.keep_alive()
            yield lease
        finally:
            lease.release()
        return
    with _file_lock(root_uri, store, settings, timeout=settings.lease_timeout_seconds) as guard:
        yield guard


@contextmanager
def _file_lock(root_uri: str, store: StoreId, settings: MaintenanceSettings, *, timeout: float) -> Iterator[LeaseGuard]:
    """The store's lock file on this host, waited for up to `timeout` seconds."""
    path = lock_path(root_uri, store, settings.work_dir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
                if time.monotonic() >= deadline:
                    raise MaintenanceBusyError(
                        f"cannot maintain store {store} of {root_uri}: another maintainer on this host holds "
                        f"its lock file {path} (waited {timeout:.1f}s)"
                    ) from None
                time.sleep(0.05)
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        yield _FileLockGuard()
    finally:
        os.close(fd)  # closing releases the flock


__all__ = [
    "CycleLeases",
    "LeaseGuard",
    "MaintenanceBusyError",
    "cycle_leases",
    "held_stores",
    "lock_path",
    "planned_store",
    "scan_under_leases",
    "store_lease",
]


@contextmanager
def planned_store(
    root_uri: str, inv: Inventory, store: StoreId, settings: MaintenanceSettings, catalog: Catalog | None
) -> Iterator[tuple[StorePlan, LeaseGuard]]:
    """Under the store's lease, re-list it and plan it; a plan with problems deletes nothing. The caller deletes
    through a `Deleter` that keeps `inv`'s view of the store true (a deletion that fails has the store listed
    again by the next operation)."""
    from statekeeper.maintenance.plan import plan_store

    with store_lease(root_uri, store, settings, catalog) as lease:
        inv.rescan_store(store)
        plan = plan_store(inv, store, settings)
        if plan.blocked:
            raise RuntimeError("; ".join(plan.problems))
        yield plan, lease
