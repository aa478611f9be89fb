"""A reused Spark Python worker's cyclic garbage collection between tasks.

PySpark's daemon runs a full ``gc.collect()`` in a reused worker after each of its tasks, before the worker
takes the next one. A worker holding statekeeper's stores, pyarrow and pandas tracks tens of thousands of
long-lived objects, and a full collection traverses them all: tens of ms between every two tasks of the worker, on
the critical path of a batch whose partitions outnumber the cores (the next wave's task waits for it).

As a task starts, the daemon has just collected: what is alive then is the worker's long-lived state and this
task's own command. `WorkerGC.task_started` freezes it (``gc.freeze``: the collector skips those objects; freeing
by reference count is unchanged), so the daemon's collection after the task traverses only what the task left.
A frozen object that later dies in a reference cycle (a task's command, a closed store's objects) waits for the
next full collection: every `FULL_EVERY` tasks of the worker, the task unfreezes everything as it ends, so that
the daemon's next collection is a full one. (Counting the frozen objects instead would walk them all: as slow a
task as the collection it avoids.)
"""

from __future__ import annotations

import gc

FULL_EVERY = 32
"""Tasks of a worker between two full collections."""


class WorkerGC:
    """Whether the collection after a worker's task traverses only what the task left, or everything."""

    def __init__(self) -> None:
        self.tasks = 0
        """Tasks since the last full collection."""

    def task_started(self) -> None:
        gc.freeze()

    def task_ended(self) -> None:
        """Unfreeze when a full collection is due: the daemon's collection after this task is then one."""
        self.tasks += 1
        if self.tasks >= FULL_EVERY:
            gc.unfreeze()
            self.tasks = 0


WORKER_GC = WorkerGC()

__all__ = ["FULL_EVERY", "WORKER_GC", "WorkerGC"]
