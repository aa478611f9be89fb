"""The Python worker's cache of open stores and uploaders, per (root, operator, partition).

Spark reuses Python workers, so a partition's next task on the same worker finds its RocksDB open
(executor.py); the cache is LRU-bounded (``STATEKEEPER_SPARK_MAX_STORES``, 64) and its local
directories live under ``STATEKEEPER_SPARK_LOCAL_DIR`` (or the temp dir), per worker process.

A store no task has used for ``STATEKEEPER_SPARK_IDLE_SECONDS`` (10) has its memtables flushed when
the worker next fetches a store: the stores of a stopped query, or of partitions now served by
another worker, would otherwise keep their memtables charged to the process memory limit (rocks.py)
and crowd out the blocks the busy stores read (3x slower gets and puts with 24 idle stores).

Between its tasks the worker catches its other recently used stores up to each committed batch
(store/spark/follow.py): the cache hands the follower one store at a time, never while a task runs in the
worker, and a task that wants the store being followed waits for that one catch-up.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import replace
from math import inf
from typing import Protocol

from statekeeper.store.async_upload import AsyncUploader
from statekeeper.store.errors import ConfigurationError
from statekeeper.store.files import CheckpointFileManager, open_file_manager
from statekeeper.store.loading import LoadMetrics
from statekeeper.store.rocks import MemoryLimits, default_memory, flush_memtables
from statekeeper.store.state_store import StateStore, StoreConfig

LOCAL_DIR_ENV = "STATEKEEPER_SPARK_LOCAL_DIR"
MAX_STORES_ENV = "STATEKEEPER_SPARK_MAX_STORES"
IDLE_SECONDS_ENV = "STATEKEEPER_SPARK_IDLE_SECONDS"

FileManagerFactory = Callable[[str], CheckpointFileManager]

WORKER_MEMORY_MB = 128
"""A Spark Python worker's RocksDB memory limit (`statekeeper.store.rocks.MemoryLimits`) unless
``STATEKEEPER_MEMORY_MB`` sets it: an executor runs one worker per core, each with its own limit, and their memory
counts against the executor's memory overhead (Spark's default: 10% of the executor's memory, at least 384 MiB, for
all its Python workers); the worker's peak RSS at large batches is in docs/benchmarks.md (spark, the size table)."""


class StoreSpec(Protocol):
    """What the cache needs of a task's spec (`executor.TaskSpec`)."""

    @property
    def root(self) -> str: ...
    @property
    def operator(self) -> str: ...
    @property
    def local_dir(self) -> str | None: ...
    @property
    def store_config(self) -> StoreConfig: ...
    @property
    def fm_factory(self) -> FileManagerFactory | None: ...


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigurationError(f"{name}={raw!r} must be a non-negative number")
    return value


def use_worker_memory() -> None:
    """Inside a Spark task: this Python worker's RocksDB memory limit is `WORKER_MEMORY_MB` unless already set.
    Called where a Spark task first touches stores (the operator's tasks, the state reader, rescale builds)."""
    from pyspark import TaskContext

    if TaskContext.get() is not None:
        default_memory(MemoryLimits(total_bytes=WORKER_MEMORY_MB << 20))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class WorkerCache:
    """Stores and uploaders of this Python worker process, LRU-bounded."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stores: OrderedDict[tuple[str, str, int], StateStore] = OrderedDict()
        self.uploaders: dict[str, AsyncUploader] = {}
        self.base: str | None = None
        self.max_stores = int(_env_number(MAX_STORES_ENV, 64))
        self.idle_seconds = _env_number(IDLE_SECONDS_ENV, 10)
        self.clock = time.monotonic
        # last use (`clock`) of each store whose memtables may hold memory; an idle one leaves
        self.last_used: dict[tuple[str, str, int], float] = {}
        self.changed = threading.Condition(self.lock)
        self.tasks = 0
        """Tasks running in this worker: the follower takes no store while there is one."""
        self.following: tuple[str, str, int] | None = None
        """The store the follower is catching up, if any (no task fetches it meanwhile)."""
        self.followed: dict[tuple[str, str, int], LoadMetrics] = {}
        """What the follower replayed into each store since a task last fetched it."""
        self.closing = False

    def process_dir(self, configured: str | None) -> str:
        if self.base is None:
            default = os.path.join(tempfile.gettempdir(), "statekeeper-spark")
            root = configured or os.environ.get(LOCAL_DIR_ENV) or default
            os.makedirs(root, exist_ok=True)
            for name in os.listdir(root):  # work dirs of worker processes that died
                if name.isdigit() and int(name) != os.getpid() and not _alive(int(name)):
                    shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            self.base = os.path.join(root, str(os.getpid()))
            os.makedirs(self.base, exist_ok=True)
            atexit.register(self.close_all)
        return self.base

    def uploader(self, spec: StoreSpec) -> AsyncUploader:
        up = self.uploaders.get(spec.root)
        if up is None:
            fm = spec.fm_factory(spec.root) if spec.fm_factory else open_file_manager(spec.root)
            tag = hashlib.sha1(spec.root.encode()).hexdigest()[:16]
            up = AsyncUploader(fm, os.path.join(self.process_dir(spec.local_dir), "uploads", tag))
            self.uploaders[spec.root] = up
        return up

    def store(self, spec: StoreSpec, partition: int) -> StateStore:
        key = (spec.root, spec.operator, partition)
        now = self.clock()
        for idle in self._idle_stores(now):
            flush_memtables(idle)
        with self.lock:
            while self.following == key:
                self.changed.wait()
            self.last_used[key] = now
            store = self.stores.get(key)
            if store is not None:
                self.stores.move_to_end(key)
                return store
            base = self.process_dir(spec.local_dir)
            tag = hashlib.sha1(f"{spec.root}\0{spec.operator}".encode()).hexdigest()[:16]
            local = os.path.join(base, "stores", tag, f"{partition:05d}")
            shutil.rmtree(local, ignore_errors=True)
            config = replace(spec.store_config, local_dir=local)
            store = StateStore(self.uploader(spec), spec.operator, partition, config=config)
            self.stores[key] = store
            while len(self.stores) > self.max_stores:
                oldest = next(k for k in self.stores if k != self.following)
                self._close(self.stores.pop(oldest))
            return store

    def held(self, key: tuple[str, str, int]) -> StateStore | None:
        """The store of `key` if this worker holds one (not for use: `follow` or `store` hand it out)."""
        with self.lock:
            return self.stores.get(key)

    def note_followed(self, key: tuple[str, str, int], done: LoadMetrics) -> None:
        """Add a catch-up the follower did to what the store's next task reports."""
        with self.lock:
            before = self.followed.get(key)
            if before is not None:
                done = replace(
                    done,
                    load_ms=before.load_ms + done.load_ms,
                    replayed_changelogs=before.replayed_changelogs + done.replayed_changelogs,
                    replayed_records=before.replayed_records + done.replayed_records,
                )
            self.followed[key] = done

    def followed_by(self, spec: StoreSpec, partition: int) -> LoadMetrics | None:
        """What the follower replayed into the partition's store since a task last asked (then forgotten)."""
        with self.lock:
            return self.followed.pop((spec.root, spec.operator, partition), None)

    @contextlib.contextmanager
    def task(self) -> Iterator[None]:
        """Held by each task of the worker: the follower leaves the stores alone meanwhile."""
        with self.lock:
            self.tasks += 1
        try:
            yield
        finally:
            with self.lock:
                self.tasks -= 1

    def recent(self, root: str, operator: str) -> list[tuple[str, str, int]]:
        """The operator's stores some task used within `idle_seconds`, the most recently used last."""
        now = self.clock()
        with self.lock:
            used, idle = self.last_used, self.idle_seconds
            return [k for k in self.stores if k[:2] == (root, operator) and now - used.get(k, -inf) <= idle]

    @contextlib.contextmanager
    def follow(self, key: tuple[str, str, int]) -> Iterator[StateStore | None]:
        """The store of `key` for the follower alone, or None (a task is running, the worker is closing, or the
        store is gone). A task fetching it meanwhile waits."""
        with self.lock:
            store = None if self.tasks or self.closing else self.stores.get(key)
            if store is not None:
                self.following = key
        try:
            yield store
        finally:
            if store is not None:
                with self.lock:
                    self.following = None
                    self.changed.notify_all()

    def _idle_stores(self, now: float) -> list[StateStore]:
        """Stores unused for `idle_seconds`, each returned once until used again."""
        with self.lock:
            idle = [k for k, used in self.last_used.items() if now - used > self.idle_seconds]
            for k in idle:
                del self.last_used[k]
            return [self.stores[k] for k in idle if k in self.stores]

    def holds(self, spec: StoreSpec, partition: int) -> bool:
        with self.lock:
            return (spec.root, spec.operator, partition) in self.stores

    def drop(self, spec: StoreSpec, partition: int) -> None:
        with self.lock:
            store = self.stores.pop((spec.root, spec.operator, partition), None)
        if store is not None:
            self._close(store)

    @staticmethod
    def _close(store: StateStore) -> None:
        with contextlib.suppress(Exception):
            store.close(discard=True)
        shutil.rmtree(store.local_dir, ignore_errors=True)

    def close_all(self) -> None:
        with self.lock:
            self.closing = True
            self.changed.wait_for(lambda: self.following is None, timeout=30)
        for up in self.uploaders.values():
            with contextlib.suppress(Exception):
                up.close(wait=True)
        for store in list(self.stores.values()):
            self._close(store)
        self.stores.clear()


CACHE = WorkerCache()


__all__ = [
    "CACHE",
    "IDLE_SECONDS_ENV",
    "LOCAL_DIR_ENV",
    "MAX_STORES_ENV",
    "FileManagerFactory",
    "StoreSpec",
    "WorkerCache",
]
