"""The local replicas of stores a maintainer process keeps open between snapshot runs.

Replicas live in ``<work_dir>/replicas/<root hash>/<operator>/<partition>``; this process keeps
up to `open_replica_limit()` of them open between runs (one per store of a fleet), and a later process
reuses the directories.
Without `work_dir` they live in a temp directory removed when the process exits.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import resource
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from statekeeper.maintenance.replica import Replica, ReplicaBusyError
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.store.errors import ConfigurationError
from statekeeper.store.files import CheckpointFileManager, LocalFileManager
from statekeeper.store.layout import StoreId

log = logging.getLogger(__name__)

MAX_OPEN_REPLICAS = 4096
"""At most this many replicas stay open in this process (fewer where the file limit is low: see
`open_replica_limit`); older ones are closed (their directories stay)."""
FILES_PER_REPLICA = 16
"""File descriptors an open replica may hold (about 10: its DB's log, manifest, lock and SSTs, its lock)."""


@dataclass
class _Slot:
    lock: threading.Lock = field(default_factory=threading.Lock)
    replica: Replica | None = None


_registry_lock = threading.Lock()
_slots: OrderedDict[tuple[str, str, StoreId], _Slot] = OrderedDict()
_process_dir: str | None = None


def _default_work_dir() -> str:
    global _process_dir
    with _registry_lock:
        if _process_dir is None:
            _process_dir = tempfile.mkdtemp(prefix="statekeeper-maintenance-")
            atexit.register(_remove_process_dir, _process_dir)
        return _process_dir


def _remove_process_dir(path: str) -> None:
    close_replicas()  # before their directories go
    shutil.rmtree(path, ignore_errors=True)


def work_root(settings: MaintenanceSettings) -> str:
    return os.path.abspath(settings.work_dir) if settings.work_dir else _default_work_dir()


def replica_dir(work: str, root_uri: str, store: StoreId) -> str:
    digest = hashlib.sha256(root_uri.encode()).hexdigest()[:16]
    return os.path.join(work, "replicas", digest, store.operator, f"{store.partition:05d}")


def check_work_dir(fm: CheckpointFileManager, settings: MaintenanceSettings) -> None:
    """The work directory must not lie inside a local checkpoint root (its files would be foreign there)."""
    if settings.work_dir is None or not isinstance(fm, LocalFileManager):
        return
    work = os.path.realpath(settings.work_dir)
    root = os.path.realpath(fm.root_path)
    if work == root or work.startswith(root + os.sep):
        raise ConfigurationError(
            f"work_dir {settings.work_dir!r} is inside the checkpoint root {fm.root_uri}: use a directory outside it"
        )


@contextmanager
def checkout(fm: CheckpointFileManager, store: StoreId, work: str) -> Iterator[Replica]:
    """The replica of `store` under the work directory `work` (`work_root`; opened on first use),
    exclusively for the block."""
    key = (work, fm.root_uri, store)
    with _registry_lock:
        slot = _slots.get(key)
        if slot is None:
            slot = _slots[key] = _Slot()
        _slots.move_to_end(key)
    with slot.lock:
        if slot.replica is None:
            try:
                slot.replica = Replica(fm, store, replica_dir(work, fm.root_uri, store))
            except ReplicaBusyError as e:
                log.warning("%s; building store %s in a temporary copy", e, store)
                temp = tempfile.mkdtemp(prefix="statekeeper-replica-")
                replica = Replica(fm, store, temp)
                try:
                    yield replica
                finally:
                    replica.destroy()
                return
        slot.replica.fm = fm
        yield slot.replica
    _evict()


def open_replica_limit() -> int:
    """How many replicas may stay open: one per store of a fleet up to `MAX_OPEN_REPLICAS`, within the
    process's open-file limit (a reopened copy costs ~3 ms of CPU per snapshot; at least 32 stay open)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_OPEN_REPLICAS
    return max(32, min(MAX_OPEN_REPLICAS, (soft - 256) // FILES_PER_REPLICA))


def raise_open_file_limit() -> None:
    """Raise this process's soft open-file limit to its hard limit (as servers that hold many files open
    do), so a long-running maintainer keeps a replica of every store."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= target:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        log.info("open-file limit %d -> %d: up to %d replicas stay open", soft, target, open_replica_limit())
    except (ValueError, OSError) as e:
        log.info("open-file limit stays %d (%s): up to %d replicas stay open", soft, e, open_replica_limit())


def _evict() -> None:
    limit = open_replica_limit()
    with _registry_lock:
        if len(_slots) <= limit:  # every checkout ends here: no pass over a fleet's slots while under the limit
            return
        open_slots = [(k, s) for k, s in _slots.items() if s.replica is not None]
        excess = len(open_slots) - limit
        victims = []
        for k, s in open_slots:
            if excess <= 0:
                break
            if s.lock.acquire(blocking=False):
                victims.append((k, s))
                excess -= 1
    for k, s in victims:
        try:
            if s.replica is not None:
                s.replica.close()
                s.replica = None
        finally:
            s.lock.release()
        with _registry_lock:
            if _slots.get(k) is s and s.replica is None:
                del _slots[k]


def close_replicas() -> None:
    """Close every replica this process holds open (their directories stay for later runs)."""
    with _registry_lock:
        slots = list(_slots.values())
        _slots.clear()
    for s in slots:
        with s.lock:
            if s.replica is not None:
                s.replica.close()
                s.replica = None


atexit.register(close_replicas)


__all__ = [
    "FILES_PER_REPLICA",
    "MAX_OPEN_REPLICAS",
    "check_work_dir",
    "checkout",
    "close_replicas",
    "open_replica_limit",
    "raise_open_file_limit",
    "replica_dir",
    "work_root",
]
