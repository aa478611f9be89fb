"""Reading a run of checkpoint files in order while the next few are fetched in the background.

A replay (a load's catch-up, a maintenance build) reads its changelogs one after the other. Read in turn, each
waits for its own S3 round trip, or for its own disk read when the file is not in the page cache, while the
cores idle; `ReadAhead` keeps up to `READ_AHEAD` of the next files in flight on a small shared thread pool, so
a replay waits for about one fetch instead of each. An S3 object is copied into a spooled temp file as it is
fetched (`open_seekable`); a local file is opened and the kernel is asked to read it ahead
(``POSIX_FADV_WILLNEED``), so no bytes are copied. A file's error (missing, unreadable) is raised when its
turn comes, as if it had been read then.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import BinaryIO

from statekeeper.store.files.base import CheckpointFileManager, open_seekable

READ_AHEAD = 4
"""Files in flight ahead of the one being read, by default: at most this many x `SPOOL_BYTES` of S3 objects in
memory."""

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _shared_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=2 * READ_AHEAD, thread_name_prefix="statekeeper-read-ahead")
        return _pool


def _forget_pool() -> None:  # a forked child has the pool object but none of its threads
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def _fetch(fm: CheckpointFileManager, path: str, spill_dir: str | None) -> BinaryIO:
    f = open_seekable(fm, path, spill_dir)
    with contextlib.suppress(AttributeError, OSError, ValueError):  # not an OS file (a spooled S3 copy), or no fadvise
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
    return f


def _close_when_fetched(future: Future[BinaryIO]) -> None:
    if not future.cancel():
        future.add_done_callback(lambda done: done.exception() is None and done.result().close())


class ReadAhead:
    """``with ReadAhead(fm, paths, spill_dir) as files: for f in files: ...``: each of `paths` opened seekable,
    in order, with up to `depth` more in flight (0: each fetched in turn); the caller closes each file it takes
    (``with f:``), and leaving the block drops the rest."""

    def __init__(
        self, fm: CheckpointFileManager, paths: Sequence[str], spill_dir: str | None, depth: int = READ_AHEAD
    ) -> None:
        self._fm, self._paths, self._spill, self._depth = fm, paths, spill_dir, depth
        self._in_flight: deque[Future[BinaryIO]] = deque()

    def __enter__(self) -> Iterator[BinaryIO]:
        return self._files()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        while self._in_flight:
            _close_when_fetched(self._in_flight.popleft())

    def _files(self) -> Iterator[BinaryIO]:
        if self._depth <= 0 or len(self._paths) < 2:  # nothing to overlap: no thread handoff
            yield from (_fetch(self._fm, path, self._spill) for path in self._paths)
            return
        pool = _shared_pool()
        for path in self._paths:
            self._in_flight.append(pool.submit(_fetch, self._fm, path, self._spill))
            if len(self._in_flight) > self._depth:
                yield self._in_flight.popleft().result()
        while self._in_flight:
            yield self._in_flight.popleft().result()


__all__ = ["READ_AHEAD", "ReadAhead"]
