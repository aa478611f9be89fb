"""Asynchronous checkpointing: publish local files to the checkpoint location in the background.

:class:`AsyncUploader` wraps a checkpoint file manager and is itself one, so a store uses it without
knowing: ``StateStore(AsyncUploader(fm), op, partition)``. Its :meth:`put_file` makes the local file
durable under a staging name (hard link + fsync of the directory, so the caller may delete its own
name at once), queues the upload and returns; every other operation is the wrapped manager's.
A store's ``commit()`` therefore returns once the changelog is durable on local disk.

Whoever reports the batch committed waits for the upload first (:meth:`pending` gives the handle;
:meth:`PendingUpload.result` raises the upload's error): DESIGN invariant 3 holds as in sync mode.
A failed upload leaves nothing under the final name (the wrapped manager publishes atomically).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO

from statekeeper.store.errors import ConfigurationError, StoreStateError
from statekeeper.store.faults import reached as fault_point
from statekeeper.store.files.base import AtomicOutput, CheckpointFileManager, DeleteResult, FileInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UploadResult:
    path: str
    size: int
    upload_ms: float
    """Time from submission to a durable file in the checkpoint location (queueing included)."""


class PendingUpload:
    """A queued upload; future-like."""

    def __init__(self, path: str, size: int, future: Future[UploadResult]) -> None:
        self.path = path
        self.size = size
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> UploadResult:
        """Wait for the file to be durable in the checkpoint location; raises the upload's error."""
        return self._future.result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._future.exception(timeout)

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"PendingUpload({self.path!r}, {self.size} bytes, {state})"


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AsyncUploader:
    """A checkpoint file manager whose `put_file` returns once the file is durable locally."""

    def __init__(self, fm: CheckpointFileManager, staging_dir: str, *, max_workers: int = 2) -> None:
        if max_workers < 1:
            raise ConfigurationError(f"max_workers={max_workers} must be >= 1")
        self.inner = fm
        self.staging_dir = os.path.abspath(staging_dir)
        os.makedirs(self.staging_dir, exist_ok=True)
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="statekeeper-upload")
        self._lock = threading.Lock()
        self._pending: dict[str, PendingUpload] = {}
        self._closed = False

    # -- the asynchronous part ------------------------------------------------------------------
    def put_file(self, local_path: str, path: str, *, exclusive: bool = True) -> int:
        """Stage `local_path` durably, queue its upload to `path` and return its size."""
        if self._closed:
            raise StoreStateError(f"uploader for {self.inner.root_uri} is closed")
        staged = os.path.join(self.staging_dir, f"{uuid.uuid4().hex}.upload")
        try:
            os.link(local_path, staged)
        except OSError:  # another file system: copy, then make the copy durable
            shutil.copyfile(local_path, staged)
            with open(staged, "rb+") as f:
                os.fsync(f.fileno())
        _fsync_dir(self.staging_dir)
        size = os.path.getsize(staged)
        fault_point("upload.enqueue", path)
        submitted = time.perf_counter()
        future = self._pool.submit(self._upload, staged, path, exclusive, size, submitted)
        pending = PendingUpload(path, size, future)
        with self._lock:
            self._pending[path] = pending
        future.add_done_callback(lambda f: self._log_failure(path, f))
        return size

    def _upload(self, staged: str, path: str, exclusive: bool, size: int, submitted: float) -> UploadResult:
        try:
            fault_point("upload.run", path)
            self.inner.put_file(staged, path, exclusive=exclusive)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staged)
        return UploadResult(path, size, (time.perf_counter() - submitted) * 1000)

    @staticmethod
    def _log_failure(path: str, future: Future[UploadResult]) -> None:
        exc = future.exception()
        if exc is not None:
            log.warning("upload of %s failed: %s", path, exc)

    def pending(self, path: str) -> PendingUpload | None:
        """The upload queued for `path` (until :meth:`forget` or a newer one for the same path)."""
        with self._lock:
            return self._pending.get(path)

    def forget(self, path: str) -> None:
        with self._lock:
            self._pending.pop(path, None)

    def in_flight(self) -> list[PendingUpload]:
        with self._lock:
            return [p for p in self._pending.values() if not p.done()]

    def wait_all(self, timeout: float | None = None) -> list[UploadResult]:
        """Wait for every remembered upload; raises the first failure."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            items = list(self._pending.values())
        results = []
        for p in items:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            results.append(p.result(left))
        return results

    def close(self, *, wait: bool = True) -> None:
        self._closed = True
        self._pool.shutdown(wait=wait, cancel_futures=not wait)

    # -- everything else is the wrapped manager's -----------------------------------------------
    @property
    def root_uri(self) -> str:
        return self.inner.root_uri

    def create(self, path: str, *, exclusive: bool = True) -> AtomicOutput:
        return self.inner.create(path, exclusive=exclusive)

    def open(self, path: str) -> BinaryIO:
        return self.inner.open(path)

    def read_bytes(self, path: str) -> bytes:
        return self.inner.read_bytes(path)

    def download(self, path: str, local_path: str) -> int:
        return self.inner.download(path, local_path)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def info(self, path: str) -> FileInfo:
        return self.inner.info(path)

    def list(self, prefix: str = "", *, start_after: str | None = None) -> Iterator[FileInfo]:
        return self.inner.list(prefix, start_after=start_after)

    def delete_many(self, paths: Iterable[str]) -> DeleteResult:
        return self.inner.delete_many(paths)


__all__ = ["AsyncUploader", "PendingUpload", "UploadResult"]
