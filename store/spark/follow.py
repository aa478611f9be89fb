"""Catching a Python worker's other stores up between its tasks.

Spark hands a partition's next task to whichever Python worker is idle, so about half the time a task
finds its worker's copy of the store one batch behind (another worker ran the partition last) and replays
that batch's changelog before any of its own work: tens of ms per task on the batch's critical path.

After a task of this worker commits batch version ``v`` of an operator, a background thread waits for the
batch's commit record (the driver writes it once every partition's state is durable), then brings each
of the worker's stores of that operator that a task used recently (`worker_cache`, ``idle_seconds``) and
that hold an older version up to the committed ``v`` — the same load the partition's next task here
would run, done while the worker has no task. The next task then finds its store current.

It takes a store only while no task runs in the worker, one store at a time (a task wanting that store
waits for its catch-up), and stops early when a newer batch of the operator commits or the worker
closes; a failed catch-up is logged and left to the next task's own load, which reports it. Outside a
Spark task (`TwsTester`, tests running tasks in-process) or with ``STATEKEEPER_SPARK_FOLLOW=0`` nothing
follows. What a store received this way is in its next task's metrics (``followed_changelogs``,
``followed_records``, ``follow_ms``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time

from statekeeper.store.errors import ConfigurationError
from statekeeper.store.formats.commit import CommitRecord
from statekeeper.store.rocks import release_free_heap
from statekeeper.store.spark.worker_cache import CACHE, WorkerCache
from statekeeper.store.state_store import StateStore

log = logging.getLogger(__name__)

FOLLOW_ENV = "STATEKEEPER_SPARK_FOLLOW"
RECORD_WAIT_S = 30.0
"""How long the follower waits for a batch's commit record after its task (a batch whose other tasks take
longer is left to its next tasks' own loads)."""
_POLL_FIRST_S, _POLL_MAX_S = 0.005, 0.25


def follows() -> bool:
    """Inside a Spark task, unless ``STATEKEEPER_SPARK_FOLLOW=0``."""
    raw = os.environ.get(FOLLOW_ENV, "1")
    if raw not in ("0", "1"):
        raise ConfigurationError(f"{FOLLOW_ENV}={raw!r} must be 0 or 1")
    from pyspark import TaskContext

    return raw == "1" and TaskContext.get() is not None


class Follower:
    """One background thread per worker process, catching up the stores of the operators its tasks committed."""

    def __init__(self, cache: WorkerCache) -> None:
        self._cache = cache
        self._wake = threading.Condition()
        self._pending: dict[tuple[str, str], int] = {}
        """(root, operator) -> the newest version this worker's tasks committed and the thread has not taken."""
        self._thread: threading.Thread | None = None

    def follow(self, root: str, operator: str, version: int) -> None:
        """A task of this worker committed `version` of `operator` under `root`."""
        with self._wake:
            target = (root, operator)
            self._pending[target] = max(version, self._pending.get(target, 0))
            self._wake.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="statekeeper-follow", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(OSError):  # the lowest CPU priority: it takes only cores nothing else wants
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while True:
            with self._wake:
                self._wake.wait_for(lambda: bool(self._pending))
                (root, operator), version = self._pending.popitem()
            try:
                self._catch_up(root, operator, version)
            except Exception as e:  # the next task's own load does the work and reports what fails
                log.info("statekeeper %s: catching up to version %d between tasks stopped: %s", operator, version, e)

    def _superseded(self, root: str, operator: str, version: int) -> bool:
        with self._wake:
            return self._pending.get((root, operator), 0) > version or self._cache.closing

    def _catch_up(self, root: str, operator: str, version: int) -> None:
        keys = self._cache.recent(root, operator)
        if not keys:
            return
        record = self._record(keys[0], version)
        if record is None:
            return
        for key in reversed(keys):  # the most recently used first
            if self._superseded(root, operator, version):
                return
            checkpoint_id = record.checkpoint_id(operator, key[2])
            with self._cache.follow(key) as store:
                if store is None or checkpoint_id is None or not _behind(store, version):
                    continue
                store.load(version, checkpoint_id)
                store.abort()
                if store.last_load is not None:
                    self._cache.note_followed(key, store.last_load)
        release_free_heap()  # what the replays freed goes back to the OS, not into the next task's RSS

    def _record(self, key: tuple[str, str, int], version: int) -> CommitRecord | None:
        """The commit record of `version`, once the driver has written it (None: not within `RECORD_WAIT_S`, or
        superseded)."""
        store = self._cache.held(key)
        if store is None:
            return None
        deadline = time.monotonic() + RECORD_WAIT_S
        pause = _POLL_FIRST_S
        while not self._superseded(key[0], key[1], version):
            record = store.commit_log.get(version, use_cache=False)
            if record is not None or time.monotonic() > deadline:
                return record
            time.sleep(pause)
            pause = min(pause * 2, _POLL_MAX_S)
        return None


def _behind(store: StateStore, version: int) -> bool:
    """The store holds a committed version older than `version` (not one this worker just wrote, nor nothing)."""
    return store.version is not None and store.version < version


FOLLOWER = Follower(CACHE)

__all__ = ["FOLLOWER", "FOLLOW_ENV", "Follower", "follows"]
