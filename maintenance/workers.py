"""Running per-store work on a bounded pool, with a progress bar and per-store error capture."""

from __future__ import annotations

import contextvars
import logging
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
) -> list[R | Exception]:
    """`fn(item)` for every item, at most `parallelism` at once; an exception is returned in its place.

    One store's failure must not stop the others; the caller reports each failure by name.
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
        with ThreadPoolExecutor(max_workers=min(parallelism, len(items)), thread_name_prefix=desc or "maint") as pool:
            return list(pool.map(lambda ctx, item: ctx.run(one, item), contexts, items))
    finally:
        pbar.close()


__all__ = ["run_each"]
