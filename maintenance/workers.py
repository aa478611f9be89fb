"""Running per-store work on a bounded pool, with a progress bar and per-store error capture."""

from __future__ import annotations

import contextvars
import logging
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from statekeeper.maintenance.progress import bar

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


def run_each(
    items: Sequence[T],
    fn: Callable[[T], R],
    *,
    parallelism: int,
    progress: bool = False,
    desc: str = "",
    unit: str = "store",
    lane: Callable[[T], int] | None = None,
) -> list[R | Exception]:
    """`fn(item)` for every item, at most `parallelism` at once; an exception is returned in its place.

    One store's failure must not stop the others; the caller reports each failure by name. `lane`: items of one
    lane share a resource that serves one at a time (a build process): each lane gets its own share of the
    threads (at least one), so one item of every lane runs while the next one of it gets ready, and no lane
    idles while threads queue up at another.
    """
    pbar = bar(progress, desc, total=len(items), unit=unit)

    def one(item: T) -> R | Exception:
        try:
            return fn(item)
        except Exception as e:
            log.debug("%s: %r failed", desc, item, exc_info=True)
            return e
        finally:
            pbar.update(1)

    try:
        if parallelism <= 1 or len(items) <= 1:
            return [one(i) for i in items]
        # Each item runs in a copy of the caller's context (e.g. the maintenance loop's `cycle_leases`).
        contexts = [contextvars.copy_context() for _ in items]
        if lane is not None:
            return _run_in_lanes(items, contexts, one, lane, parallelism, desc)
        with ThreadPoolExecutor(max_workers=min(parallelism, len(items)), thread_name_prefix=desc or "maint") as pool:
            return list(pool.map(lambda ctx, item: ctx.run(one, item), contexts, items))
    finally:
        pbar.close()


def _run_in_lanes(
    items: Sequence[T],
    contexts: Sequence[contextvars.Context],
    one: Callable[[T], R | Exception],
    lane: Callable[[T], int],
    parallelism: int,
    desc: str,
) -> list[R | Exception]:
    """`one(item)` for every item, `parallelism // lanes` threads (at least one) taking the items of each lane
    in order."""
    queues: dict[int, deque[int]] = {}
    for i, item in enumerate(items):
        queues.setdefault(lane(item), deque()).append(i)
    results: dict[int, R | Exception] = {}

    def drain(queue: deque[int]) -> None:
        while True:
            try:
                i = queue.popleft()  # atomic: the lane's threads never take one item twice
            except IndexError:
                return
            results[i] = contexts[i].run(one, items[i])

    per_lane = max(1, parallelism // len(queues))
    runs = [q for q in queues.values() for _ in range(min(per_lane, len(q)))]  # a thread each
    with ThreadPoolExecutor(max_workers=len(runs), thread_name_prefix=desc or "maint") as pool:
        for future in [pool.submit(drain, q) for q in runs]:
            future.result()
    return [results[i] for i in range(len(items))]


__all__ = ["run_each"]
