"""A local replica of one store's committed state, for snapshot creation and verification.

`StateStore.load` rebuilds from the newest snapshot whenever the requested version is not exactly the
one it holds; for maintenance that would mean downloading the whole snapshot it wrote last time. A
`Replica` instead keeps its RocksDB between runs and *advances* by replaying only the committed
changelogs after the version it holds, checking that each one's lineage starts at the version
before it. It never writes changelogs, so it can hold a version without a pending attempt.

Across processes the copy is reused through a marker file (``warm.json``: root, store, version, id,
SST hashes, the host's boot id) written only after the DB was flushed; it is removed before any change, so a
crash mid replay leaves no marker and the next run rebuilds. The marker and its removal are not fsynced: a
killed process leaves them in the page cache, and after a host restart (power loss) the boot id differs and
the copy is rebuilt, so a stale marker that reappears beside a newer DB is never trusted. A ``flock`` on the
directory keeps two processes on one host from sharing it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import logging
import os
import shutil
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO, cast

import rocksdict as rd

from statekeeper.maintenance.parsed_cache import PROVEN_SNAPSHOTS, UNOPENABLE_SNAPSHOTS, UNOPENABLE_WHY
from statekeeper.store.errors import CorruptFileError, LineageError, StoreStateError, UnsupportedFormatError
from statekeeper.store.faults import reached as fault_point
from statekeeper.store.files import CheckpointFileManager
from statekeeper.store.files.read_ahead import ReadAhead
from statekeeper.store.formats.changelog import ChangelogReader
from statekeeper.store.formats.snapshot import SnapshotManifest
from statekeeper.store.layout import StoreId
from statekeeper.store.load_plan import check_full_state, check_header, check_parent
from statekeeper.store.loading import ChangelogReplay
from statekeeper.store.rocks import (
    DEFAULT_CF,
    check_family_count,
    db_options,
    open_db,
    track_memtable,
    untrack_memtables,
)
from statekeeper.store.snapshot import SnapshotResult, restore_snapshot, write_snapshot

log = logging.getLogger(__name__)

MARKER = "warm.json"
LOCK = "replica.lock"


class ReplicaBusyError(StoreStateError):
    """Another process on this host uses the replica directory."""


@dataclass(frozen=True)
class BuildStats:
    warm: bool
    """True when only changelogs after the held version were replayed."""
    base_version: int | None
    """Snapshot restored first (cold builds with a snapshot)."""
    changelogs: int
    records: int
    seconds: float


class Replica:
    """Read-only RocksDB copy of `store` in `directory` (created if missing)."""

    def __init__(self, fm: CheckpointFileManager, store: StoreId, directory: str) -> None:
        self._full_state: frozenset[int] = frozenset()
        self.fm = fm
        self.store = store
        self.dir = os.path.abspath(directory)
        self.db_dir = os.path.join(self.dir, "db")
        os.makedirs(self.dir, exist_ok=True)
        self._lock_fd: int | None = os.open(os.path.join(self.dir, LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(self._lock_fd)
            self._lock_fd = None
            if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise ReplicaBusyError(f"replica directory {self.dir} is in use by another process") from None
            raise
        self._db: rd.Rdict | None = None
        self._cfs: dict[str, rd.Rdict] = {}
        self._handles: dict[str, Any] = {}
        self.state: tuple[int, str] | None = None
        self.hash_cache: dict[tuple[str, int], str] = {}
        self._load_marker()

    # -- lifecycle --------------------------------------------------------------------------------
    @property
    def db(self) -> rd.Rdict:
        if self._db is None:
            raise StoreStateError(f"replica of store {self.store} holds no version")
        return self._db

    def close(self) -> None:
        """Close the DB (the directory and its marker stay for the next run)."""
        self._close_db()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def reset(self) -> None:
        """Forget the held version (the next `ensure` builds cold): after damage it may share."""
        self._discard()

    def destroy(self) -> None:
        self.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _close_db(self) -> None:
        untrack_memtables(self)
        self._cfs.clear()
        self._handles.clear()
        if self._db is not None:
            self._db.close()
            self._db = None

    def _open_db(self) -> None:
        self._db = open_db(self.db_dir, bulk_replay=True)
        for name in rd.Rdict.list_cf(self.db_dir, db_options()):
            self._bind(name)

    def _bind(self, name: str) -> None:
        assert self._db is not None
        cf = self._db if name == DEFAULT_CF else self._db.get_column_family(name)
        self._cfs[name] = cf
        self._handles[name] = self._db.get_column_family_handle(name)
        track_memtable(self, name, cf)

    def _discard(self) -> None:
        self._drop_marker()
        self._close_db()
        shutil.rmtree(self.db_dir, ignore_errors=True)
        self.state = None
        self.hash_cache = {}  # a new DB reuses SST numbers with other content

    # -- the marker -------------------------------------------------------------------------------
    def _marker_path(self) -> str:
        return os.path.join(self.dir, MARKER)

    def _load_marker(self) -> None:
        try:
            with open(self._marker_path()) as f:
                data = json.load(f)
            if (data["root"], data["operator"], data["partition"]) != (
                self.fm.root_uri,
                self.store.operator,
                self.store.partition,
            ):
                raise ValueError("marker of another store")
            if data.get("boot_id") != host_boot_id():
                raise ValueError("the marker was written before the host restarted")
            state = (int(data["version"]), str(data["checkpoint_id"]))
            cache = {(str(n), int(s)): str(h) for n, s, h in data.get("sst_hashes", [])}
            if not os.path.exists(os.path.join(self.db_dir, "CURRENT")):
                raise ValueError("the marker names a version but the DB is gone")
            self._open_db()
        except FileNotFoundError:
            if os.path.exists(self.db_dir):
                shutil.rmtree(self.db_dir, ignore_errors=True)  # a crash mid replay: start over
            return
        except Exception as e:  # unreadable marker or DB: rebuild from the checkpoint
            log.warning("discarding replica of store %s in %s: %s", self.store, self.dir, e)
            self._discard()
            return
        self.state = state
        self.hash_cache = cache
        log.debug("replica of store %s at version %d from %s", self.store, state[0], self.dir)

    def _drop_marker(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._marker_path())

    def _save_marker(self) -> None:
        assert self.state is not None
        fault_point("rocks.flush", str(self.store))
        for cf in self._cfs.values():
            cf.flush(True)  # no WAL: only flushed data survives a crash
        live = set(os.listdir(self.db_dir))
        data = {
            "root": self.fm.root_uri,
            "operator": self.store.operator,
            "partition": self.store.partition,
            "version": self.state[0],
            "checkpoint_id": self.state[1],
            "sst_hashes": [[n, s, h] for (n, s), h in sorted(self.hash_cache.items()) if n in live],
            "saved_at": time.time(),
            "boot_id": host_boot_id(),
        }
        tmp = self._marker_path() + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)  # not fsynced: trusted only within this boot (module docstring)
        os.replace(tmp, self._marker_path())

    # -- building ---------------------------------------------------------------------------------
    def ensure(
        self,
        version: int,
        checkpoint_id: str,
        committed: Mapping[int, str],
        snapshots: Mapping[int, SnapshotManifest],
        full_state: Collection[int] = (),
    ) -> BuildStats:
        """Hold committed `(version, checkpoint_id)`.

        `committed` maps versions to committed ids (at least those after the base); `snapshots` the
        intact committed snapshots to start a cold build from; `full_state` the versions whose
        changelogs hold their whole state (a rescale or rollback wrote them: a chain starts there).
        Warm when the held version is an ancestor of the target: then only the changelogs after it
        are replayed.
        """
        start = max((f for f in full_state if f <= version), default=0)
        self._full_state = frozenset(full_state)
        t0 = time.perf_counter()
        target = (version, checkpoint_id)
        if self.state == target and self._db is not None:
            return BuildStats(True, None, 0, 0, time.perf_counter() - t0)
        held = self.state
        if (
            held is not None
            and self._db is not None
            and start <= held[0] < version
            and committed.get(held[0]) == held[1]
        ):
            try:
                n, records = self._replay_range(held[0], version, committed)
            except (FileNotFoundError, CorruptFileError, LineageError) as e:
                log.info("replica of store %s cannot advance (%s): rebuilding", self.store, e)
            else:
                self.state = target
                self._save_marker()
                return BuildStats(True, None, n, records, time.perf_counter() - t0)
        base = self._restore_newest_sound(version, snapshots, start)
        try:
            n, records = self._replay_range(max(base, start - 1), version, committed)
        except BaseException:
            self._discard()
            raise
        self.state = target
        self._save_marker()
        return BuildStats(False, base or None, n, records, time.perf_counter() - t0)

    def _restore_newest_sound(self, version: int, snapshots: Mapping[int, SnapshotManifest], start: int) -> int:
        """Restore and open the newest snapshot in [`start`, `version`] that restores and opens (0: none, an
        empty DB open); as a load would, pass over bad ones (snapshot repair), logging each. One that restores
        but RocksDB will not open is known unopenable from then on (DESIGN invariant 14: never a base)."""
        for base in sorted((v for v in snapshots if start <= v <= version), reverse=True):
            self._discard()
            manifest = snapshots[base]
            path = self.store.manifest(base, manifest.checkpoint_id)
            try:
                restore_snapshot(self.fm, self.store, manifest, self.db_dir, manifest_path=path)
            except (CorruptFileError, UnsupportedFormatError, FileNotFoundError) as e:
                log.warning(
                    "store %s: the snapshot of version %d cannot be restored (%s); trying older", self.store, base, e
                )
                continue
            try:
                self._open_db()
            except Exception as e:  # rocksdict has no exception classes: anything is a snapshot that will not open
                why = f"RocksDB cannot open the restored snapshot ({str(e)[:300]})"
                root = self.fm.root_uri
                UNOPENABLE_WHY[(root, path)] = f"{why}: {root}/{path}"
                UNOPENABLE_SNAPSHOTS.add(root, self.store, [path])
                PROVEN_SNAPSHOTS.discard(root, self.store, [path])
                log.warning("store %s: %s: %s/%s; trying older", self.store, why, root, path)
                continue
            return base
        self._discard()
        os.makedirs(self.db_dir, exist_ok=True)
        self._open_db()
        return 0

    def _replay_range(self, start: int, end: int, committed: Mapping[int, str]) -> tuple[int, int]:
        """Replay the committed changelogs of versions start+1 .. end onto the open DB."""
        self._drop_marker()
        self.state = None  # the DB is between versions until the replay completes
        versions = range(start + 1, end + 1)
        if (missing := next((v for v in versions if v not in committed), None)) is not None:
            raise LineageError(f"version {missing} of store {self.store} is not committed (no commit record names it)")
        replay = ChangelogReplay(self.db, self._handle_of, self.dir)
        paths = [self.store.changelog(v, committed[v]) for v in versions]
        records = 0
        with ReadAhead(self.fm, paths, self.dir) as files:
            for v, path, f in zip(versions, paths, files, strict=True):
                with f:
                    full = v > 1 and v in self._full_state
                    parent = committed.get(v - 1) if v > 1 and not full else None
                    records += self._replay(replay, f, path, v, committed[v], parent, full_state=full)
        replay.write()
        return end - start, records

    def _handle_of(self, cf_name: str) -> Any:
        handle = self._handles.get(cf_name)
        if handle is None:
            check_family_count(len(self._handles) + 1, f"the replica of store {self.store}", cf_name)
            self.db.create_column_family(cf_name, db_options(bulk_replay=True))
            self._bind(cf_name)
            handle = self._handles[cf_name]
        return handle

    def _replay(
        self,
        replay: ChangelogReplay,
        f: BinaryIO,
        path: str,
        version: int,
        checkpoint_id: str,
        parent_id: str | None,
        *,
        full_state: bool = False,
    ) -> int:
        """Replay one changelog; `full_state`: its commit record declares it holds the whole state (a chain
        starts there), a claim its header must agree with, as replaying a changelog of changes from the empty
        state would build (and snapshot) a state without everything before it."""
        name = f"{self.fm.root_uri}/{path}"
        reader = ChangelogReader(f, name)
        check_header(self.store, reader.header, version, checkpoint_id, name)
        if parent_id is not None:
            check_parent(self.store, reader.header, parent_id, name)
        if full_state:
            check_full_state(self.store, reader.header, name)
        reader.check_footer()
        return replay.add(reader)

    # -- using ------------------------------------------------------------------------------------
    def snapshot(self, existing_ssts: set[str], corrupt_ssts: frozenset[str] = frozenset()) -> SnapshotResult:
        """Write a snapshot of the held version (uploads only SSTs not in `existing_ssts`; manifest last);
        SSTs whose content name holds a corrupt copy (`corrupt_ssts`) go under their full digest."""
        if self.state is None:
            raise StoreStateError(f"replica of store {self.store} holds no version")
        return write_snapshot(
            self.fm,
            self.store,
            self.state[0],
            self.state[1],
            self.db,
            self.dir,
            existing_ssts=existing_ssts,
            hash_cache=self.hash_cache,
            corrupt_ssts=corrupt_ssts,
        )

    def column_families(self) -> list[str]:
        return sorted(self._cfs)

    def items(self, cf: str) -> Iterator[tuple[bytes, bytes]]:
        return cast(Iterator[tuple[bytes, bytes]], self._cfs[cf].items())


@functools.cache
def host_boot_id() -> str:
    """An id that changes whenever the host restarts: Linux's boot id, elsewhere the boot time."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        import psutil

        return f"boot-time-{psutil.boot_time():.0f}"


def content_digest(items_by_cf: Mapping[str, Iterator[tuple[bytes, bytes]]]) -> tuple[int, str]:
    """(key count, SHA-256 over every non-empty column family's sorted items): compare states cheaply."""
    import hashlib

    h = hashlib.sha256()
    keys = 0
    for cf in sorted(items_by_cf):
        first = True
        for k, v in items_by_cf[cf]:
            if first:
                h.update(b"\x00cf" + len(cf).to_bytes(2, "little") + cf.encode())
                first = False
            h.update(len(k).to_bytes(4, "little") + k + len(v).to_bytes(4, "little") + v)
            keys += 1
    return keys, h.hexdigest()


__all__ = ["BuildStats", "Replica", "ReplicaBusyError", "content_digest", "host_boot_id"]
