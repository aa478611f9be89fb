"""Maintenance leases: one maintainer per store at a time (DESIGN invariant 5).

A lease covers one store (scope ``'operator/partition'``) or a whole checkpoint root (scope ``'*'``);
a root lease conflicts with every store lease of that root and the other way round. A lease expires
`ttl` seconds after it was taken or last renewed, after which another maintainer may take it over,
so a crashed maintainer blocks a store for at most `ttl`. A maintainer that works longer renews
(`Lease.renew`, or `Lease.keep_alive()` in a background thread) and calls `Lease.check()` before
each destructive step: it raises `LeaseLostError` once the lease was lost.

Acquisition is one transaction that first locks the root's row (PostgreSQL: ``SELECT ... FOR
UPDATE``; SQLite: the ``BEGIN IMMEDIATE`` write lock), so two acquirers are serialised on every
backend. Times come from the maintainers' clocks: keep `ttl` far above the clock skew between hosts.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from types import TracebackType

from sqlalchemy import Connection, delete, select, update
from sqlalchemy.exc import IntegrityError, OperationalError

from statekeeper.sql.base import CatalogBase, chunks
from statekeeper.sql.errors import CatalogConfigError, LeaseLostError, LeaseUnavailableError
from statekeeper.sql.models import ROOT_SCOPE, CheckpointRoot, MaintenanceLease, utcnow


def default_owner() -> str:
    """host:pid:thread, so an operator can tell who holds a lease."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.current_thread().name}"[:200]


def scope_of(store: tuple[str, int] | str | None) -> str:
    if store is None or store == ROOT_SCOPE:
        return ROOT_SCOPE
    if isinstance(store, str):
        name, sep, number = store.rpartition("/")
        if not sep or not name or not number.isdigit():
            raise CatalogConfigError(f"invalid store {store!r}: expected 'operator/partition' or '*'")
        return f"{name}/{int(number)}"
    operator, partition = store
    if not operator or "/" in operator or not isinstance(partition, int) or partition < 0:
        raise CatalogConfigError(f"invalid store {store!r}: expected (operator, partition)")
    return f"{operator}/{partition}"


def _holder(scope: str, live: dict[str, LeaseInfo]) -> LeaseInfo | None:
    """The live lease `scope` conflicts with (the root lease conflicts with every store lease, and back)."""
    if scope == ROOT_SCOPE:
        return next(iter(live.values()), None)
    return live.get(ROOT_SCOPE) or live.get(scope)


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    root: str
    scope: str
    owner: str
    acquired_at: dt.datetime
    expires_at: dt.datetime

    @property
    def expired(self) -> bool:
        return self.expires_at <= utcnow()


class Lease:
    """A held lease of one scope, or of several store scopes taken together (`LeaseAccess.acquire_leases`:
    one token, renewed and released as one); release it with `release()` or by leaving its `with` block."""

    def __init__(
        self,
        catalog: CatalogBase,
        root: str,
        root_id: int,
        scopes: tuple[str, ...],
        owner: str,
        token: str,
        ttl: float,
        expires_at: dt.datetime,
    ) -> None:
        self.catalog = catalog
        self.root = root
        self.scopes = scopes
        self.owner = owner
        self.token = token
        self.ttl = ttl
        self.expires_at = expires_at
        self._root_id = root_id
        self._released = False
        self._lost: LeaseLostError | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"Lease({self.root!r}, {self.scope!r}, owner={self.owner!r}, expires_at={self.expires_at.isoformat()})"

    @property
    def scope(self) -> str:
        """The scope, or for a lease of several stores a description of them."""
        if len(self.scopes) == 1:
            return self.scopes[0]
        return f"{len(self.scopes)} stores ({self.scopes[0]}, ...)"

    @property
    def held(self) -> bool:
        return not self._released and self._lost is None and utcnow() < self.expires_at

    def _lost_error(self, why: str) -> LeaseLostError:
        what = "the whole root" if self.scopes == (ROOT_SCOPE,) else f"store {self.scope}"
        return LeaseLostError(f"lost the maintenance lease on {what} of {self.root} ({why}); stop and rerun")

    def renew(self, ttl: float | None = None) -> None:
        """Extend the lease by `ttl` (default: the acquisition's) from now; `LeaseLostError` if lost."""
        if self._released:
            raise self._lost_error("it was released")
        if self._lost is not None:
            raise self._lost
        ttl = self.ttl if ttl is None else ttl
        expires = utcnow() + dt.timedelta(seconds=ttl)
        with self.catalog.write() as conn:
            _lock_root(conn, self._root_id)
            n = conn.execute(
                update(MaintenanceLease)
                .where(MaintenanceLease.root_id == self._root_id, MaintenanceLease.token == self.token)
                .values(expires_at=expires)
            ).rowcount
        if n != len(self.scopes):
            self._lost = self._lost_error("it expired and another maintainer took it over")
            raise self._lost
        self.expires_at = expires

    def check(self) -> None:
        """Raise `LeaseLostError` unless the lease is still held (call before destructive steps)."""
        if self._lost is not None:
            raise self._lost
        if self._released:
            raise self._lost_error("it was released")
        if utcnow() >= self.expires_at:
            # Expired but maybe not taken over: renewing both checks and extends.
            self.renew()

    def release(self) -> None:
        """Give the lease up (idempotent); a lease already taken over is left to its new holder."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
            self._thread = None
        if self._released:
            return
        self._released = True
        with self.catalog.write() as conn:
            conn.execute(
                delete(MaintenanceLease).where(
                    MaintenanceLease.root_id == self._root_id, MaintenanceLease.token == self.token
                )
            )

    def keep_alive(self, interval: float | None = None) -> Lease:
        """Renew in a daemon thread every `interval` seconds (default ttl / 3) until released."""
        if self._thread is not None:
            return self
        period = self.ttl / 3 if interval is None else interval

        def run() -> None:
            while not self._stop.wait(period):
                try:
                    self.renew()
                except LeaseLostError:
                    return
                except Exception:  # transient database trouble: try again next period
                    continue

        self._thread = threading.Thread(target=run, name=f"lease-{self.scopes[0]}", daemon=True)
        self._thread.start()
        return self

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _lock_root(conn: Connection, root_id: int) -> None:
    # PostgreSQL: row lock serialising every lease change of the root. SQLite renders no FOR UPDATE;
    # there the transaction already holds the database write lock (BEGIN IMMEDIATE).
    conn.execute(select(CheckpointRoot.id).where(CheckpointRoot.id == root_id).with_for_update()).scalar_one()


def _try_acquire(
    catalog: CatalogBase, uri: str, scopes: list[str], owner: str, token: str, ttl: float
) -> tuple[Lease | None, dict[str, LeaseInfo]]:
    """One attempt, one transaction: take every scope of `scopes` no live lease conflicts with, taking
    over expired ones. Returns a lease of the scopes taken (None: none) and the holder of each of the rest.

    The root's id is read (or the root created) in the acquiring transaction itself: no separate
    lookup, and never a stale id even if another process forgot and re-added the root meanwhile.
    """
    with catalog.write() as conn:
        root_id = catalog.ensure_root_in(conn, uri)
        _lock_root(conn, root_id)
        now = utcnow()
        live: dict[str, LeaseInfo] = {}
        for other_scope, other_owner, other_token, acquired, expires in conn.execute(
            select(
                MaintenanceLease.scope,
                MaintenanceLease.owner,
                MaintenanceLease.token,
                MaintenanceLease.acquired_at,
                MaintenanceLease.expires_at,
            ).where(MaintenanceLease.root_id == root_id, MaintenanceLease.expires_at > now)
        ):
            if other_token != token:
                live[other_scope] = LeaseInfo(uri, other_scope, other_owner, acquired, expires)
        refused = {scope: holder for scope in scopes if (holder := _holder(scope, live)) is not None}
        taken = [scope for scope in scopes if scope not in refused]
        if not taken:
            return None, refused
        stale = delete(MaintenanceLease).where(MaintenanceLease.root_id == root_id, MaintenanceLease.expires_at <= now)
        if ROOT_SCOPE in taken:  # expired holders of what we take: take over
            conn.execute(stale)
        else:
            for part in chunks([*taken, ROOT_SCOPE]):
                conn.execute(stale.where(MaintenanceLease.scope.in_(part)))
        expires = now + dt.timedelta(seconds=ttl)
        conn.execute(
            MaintenanceLease.__table__.insert(),  # type: ignore[attr-defined]
            [
                dict(root_id=root_id, scope=scope, owner=owner, token=token, acquired_at=now, expires_at=expires)
                for scope in taken
            ],
        )
        return Lease(catalog, uri, root_id, tuple(taken), owner, token, ttl, expires), refused


def _check_request(uri: str, ttl: float, owner: str | None) -> str:
    """Refuse a bad root or ttl; the owner to record."""
    if not ttl > 0:
        raise CatalogConfigError(f"lease ttl={ttl!r} must be > 0 seconds")
    if not isinstance(uri, str) or not uri.strip():
        raise CatalogConfigError("checkpoint root URI is empty")
    return (owner or default_owner())[:200]


class LeaseAccess(CatalogBase):
    """`Catalog.acquire_lease`, `Catalog.acquire_leases` and `Catalog.leases`."""

    def acquire_leases(
        self, uri: str, stores: list[tuple[str, int]], *, owner: str | None = None, ttl: float = 300.0
    ) -> tuple[Lease | None, dict[str, LeaseInfo]]:
        """Take, in one transaction and without waiting, the leases of every store of `stores` that no one
        holds: (one `Lease` covering them all, None if none was free; the holder of each store refused).

        For a maintainer about to work on many stores: one acquisition, one renewal per period and one
        release instead of one each per store. A conflicting write (another acquirer, SQLite busy)
        refuses nothing and takes nothing: (None, {}), and the caller takes the leases one by one.
        """
        owner = _check_request(uri, ttl, owner)
        scopes = list(dict.fromkeys(scope_of(s) for s in stores))
        if ROOT_SCOPE in scopes:
            raise CatalogConfigError("acquire_leases takes store leases only: use acquire_lease for the whole root")
        if not scopes:
            return None, {}
        try:
            return _try_acquire(self, uri, scopes, owner, uuid.uuid4().hex, ttl)
        except IntegrityError:
            return None, {}
        except OperationalError as e:
            if "locked" not in str(e).lower():
                raise
            return None, {}

    def acquire_lease(
        self,
        uri: str,
        store: tuple[str, int] | str | None = None,
        *,
        owner: str | None = None,
        ttl: float = 300.0,
        timeout: float = 0.0,
        poll_interval: float = 0.5,
    ) -> Lease:
        """Take the maintenance lease of one store (or, with `store=None` or '*', of the whole root).

        Waits up to `timeout` seconds for a holder to release or expire, then raises
        `LeaseUnavailableError` naming the holder. Use as a context manager to release on exit.
        """
        owner = _check_request(uri, ttl, owner)
        if timeout < 0 or not poll_interval > 0:
            raise CatalogConfigError(f"invalid lease timeout={timeout!r} / poll_interval={poll_interval!r}")
        scope = scope_of(store)
        token = uuid.uuid4().hex
        t0 = time.monotonic()
        while True:
            holder: LeaseInfo | None = None
            try:
                lease, refused = _try_acquire(self, uri, [scope], owner, token, ttl)
            except IntegrityError:
                pass  # lost an insert race: look again
            except OperationalError as e:
                if "locked" not in str(e).lower():  # SQLite busy beyond its timeout: keep waiting
                    raise
            else:
                if lease is not None:
                    return lease
                holder = refused[scope]
            waited = time.monotonic() - t0
            if waited >= timeout:
                if holder is None:
                    raise LeaseUnavailableError(uri, scope, "an unknown maintainer", scope, utcnow(), waited)
                raise LeaseUnavailableError(uri, scope, holder.owner, holder.scope, holder.expires_at, waited)
            time.sleep(min(poll_interval, max(0.0, timeout - waited)))

    def leases(self, uri: str) -> list[LeaseInfo]:
        """Every lease row of root `uri` (expired ones included: see `LeaseInfo.expired`)."""
        rid = self.find_root(uri)
        if rid is None:
            return []
        with self.read() as conn:
            rows = conn.execute(
                select(
                    MaintenanceLease.scope,
                    MaintenanceLease.owner,
                    MaintenanceLease.acquired_at,
                    MaintenanceLease.expires_at,
                )
                .where(MaintenanceLease.root_id == rid)
                .order_by(MaintenanceLease.scope)
            ).all()
        return [LeaseInfo(uri, s, o, a, e) for s, o, a, e in rows]


__all__ = ["Lease", "LeaseAccess", "LeaseInfo", "default_owner", "scope_of"]
