"""Maintenance leases kept in the checkpoint root itself (DESIGN invariants 5 and 15).

Two maintainers of one root exclude each other whatever catalog each uses, or none: the lease of a store is a
chain of epoch files ``_leases/<operator>/<partition>/<epoch>.lease`` (docs/formats.md), each published by
an exclusive create (local: link of a complete temp file; S3: ``If-None-Match: *``), so exactly one
maintainer wins each epoch.

- A **hold** is a JSON record (owner, token, epoch, expiry); a **release** is an empty file: the holder of
  epoch e releases by creating e + 1 empty. The newest epoch in a listing tells whether the store is free
  (none, or empty), held (a hold whose expiry has not passed) or abandoned (a hold past its expiry plus
  `MAX_CLOCK_SKEW_SECONDS`): the acquirer creates the next epoch in the first and last case.
- **Renewal** creates the next epoch, a hold by the same token. A holder whose epoch's successor exists has
  lost the store: the successor is a taker's, or its own release.
- **Fencing**: `RootLeases.check` runs before every deletion batch and before a snapshot's files are
  written; it raises `LeaseLostError` unless the holder's expiry is more than `safety_margin` away (else it
  renews first) and the successor of its epoch does not exist. A holder paused past its expiry thus finds
  its successor (a taker's) and deletes nothing.
- **No epoch is taken twice.** A maintainer acts on a listing that may be stale by the time it creates the next
  epoch; were that epoch's file already gone (deleted by a later release), its create would succeed and two would
  hold the store. So an epoch file is deleted only `SUPERSEDED_KEEP_SECONDS` after its successor was created,
  and a take whose listing is older than that (less the clock skew) lists again after its create and gives the
  epoch up if a newer one exists.
- Times are wall-clock seconds (`clock`, replaceable in tests); hosts' clocks must agree within
  `MAX_CLOCK_SKEW_SECONDS`.

Cost: one create per store to take it and one to give it back; a cycle lists ``_leases/`` once for all its
stores (`RootLeases.take_free`); a hold is read only when the newest epoch of a store is someone else's; the
files superseded long enough are deleted by a release, in one batch for all the stores released together.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from statekeeper.store.errors import CheckpointFileExistsError, CorruptFileError, StatekeeperError
from statekeeper.store.files import CheckpointFileManager, FileInfo
from statekeeper.store.formats.framing import MAX_TIMESTAMP, parse_json
from statekeeper.store.layout import LEASES_DIR, MAX_VERSION, StoreId, lease_dir, lease_path, parse_lease_name

log = logging.getLogger(__name__)

MAX_CLOCK_SKEW_SECONDS = 5.0
"""How far the wall clocks of two maintainers' hosts may disagree: a hold is taken over only this long after
its expiry by the taker's clock."""
SUPERSEDED_KEEP_SECONDS = 3 * MAX_CLOCK_SKEW_SECONDS
"""An epoch file stays this long after its successor's create, so that a create acting on a listing that still
showed it as the newest finds that successor (and fails) instead of a free name. A take whose listing started
more than this less twice the skew before its create (5 s) lists once more (`RootLeases.try_take`). Each store
keeps the epochs of about this long: two files a take."""
MAX_RECORD_BYTES = 4096
"""A hold record is a few hundred bytes; a longer file is refused (checkpoint content is untrusted)."""
MAX_EPOCH = MAX_VERSION - (1 << 32)
"""The newest epoch a take goes on from: a take, renewal or release adds one, so maintainers reach 2**32 in a
century; an epoch file named above it would leave the epochs after it no valid name (a store never leased again,
failing with an error that named no file)."""


class MaintenanceBusyError(StatekeeperError):
    """Another maintainer works on the store and did not finish within the lease timeout."""


class LeaseLostError(MaintenanceBusyError):
    """This maintainer's lease of a store expired and another took it, or it was released: stop, delete nothing."""


def default_owner() -> str:
    """host:pid, so an operator can tell who holds a lease."""
    return f"{socket.gethostname()}:{os.getpid()}"[:200]


def abandoned(owner: str) -> bool:
    """Whether `owner` (``host:pid``, `default_owner`) is a process of this host that is gone (killed -9,
    crashed): its hold ends now instead of at its expiry, since nothing can renew it or act under it. A
    process that is only paused is alive and keeps its hold; a holder on another host waits out its expiry."""
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive under another user (EPERM), or unknowable: not ours to end
        return False
    return False


@dataclass(frozen=True, slots=True)
class HoldRecord:
    """What a hold epoch's file says."""

    owner: str
    token: str
    epoch: int
    expires_at: float

    def to_bytes(self) -> bytes:
        return json.dumps(
            {"format": "statekeeper-lease", "version": 1, "owner": self.owner, "token": self.token,
             "epoch": self.epoch, "expires_at": self.expires_at},
            separators=(",", ":"),
        ).encode()  # fmt: skip

    @classmethod
    def parse(cls, data: bytes, uri: str, epoch: int) -> HoldRecord:
        """The record of epoch `epoch`; `CorruptFileError` naming `uri` for anything else."""
        try:
            if len(data) > MAX_RECORD_BYTES:
                raise ValueError(f"longer than {MAX_RECORD_BYTES} bytes")
            doc = parse_json(data, "", "lease record")
            if not isinstance(doc, dict) or doc.get("format") != "statekeeper-lease" or doc.get("version") != 1:
                raise ValueError("not a statekeeper lease record of version 1")
            owner, token, got, expires = doc["owner"], doc["token"], doc["epoch"], doc["expires_at"]
            if not (isinstance(owner, str) and isinstance(token, str) and len(owner) <= 200 and len(token) <= 64):
                raise ValueError("bad owner or token")
            if got != epoch or type(expires) not in (int, float) or not 0 <= expires <= MAX_TIMESTAMP:  # NaN too
                raise ValueError("bad epoch or expiry")  # an int past a float's range raised OverflowError
            return cls(owner, token, epoch, float(expires))
        except (ValueError, KeyError, TypeError, CorruptFileError) as e:
            raise CorruptFileError(
                f"unreadable maintenance lease ({str(e)[:300]}); delete it if no maintainer runs", uri
            ) from None


@dataclass(slots=True)
class Hold:
    """One store's lease as this maintainer holds it."""

    store: StoreId
    epoch: int
    expires_at: float
    stale: list[tuple[str, float]] = field(default_factory=list)
    """Older epoch files of the store, each with when its successor was created: deleted at the release once that
    is `SUPERSEDED_KEEP_SECONDS` ago (else by a later holder's release)."""
    lost: LeaseLostError | None = None
    released: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True, slots=True)
class Busy:
    """Why a store could not be taken: its newest epoch is someone's live hold (or its create lost a race)."""

    store: StoreId
    holder: str
    expires_at: float | None

    def error(self, root: str, waited: float) -> MaintenanceBusyError:
        until = f" until {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(self.expires_at))}" if self.expires_at else ""
        return MaintenanceBusyError(
            f"cannot maintain store {self.store} of {root}: {self.holder!r} holds its lease{until} "
            f"(in {root}/{lease_dir(self.store)}; waited {waited:.1f}s)"
        )


class RootLeases:
    """This maintainer's leases on the stores of one root: taken, renewed (one thread for all), checked and
    released (one deletion batch for all) together."""

    def __init__(
        self,
        fm: CheckpointFileManager,
        *,
        ttl: float,
        owner: str | None = None,
        clock: Callable[[], float] = time.time,
        max_skew: float = MAX_CLOCK_SKEW_SECONDS,
        safety_margin: float | None = None,
    ) -> None:
        if not ttl > 0:
            raise ValueError(f"lease ttl {ttl!r} must be > 0 seconds")
        self.fm = fm
        self.ttl = ttl
        self.owner = (owner or default_owner())[:200]
        self.token = uuid.uuid4().hex
        self.clock = clock
        self.max_skew = max_skew
        self.safety_margin = min(max_skew, ttl / 4) if safety_margin is None else safety_margin
        """A holder stops (or renews first) this long before its expiry: a deletion in flight then lands before it."""
        self.holds: dict[StoreId, Hold] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- taking ------------------------------------------------------------------------------------
    def listing(self, stores: Iterable[StoreId] | None = None) -> dict[StoreId, list[FileInfo]]:
        """The epoch files of every store (one listing of ``_leases/``), or of each of `stores` (one each)."""
        found: dict[StoreId, list[FileInfo]] = {}
        infos: Iterable[FileInfo]
        if stores is None:
            infos = self.fm.list(f"{LEASES_DIR}/")
        else:
            infos = (i for s in stores for i in self.fm.list(lease_dir(s)))
        for info in infos:
            parts = info.path.split("/")
            if len(parts) != 4 or parse_lease_name(parts[3]) is None or not parts[2].isdigit() or len(parts[2]) != 5:
                continue  # not an epoch file (file_kinds calls it foreign): never ours to read
            try:
                store = StoreId(parts[1], int(parts[2]))
            except StatekeeperError:
                continue
            if info.path.startswith(lease_dir(store)):
                found.setdefault(store, []).append(info)
        return found

    def try_take(self, store: StoreId, files: Sequence[FileInfo], listed_at: float | None = None) -> Hold | Busy:
        """Take `store` given its epoch files (from `listing`, started at `listed_at` on `time.monotonic`'s clock;
        None: unknown): the hold, or who has it."""
        with self._lock:
            held = self.holds.get(store)
        if held is not None and not held.released and held.lost is None:
            return held
        epochs = sorted((e, f) for f in files if (e := parse_lease_name(f.path)) is not None)
        newest = epochs[-1][0] if epochs else 0
        if epochs and epochs[-1][1].size > 0:  # a hold: live unless past its expiry (and the skew)
            info = epochs[-1][1]
            try:
                record = HoldRecord.parse(self.fm.read_bytes(info.path), self._uri(info.path), newest)
            except FileNotFoundError:  # cleaned up after a release meanwhile: look again next time
                return Busy(store, "a maintainer releasing it", None)
            live = self.clock() <= record.expires_at + self.max_skew and not abandoned(record.owner)
            if record.token != self.token and live:
                return Busy(store, record.owner, record.expires_at)
        if newest > MAX_EPOCH:
            raise CorruptFileError(
                f"lease epoch {newest} is above the epochs maintainers reach", self._uri(epochs[-1][1].path)
            )
        epoch = newest + 1
        expires = self.clock() + self.ttl
        try:
            self._create(lease_path(store, epoch), HoldRecord(self.owner, self.token, epoch, expires).to_bytes())
        except CheckpointFileExistsError:
            return Busy(store, "another maintainer (it took the same epoch first)", None)
        old_listing = listed_at is None or time.monotonic() - listed_at > SUPERSEDED_KEEP_SECONDS - 2 * self.max_skew
        if old_listing and self._newer_than(store, epoch):  # its successors may have been deleted since
            return Busy(store, "a maintainer with a newer epoch (this maintainer's listing was old)", None)
        files_ = [f for _, f in epochs]
        superseded = [f.mtime for f in files_[1:]] + [expires - self.ttl]  # by the next listed epoch, the last by ours
        hold = Hold(store, epoch, expires, stale=[(f.path, at) for f, at in zip(files_, superseded, strict=False)])
        with self._lock:
            self.holds[store] = hold
        return hold

    def take(self, store: StoreId, *, timeout: float, poll_interval: float = 0.2) -> Hold:
        """Take `store`, waiting up to `timeout` seconds for its holder; `MaintenanceBusyError` naming it."""
        t0 = time.monotonic()
        while True:
            listed_at = time.monotonic()
            got = self.try_take(store, self.listing([store]).get(store, []), listed_at)
            if isinstance(got, Hold):
                return got
            waited = time.monotonic() - t0
            if waited >= timeout:
                raise got.error(self.fm.root_uri, waited)
            time.sleep(min(poll_interval, max(0.0, timeout - waited)))

    def take_free(self, stores: Sequence[StoreId]) -> dict[StoreId, Hold | Busy]:
        """Try every store of `stores` once, after one listing of ``_leases/``."""
        if not stores:
            return {}
        listed_at = time.monotonic()
        listed = self.listing()
        return {s: self.try_take(s, listed.get(s, []), listed_at) for s in stores}

    # -- holding -----------------------------------------------------------------------------------
    def holding(self, store: StoreId) -> bool:
        """Whether this maintainer holds `store` now (taken, not released, not found lost): no listing."""
        with self._lock:
            hold = self.holds.get(store)
        return hold is not None and not hold.released and hold.lost is None

    def check(self, store: StoreId) -> None:
        """Fencing, before each destructive step: raise `LeaseLostError` unless `store` is still held."""
        hold = self._hold(store)
        with hold.lock:
            self._raise_if_gone(hold)
            if self.clock() + self.safety_margin >= hold.expires_at:
                self._renew(hold)  # raises if a taker has the next epoch
                return
            if self.fm.exists(lease_path(store, hold.epoch + 1)):
                hold.lost = self._lost(store, "another maintainer took it over after it expired")
                raise hold.lost

    def renew_all(self) -> None:
        """Extend every live hold by the ttl from now (the next epoch, by the same token)."""
        with self._lock:
            holds = [h for h in self.holds.values() if not h.released and h.lost is None]
        for hold in holds:
            with hold.lock:
                if not hold.released and hold.lost is None:
                    try:
                        self._renew(hold)
                    except LeaseLostError:
                        log.warning("lost the maintenance lease of store %s of %s", hold.store, self.fm.root_uri)

    def keep_alive(self) -> None:
        """Renew every hold in one daemon thread, every third of the ttl, until `release_all`."""
        with self._lock:
            if self._thread is not None:
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._run_renewals, name="root-leases", daemon=True)
            self._thread.start()

    def _run_renewals(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.renew_all()
            except Exception:  # transient storage trouble: the next period tries again, `check` fences
                log.debug("renewing the leases of %s failed", self.fm.root_uri, exc_info=True)

    def _renew(self, hold: Hold) -> None:
        self._raise_if_gone(hold)
        epoch, expires = hold.epoch + 1, self.clock() + self.ttl
        try:
            self._create(lease_path(hold.store, epoch), HoldRecord(self.owner, self.token, epoch, expires).to_bytes())
        except CheckpointFileExistsError:
            hold.lost = self._lost(hold.store, "it expired and another maintainer took it over")
            raise hold.lost from None
        hold.stale.append((lease_path(hold.store, hold.epoch), expires - self.ttl))
        hold.epoch, hold.expires_at = epoch, expires
        if self.fm.exists(lease_path(hold.store, epoch + 1)):  # our old epoch was cleaned up by a later holder
            hold.lost = self._lost(hold.store, "a later maintainer holds a newer epoch")
            raise hold.lost

    # -- giving back -------------------------------------------------------------------------------
    def release(self, stores: Iterable[StoreId] | None = None) -> None:
        """Release `stores` (default: every hold): an empty next epoch each, then one deletion of the older
        epoch files of them all that were superseded `SUPERSEDED_KEEP_SECONDS` ago. A hold already lost is left to
        its taker."""
        with self._lock:
            chosen = list(self.holds) if stores is None else [s for s in stores if s in self.holds]
            holds = [self.holds.pop(s) for s in chosen]
            if not self.holds:
                self._stop.set()
        old: list[str] = []
        for hold in holds:
            with hold.lock:
                if hold.released:
                    continue
                hold.released = True
                if hold.lost is not None:
                    continue
                try:
                    self._create(lease_path(hold.store, hold.epoch + 1), b"")
                except CheckpointFileExistsError:
                    continue  # taken over meanwhile: its files are the taker's to clean
                except Exception:
                    log.warning("cannot release the lease of store %s of %s", hold.store, self.fm.root_uri)
                    continue
                cutoff = self.clock() - SUPERSEDED_KEEP_SECONDS
                old.extend(path for path, superseded_at in hold.stale if superseded_at <= cutoff)
        if old:
            result = self.fm.delete_many(old)
            for path, why in result.errors.items():
                log.info("old lease epoch %s stays until the next release: %s", path, why)

    def release_all(self) -> None:
        """Release every hold and stop the renewals."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self.release()

    def guard(self, store: StoreId) -> StoreLease:
        return StoreLease(self, store)

    # -- helpers -----------------------------------------------------------------------------------
    def _hold(self, store: StoreId) -> Hold:
        with self._lock:
            hold = self.holds.get(store)
        if hold is None:
            raise self._lost(store, "it was released")
        return hold

    def _raise_if_gone(self, hold: Hold) -> None:
        if hold.lost is not None:
            raise hold.lost
        if hold.released:
            raise self._lost(hold.store, "it was released")

    def _lost(self, store: StoreId, why: str) -> LeaseLostError:
        return LeaseLostError(
            f"lost the maintenance lease on store {store} of {self.fm.root_uri} ({why}); stop and rerun"
        )

    def _newer_than(self, store: StoreId, epoch: int) -> bool:
        return any((n or 0) > epoch for f in self.fm.list(lease_dir(store)) if (n := parse_lease_name(f.path)))

    def _uri(self, path: str) -> str:
        return f"{self.fm.root_uri.rstrip('/')}/{path}"

    def _create(self, path: str, data: bytes) -> None:
        with self.fm.create(path, exclusive=True) as out:
            out.write(data)


@dataclass(frozen=True, slots=True)
class StoreLease:
    """One store's lease in the root (`LeaseGuard`): `check()` fences a destructive step."""

    leases: RootLeases
    store: StoreId

    def check(self) -> None:
        self.leases.check(self.store)

    @property
    def epoch(self) -> int:
        return self.leases._hold(self.store).epoch


__all__ = [
    "MAX_CLOCK_SKEW_SECONDS",
    "SUPERSEDED_KEEP_SECONDS",
    "Busy",
    "Hold",
    "HoldRecord",
    "LeaseLostError",
    "MaintenanceBusyError",
    "RootLeases",
    "StoreLease",
    "default_owner",
]
