"""The running driver's heartbeat: a small file refreshed while a query runs the operator.

An offline rescale or rollback must not run beside a writer (its commit would race the driver's next
commit record). Commit records alone cannot tell: a query with a long trigger interval commits rarely.
So, while a streaming query is active in its session, the driver publishes
``spark/<operator>/heartbeat/<ms>.json`` every ``interval`` seconds (a new name each time, never an
overwrite, DESIGN invariant 2) and deletes the one before it; when no query is active any more, it
deletes its last one and stops. A killed driver leaves one stale heartbeat: `statekeeper rescale`
refuses until it is older than ``--idle-seconds`` (or ``--force``), and orphan cleanup removes it once
older than five minutes and the grace period (maintenance/plan.py, docs/formats.md).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from statekeeper.store.files import CheckpointFileManager
from statekeeper.store.layout import heartbeat_dir, heartbeat_path

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_SECONDS = 10.0
ACTIVITY_POLL_SECONDS = 1.0
"""How often the thread checks that a query still runs (a stopped query's heartbeat goes within this)."""


@dataclass(frozen=True)
class HeartbeatSeen:
    """The newest heartbeat of an operator found in the checkpoint."""

    path: str
    age_seconds: float


def newest_heartbeat(fm: CheckpointFileManager, operator: str, *, now: float | None = None) -> HeartbeatSeen | None:
    """The newest heartbeat file of `operator` (by its storage time), if any."""
    newest = None
    for info in fm.list(heartbeat_dir(operator)):
        if newest is None or info.mtime > newest.mtime:
            newest = info
    if newest is None:
        return None
    return HeartbeatSeen(newest.path, (time.time() if now is None else now) - newest.mtime)


class Heartbeat:
    """Publishes the heartbeat of `operator` from a daemon thread while `active()` says a query runs."""

    def __init__(
        self,
        fm: CheckpointFileManager,
        operator: str,
        active: Callable[[], bool],
        *,
        interval: float = DEFAULT_INTERVAL_SECONDS,
    ) -> None:
        self.fm = fm
        self.operator = operator
        self.active = active
        self.interval = interval
        self._last: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Beat now and then every `interval` seconds (no-op while already running)."""
        if self.running:
            return
        self._stop.clear()
        self.beat()
        self._thread = threading.Thread(target=self._run, name=f"statekeeper-heartbeat-{self.operator}", daemon=True)
        self._thread.start()
        atexit.register(self.stop)

    def beat(self) -> None:
        """Publish a fresh heartbeat, then delete the previous one."""
        now_ms = int(time.time() * 1000)
        path = heartbeat_path(self.operator, now_ms)
        if path == self._last:
            return
        body = {"operator": self.operator, "host": socket.gethostname(), "pid": os.getpid(), "time_ms": now_ms}
        with self.fm.create(path, exclusive=True) as out:
            out.write(json.dumps(body).encode())
        previous, self._last = self._last, path
        if previous is not None:
            self.fm.delete_many([previous])

    def stop(self) -> None:
        """Stop beating and delete the last heartbeat (the writer is gone)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._thread = None
        atexit.unregister(self.stop)
        self._remove_last()

    def _remove_last(self) -> None:
        last, self._last = self._last, None
        if last is not None:
            self.fm.delete_many([last])

    def _run(self) -> None:
        due = time.monotonic() + self.interval
        while not self._stop.wait(min(ACTIVITY_POLL_SECONDS, self.interval)):
            try:
                if not self.active():
                    self._remove_last()
                    return
                if time.monotonic() >= due:
                    due = time.monotonic() + self.interval
                    self.beat()
            except Exception:  # a failed beat is retried at the next tick; a stale one only delays a rescale
                log.warning("statekeeper %s: heartbeat failed", self.operator, exc_info=True)


__all__ = ["ACTIVITY_POLL_SECONDS", "DEFAULT_INTERVAL_SECONDS", "Heartbeat", "HeartbeatSeen", "newest_heartbeat"]
