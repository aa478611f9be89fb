"""Checkpoint files on a local (or mounted) file system.

Publish is temp file in the same directory -> fsync -> link/rename -> fsync directory, so a crash at
any instant leaves either no file or the complete file under the final name.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import stat
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlparse

from statekeeper.store.errors import CheckpointError, CheckpointWriteError, ConfigurationError, CorruptFileError
from statekeeper.store.faults import reached as fault_point
from statekeeper.store.files.base import DeleteResult, FileInfo, PublishOnExit, file_not_found, overwrite_refused
from statekeeper.store.files.paths import (
    validate_listing,
    validate_paths_to_delete,
    validate_prefix,
    validate_relative_path,
)
from statekeeper.store.formats.limits import MAX_WHOLE_FILE

log = logging.getLogger(__name__)

TEMP_SUFFIX = ".tmp"
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
"""A reader never follows a symlink at the file's own name and never blocks opening it (a FIFO)."""
_DIRS_REMEMBERED = 4096
FileInfos = list[FileInfo]  # spelled here: inside `LocalFileManager`, `list` is its method
Paths = list[str]


def temp_name_for(final_name: str) -> str:
    """Hidden, unique temp name beside the final one; orphan cleanup recognises the pattern."""
    return f".{final_name}.{uuid.uuid4().hex}{TEMP_SUFFIX}"


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def makedirs_durable(path: str) -> None:
    """Create `path` and its parents, fsyncing each parent whose entry list changed."""
    missing: list[str] = []
    p = os.path.abspath(path)
    while not os.path.isdir(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            continue
        fsync_dir(os.path.dirname(d))


class _LocalOutput(PublishOnExit):
    def __init__(self, manager: LocalFileManager, path: str, final: str, exclusive: bool) -> None:
        self.path = path
        self._final = final
        self._exclusive = exclusive
        self._dir = os.path.dirname(final)
        self._tmp = os.path.join(self._dir, temp_name_for(os.path.basename(final)))
        self._file: BinaryIO | None = open(self._tmp, "xb")  # noqa: SIM115 - closed in close/cancel
        self._manager = manager

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._file is None:
            raise CheckpointError("write after close or cancel", self.path)
        try:
            fault_point("local.write", self.path)
            return self._file.write(data)
        except OSError as e:
            raise CheckpointWriteError(self._manager.uri_of(self.path), e) from e

    def close(self) -> None:
        f = self._file
        if f is None:
            return
        self._file = None
        try:
            self._publish(f)
        except CheckpointError:
            raise
        except OSError as e:  # ENOSPC, EIO ...: name the file (the temp file is gone, see _publish)
            raise CheckpointWriteError(self._manager.uri_of(self.path), e) from e

    def _publish(self, f: BinaryIO) -> None:
        try:
            try:
                f.flush()
                fault_point("local.fsync", self.path)
                os.fsync(f.fileno())
            finally:
                f.close()
            fault_point("local.publish", self.path)
            if self._exclusive:
                try:
                    os.link(self._tmp, self._final)
                except FileExistsError:
                    raise overwrite_refused(self._manager.uri_of(self.path)) from None
                fault_point("local.published", self.path)
                os.unlink(self._tmp)
            else:
                os.replace(self._tmp, self._final)
                fault_point("local.published", self.path)
            fsync_dir(self._dir)
        finally:  # a failed flush or fsync (ENOSPC, EIO) leaves no temp file behind either
            if os.path.lexists(self._tmp):
                os.unlink(self._tmp)

    def cancel(self) -> None:
        f = self._file
        self._file = None
        if f is not None:
            with contextlib.suppress(OSError):  # its buffer may not flush (ENOSPC): it goes anyway
                f.close()
        if os.path.lexists(self._tmp):
            os.unlink(self._tmp)


def _sorted_entries(
    directory: str, rel: str, name_prefix: str, temps: FileInfos | None = None, specials: list[str] | None = None
) -> list[tuple[str, os.DirEntry[str], bool]]:
    """(path relative to the root, entry, is a directory) of `directory`'s published entries whose name
    starts with `name_prefix`, in key order (a directory sorts as its name + "/", as S3 lists keys); the
    temp files among them are appended to `temps` if given, the special entries (never listed nor opened) to
    `specials` if given, else logged."""
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    keyed = []
    for e in entries:
        if not e.name.startswith(name_prefix):
            continue
        if is_temp_name(e.name):
            if temps is not None:
                with contextlib.suppress(FileNotFoundError):
                    if e.is_file(follow_symlinks=False):
                        st = e.stat(follow_symlinks=False)
                        temps.append(FileInfo(f"{rel}/{e.name}" if rel else e.name, st.st_size, st.st_mtime))
            continue
        is_dir = e.is_dir(follow_symlinks=False)
        if not is_dir and not e.is_file(follow_symlinks=False):  # d_type: no system call
            if specials is not None:
                specials.append(f"{rel}/{e.name}" if rel else e.name)
            else:
                log.warning("skipping %s: not a regular file or directory (a symlink, FIFO or device)", e.path)
            continue
        sort_name = e.name + "/" if is_dir else e.name
        keyed.append((f"{rel}/{sort_name}" if rel else sort_name, e, is_dir))
    keyed.sort(key=lambda t: t[0])
    return keyed


def _copy_at_most(src: int, dst: int, size: int) -> int:
    """Copy up to `size` bytes from descriptor `src` to `dst` (in the kernel where it can); returns how many."""
    copied = 0
    try:
        while copied < size:
            sent = os.sendfile(dst, src, copied, min(size - copied, 1 << 30))
            if sent == 0:
                return copied
            copied += sent
        return copied
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP) or copied:
            raise
    while copied < size:  # no sendfile between these files
        chunk = memoryview(os.pread(src, min(size - copied, 1 << 20), copied))
        if not chunk:
            break
        copied += len(chunk)
        while chunk:
            chunk = chunk[os.write(dst, chunk) :]
    return copied


class LocalFileManager:
    """A checkpoint root that is a directory; accepts a plain path or a `file://` URI."""

    def __init__(self, root: str) -> None:
        if root.startswith("file:"):
            parsed = urlparse(root)
            if parsed.netloc not in ("", "localhost"):
                raise ConfigurationError(f"file URI {root!r} names host {parsed.netloc!r}; only local paths work")
            root = unquote(parsed.path)
        if not root:
            raise ConfigurationError("empty checkpoint root path")
        self._root = os.path.abspath(root)
        if os.path.exists(self._root) and not os.path.isdir(self._root):
            raise ConfigurationError(f"checkpoint root {self._root!r} exists and is not a directory")
        self._root_uri = Path(self._root).as_uri()  # once: every file's name and cache key starts with it
        self._real_root: str | None = None
        self._dirs_inside: set[str] = set()

    @property
    def root_uri(self) -> str:
        return self._root_uri

    @property
    def root_path(self) -> str:
        return self._root

    def uri_of(self, path: str) -> str:
        return f"{self.root_uri}/{path}"

    def _abs(self, path: str) -> str:
        return os.path.join(self._root, validate_relative_path(path))

    def create(self, path: str, *, exclusive: bool = True) -> _LocalOutput:
        return _LocalOutput(self, path, self._writable(path), exclusive)

    def _writable(self, path: str) -> str:
        """`path`'s absolute name, its directory created (durably) if it is inside the root with symlinks
        resolved; a directory of the root that is a symlink out of it is refused naming the file: nothing is
        written outside the root (DESIGN invariant 12)."""
        full = self._abs(path)
        if not self._inside_root(full):
            raise CorruptFileError(
                "reached through a symlink out of the checkpoint root: not written", self.uri_of(path)
            )
        makedirs_durable(os.path.dirname(full))
        return full

    def put_file(self, local_path: str, path: str, *, exclusive: bool = True) -> int:
        """Publish by hard link when `local_path` is on the same file system (no second copy and
        fsync of the bytes: the commit path's common case), else by copy.

        After a link the published file shares `local_path`'s inode: callers publish only files they
        never modify again (sealed changelogs, RocksDB's immutable SSTs) and may unlink them.
        """
        final = self._writable(path)
        directory = os.path.dirname(final)
        fd = os.open(local_path, os.O_RDONLY)
        try:
            # Only the bytes and size must be durable before the link (the directory fsync below makes the
            # link so): free when the writer synced them, as the changelog writer and RocksDB do, even after a
            # hard link (a RocksDB checkpoint's) dirtied the inode, where an fsync would commit the journal.
            getattr(os, "fdatasync", os.fsync)(fd)  # macOS has no fdatasync
            size = os.fstat(fd).st_size
            # A published file's age is its publish time (maintenance's grace periods read mtimes),
            # not the age of its source: an SST linked into a snapshot may be days old.
            os.utime(fd)
        finally:
            os.close(fd)
        try:
            fault_point("local.put_file", path)
            if exclusive:
                os.link(local_path, final)
            else:
                tmp = os.path.join(directory, temp_name_for(os.path.basename(final)))
                os.link(local_path, tmp)
                try:
                    os.replace(tmp, final)
                finally:
                    if os.path.lexists(tmp):
                        os.unlink(tmp)
        except FileExistsError:
            raise overwrite_refused(self.uri_of(path)) from None
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                raise CheckpointWriteError(self.uri_of(path), e) from e
            return self._copy_file(local_path, path, exclusive)
        fsync_dir(directory)
        return size

    def _copy_file(self, local_path: str, path: str, exclusive: bool) -> int:
        with self.create(path, exclusive=exclusive) as out, open(local_path, "rb") as src:
            assert out._file is not None
            shutil.copyfileobj(src, out._file, 1 << 20)
            return out._file.tell()

    def _open_regular(self, path: str) -> tuple[int, int]:
        """(descriptor, size) of `path` opened for reading, if it is a regular file inside the root.

        Opened without blocking and without following a symlink at its name, then checked on the open
        descriptor (no race with a rename): a FIFO, device, socket or symlink named like a checkpoint file, or
        one reached through a symlinked directory out of the root, is a `CorruptFileError` naming it, never
        read (DESIGN invariant 12).
        """
        full = self._abs(path)
        try:
            fd = os.open(full, _READ_FLAGS)
        except FileNotFoundError:
            raise file_not_found(self.uri_of(path)) from None
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EMLINK, errno.ENXIO, errno.EISDIR):
                raise CorruptFileError(
                    "not a regular file (a symlink, socket or directory)", self.uri_of(path)
                ) from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise CorruptFileError("not a regular file (a FIFO, device or directory)", self.uri_of(path))
            if not self._inside_root(full):
                raise CorruptFileError("reached through a symlink out of the checkpoint root", self.uri_of(path))
        except BaseException:
            os.close(fd)
            raise
        return fd, st.st_size

    def _inside_root(self, full: str) -> bool:
        """Whether `full`'s directory, symlinks resolved, is under the root's (resolved once). Directories
        found inside are remembered (a few thousand at most), so opening is not a path walk per file."""
        directory = os.path.dirname(full)
        if directory in self._dirs_inside:
            return True
        inside = self._resolves_inside(directory)
        if inside:
            if len(self._dirs_inside) >= _DIRS_REMEMBERED:
                self._dirs_inside.clear()
            self._dirs_inside.add(directory)
        return inside

    def _resolves_inside(self, directory: str) -> bool:
        """Whether `directory`, symlinks resolved now, is the root's or under it."""
        real_root = self._real_root
        if real_root is None:
            real_root = self._real_root = os.path.realpath(self._root)
        real_dir = os.path.realpath(directory)
        return real_dir == real_root or real_dir.startswith(real_root.rstrip("/") + "/")

    def open(self, path: str) -> BinaryIO:
        fd, _size = self._open_regular(path)
        return os.fdopen(fd, "rb")

    def read_bytes(self, path: str) -> bytes:
        """The whole file; one larger than `MAX_WHOLE_FILE` (no small file is) is refused unread."""
        fd, size = self._open_regular(path)
        with os.fdopen(fd, "rb") as f:
            if size > MAX_WHOLE_FILE:
                raise CorruptFileError(
                    f"file has {size} bytes, above the {MAX_WHOLE_FILE}-byte limit of a file read whole",
                    self.uri_of(path),
                )
            return f.read(size + 1)  # +1: a file grown since is read short, not unbounded

    def download(self, path: str, local_path: str) -> int:
        """Copy the regular file at `path` to `local_path`: at most the size it had when opened, so a copy
        is bounded however the source changes meanwhile."""
        fd, size = self._open_regular(path)
        try:
            with open(local_path, "wb") as dst:
                copied = _copy_at_most(fd, dst.fileno(), size)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(local_path)
            raise
        finally:
            os.close(fd)
        return copied

    def exists(self, path: str) -> bool:
        return os.path.isfile(self._abs(path))

    def info(self, path: str) -> FileInfo:
        try:
            st = os.stat(self._abs(path))
        except FileNotFoundError:
            raise file_not_found(self.uri_of(path)) from None
        return FileInfo(path, st.st_size, st.st_mtime)

    def list(self, prefix: str = "", *, start_after: str | None = None) -> Iterator[FileInfo]:
        validate_listing(prefix, start_after)
        fault_point("local.list", prefix)
        if "/" in prefix:
            base_rel, _, name_prefix = prefix.rpartition("/")
        else:
            base_rel, name_prefix = "", prefix
        base = os.path.join(self._root, base_rel) if base_rel else self._root
        yield from self._walk(base, base_rel, name_prefix, start_after)

    def list_with_temp_files(self, prefix: str = "", specials: Paths | None = None) -> tuple[FileInfos, FileInfos]:
        """What `list(prefix)` lists, and the temp files under `prefix` (`list_temp_files`), from one walk; the
        paths of special entries (symlinks, FIFOs, devices: never listed) are appended to `specials` if given."""
        validate_prefix(prefix)
        fault_point("local.list", prefix)
        base_rel, _, name_prefix = prefix.rpartition("/")
        base = os.path.join(self._root, base_rel) if base_rel else self._root
        temps: FileInfos = []
        published = [*self._walk(base, base_rel, name_prefix, None, temps, specials)]
        return published, temps

    def _walk(
        self,
        directory: str,
        rel: str,
        name_prefix: str,
        start_after: str | None,
        temps: FileInfos | None = None,
        specials: Paths | None = None,
    ) -> Iterator[FileInfo]:
        """Files under `directory` in key order (temp files met on the way appended to `temps` if given);
        iterative (a stack of directories), so a file is not passed up through one generator per level."""
        stack = [iter(_sorted_entries(directory, rel, name_prefix, temps, specials))]
        while stack:
            item = next(stack[-1], None)
            if item is None:
                stack.pop()
                continue
            rel_path, entry, is_dir = item
            if is_dir:
                # Prune subtrees that lie entirely at or before `start_after`.
                if start_after is not None and rel_path < start_after and not start_after.startswith(rel_path):
                    continue
                stack.append(iter(_sorted_entries(entry.path, rel_path.rstrip("/"), "", temps, specials)))
                continue
            if start_after is not None and rel_path <= start_after:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            yield FileInfo(rel_path, st.st_size, st.st_mtime)

    def list_temp_files(self, prefix: str = "") -> Iterator[FileInfo]:
        """Leftovers of writes that never published (crashed or still running) under `prefix`."""
        return iter(self.list_with_temp_files(prefix)[1])

    def delete_many(self, paths: Iterable[str]) -> DeleteResult:
        result = DeleteResult()
        touched: set[str] = set()
        inside: dict[str, bool] = {}  # resolved afresh per call, not remembered: a deletion is never followed out
        for path in validate_paths_to_delete(paths, allow_temp=True):
            full = os.path.join(self._root, path)
            fault_point("local.delete", path)
            directory = os.path.dirname(full)
            ok = inside.get(directory)
            if ok is None:
                ok = inside[directory] = self._resolves_inside(directory)
            if not ok:  # a directory of the root symlinked out of it: nothing outside goes
                result.errors[path] = "reached through a symlink out of the checkpoint root: not deleted"
                continue
            try:
                os.unlink(full)
            except FileNotFoundError:
                pass
            except OSError as e:
                result.errors[path] = f"{errno.errorcode.get(e.errno or 0, 'OSError')}: {e.strerror}"
                continue
            result.deleted.append(path)
            touched.add(os.path.dirname(full))
        for d in touched:
            if os.path.isdir(d):
                fsync_dir(d)
        return result
