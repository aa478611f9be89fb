"""The checkpoint file manager: the one interface through which every file is written and read.

It gives atomic publish (DESIGN invariant 1) and refuses to overwrite (invariant 2) for every backend,
so callers never handle temp names, renames or multipart uploads themselves.
"""

from __future__ import annotations

import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import BinaryIO, Protocol, Self, cast, runtime_checkable

from statekeeper.store.errors import CheckpointFileExistsError, CheckpointFileNotFoundError


@dataclass(frozen=True, slots=True)
class FileInfo:
    """One listed file; `path` is relative to the manager's root."""

    path: str
    size: int
    mtime: float


@dataclass(slots=True)
class DeleteResult:
    """Outcome of `delete_many`: what went, and each path that failed with its reason."""

    deleted: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)

    def merge(self, other: DeleteResult) -> None:
        self.deleted.extend(other.deleted)
        self.errors.update(other.errors)


class AtomicOutput(Protocol):
    """A writable stream that becomes visible under its final name only on a successful `close`.

    Used as a context manager: leaving the block normally publishes, an exception cancels.
    """

    path: str

    def write(self, data: bytes | bytearray | memoryview) -> int: ...

    def close(self) -> None:
        """Publish the file; raises `CheckpointFileExistsError` for a taken name when exclusive."""

    def cancel(self) -> None:
        """Discard everything written; nothing becomes visible."""

    def __enter__(self) -> AtomicOutput: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class PublishOnExit(ABC):
    """The context-manager half of `AtomicOutput`, shared by every backend's output.

    Leaving the `with` block normally publishes (`close`); an exception cancels, so a failed write
    never becomes visible.
    """

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def cancel(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.cancel()


SPOOL_BYTES = 16 << 20
"""A file `open_seekable` copies from a stream stays in memory up to this size, then goes to disk."""


def open_seekable(fm: CheckpointFileManager, path: str, spill_dir: str | None = None) -> BinaryIO:
    """`fm.open(path)`, seekable: a stream (an S3 GET) is copied as it is read, in memory up to
    `SPOOL_BYTES` and then in a temporary file under `spill_dir`, so the file is fetched once."""
    f = fm.open(path)
    if f.seekable():
        return f
    try:
        copy = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES, dir=spill_dir)  # noqa: SIM115 - returned
        try:
            shutil.copyfileobj(f, copy, 1 << 20)
            copy.seek(0)
        except BaseException:
            copy.close()
            raise
    finally:
        f.close()
    return cast(BinaryIO, copy)


def file_not_found(uri: str) -> CheckpointFileNotFoundError:
    """The error every backend raises for a missing file, naming its URI."""
    return CheckpointFileNotFoundError("checkpoint file not found", uri)


def overwrite_refused(uri: str, how: str = "") -> CheckpointFileExistsError:
    """The error every backend raises when an exclusive publish finds its name taken (invariant 2)."""
    detail = f" ({how})" if how else ""
    return CheckpointFileExistsError(f"refusing to overwrite existing checkpoint file{detail}", uri)


@runtime_checkable
class CheckpointFileManager(Protocol):
    """Files under one checkpoint root, addressed by validated relative paths."""

    @property
    def root_uri(self) -> str: ...

    def create(self, path: str, *, exclusive: bool = True) -> AtomicOutput:
        """Open `path` for an atomic write.

        With `exclusive` (the default) publishing fails if the name exists, so no file is ever
        replaced. Non-exclusive creates are only for content-addressed names, where the same name
        always means the same bytes.
        """

    def put_file(self, local_path: str, path: str, *, exclusive: bool = True) -> int:
        """Publish a complete local file under `path` atomically; returns its size.

        The file must not change afterwards (a local manager may publish it by hard link).
        """

    def open(self, path: str) -> BinaryIO:
        """Open for streaming reads; raises `CheckpointFileNotFoundError`."""

    def read_bytes(self, path: str) -> bytes: ...

    def download(self, path: str, local_path: str) -> int:
        """Copy `path` to a local file (created or replaced); returns its size."""

    def exists(self, path: str) -> bool: ...

    def info(self, path: str) -> FileInfo: ...

    def list(self, prefix: str = "", *, start_after: str | None = None) -> Iterator[FileInfo]:
        """Every file whose path starts with `prefix`, in lexicographic order of path.

        `start_after` skips every path <= it, so a watcher lists only what is new.
        """

    def delete_many(self, paths: Iterable[str]) -> DeleteResult:
        """Delete files under the root; missing files count as deleted.

        Every path is validated before anything is deleted, so one bad path deletes nothing.
        """
