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
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
"""Each directory below the root is opened from its parent's descriptor without following a symlink, so a file is
read, written or deleted in the directory it was named in, whatever is renamed or linked meanwhile."""
_DIRS_OPEN = 256
"""Directory descriptors a deletion keeps open at once (each synced once its deletions are done)."""
THROUGH_A_LINK = "reached through a symlink or non-directory, perhaps out of the checkpoint root"
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
    """A temp file beside `name` in the open `directory` (a descriptor this output owns), published under `name`."""

    def __init__(self, manager: LocalFileManager, path: str, directory: int, name: str, exclusive: bool) -> None:
        self.path = path
        self._final = name
        self._exclusive = exclusive
        self._dir = directory
        self._tmp = temp_name_for(name)
        self._tmp_left = True  # until it is published or removed
        try:
            fd = os.open(self._tmp, _CREATE_FLAGS, 0o666, dir_fd=directory)
        except BaseException:
            os.close(directory)
            raise
        self._file: BinaryIO | None = os.fdopen(fd, "wb")
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
            d = self._dir
            if self._exclusive:
                try:
                    os.link(self._tmp, self._final, src_dir_fd=d, dst_dir_fd=d)
                except FileExistsError:
                    raise overwrite_refused(self._manager.uri_of(self.path)) from None
                fault_point("local.published", self.path)
                os.unlink(self._tmp, dir_fd=d)
                self._tmp_left = False
            else:
                os.replace(self._tmp, self._final, src_dir_fd=d, dst_dir_fd=d)
                self._tmp_left = False
                fault_point("local.published", self.path)
            os.fsync(d)
        finally:  # a failed flush or fsync (ENOSPC, EIO) leaves no temp file behind either
            self._remove_temp()

    def cancel(self) -> None:
        f = self._file
        self._file = None
        if f is not None:
            with contextlib.suppress(OSError):  # its buffer may not flush (ENOSPC): it goes anyway
                f.close()
        if self._dir >= 0:
            self._remove_temp()

    def _remove_temp(self) -> None:
        try:
            if self._tmp_left:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._tmp, dir_fd=self._dir)
        finally:
            os.close(self._dir)
            self._dir = -1


def _special(rel_path: str, specials: list[str] | None) -> None:
    if specials is not None:
        specials.append(rel_path)
    else:
        log.warning("skipping %s: not a regular file or directory (a symlink, FIFO or device)", rel_path)


def _sorted_entries(
    directory: int, rel: str, name_prefix: str, temps: FileInfos | None = None, specials: list[str] | None = None
) -> list[tuple[str, os.DirEntry[str], bool]]:
    """(path relative to the root, entry, is a directory) of the open `directory`'s published entries whose name
    starts with `name_prefix`, in key order (a directory sorts as its name + "/", as S3 lists keys); the
    temp files among them are appended to `temps` if given, the special entries (never listed nor opened) to
    `specials` if given, else logged. The entries stat through `directory`: it stays open while they are used."""
    entries = list(os.scandir(directory))
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
            _special(f"{rel}/{e.name}" if rel else e.name, specials)
            continue
        sort_name = e.name + "/" if is_dir else e.name
        keyed.append((f"{rel}/{sort_name}" if rel else sort_name, e, is_dir))
    keyed.sort(key=lambda t: t[0])
    return keyed


def _entries_of(
    directory: int, rel: str, name_prefix: str, temps: FileInfos | None, specials: list[str] | None
) -> Iterator[tuple[str, os.DirEntry[str], bool]]:
    """`_sorted_entries`, `directory` closed if they fail (else the walk closes it once they are used)."""
    try:
        return iter(_sorted_entries(directory, rel, name_prefix, temps, specials))
    except BaseException:
        os.close(directory)
        raise


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

    @property
    def root_uri(self) -> str:
        return self._root_uri

    @property
    def root_path(self) -> str:
        return self._root

    def uri_of(self, path: str) -> str:
        return f"{self.root_uri}/{path}"

    def _directory(self, rel_dir: str, path: str, *, create: bool = False) -> int:
        """A descriptor of the root's directory `rel_dir` ("": the root), each directory on the way opened from
        its parent's descriptor without following a symlink (created, durably, if `create`). A symlink or a
        file on the way is a `CorruptFileError` naming `path`: nothing is read, written or deleted outside the
        root, even through a directory replaced by a symlink after a check (DESIGN invariant 12)."""
        flags = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)  # the root itself may be a symlink
        try:
            fd = os.open(self._root, flags)
        except FileNotFoundError:
            if not create:
                raise
            makedirs_durable(self._root)
            fd = os.open(self._root, flags)
        for name in rel_dir.split("/") if rel_dir else ():
            try:
                child = self._child(fd, name, path, create)
            finally:
                os.close(fd)
            fd = child
        return fd

    def _child(self, parent: int, name: str, path: str, create: bool) -> int:
        try:
            try:
                return os.open(name, _DIR_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                if not create:
                    raise
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, dir_fd=parent)
                os.fsync(parent)
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise CorruptFileError(
                    THROUGH_A_LINK + (": not written" if create else ""), self.uri_of(path)
                ) from None
            raise

    def _entry(self, path: str) -> tuple[int, str]:
        """(descriptor of `path`'s directory, its name there); FileNotFoundError naming it if a directory is missing."""
        rel_dir, _, name = validate_relative_path(path).rpartition("/")
        try:
            return self._directory(rel_dir, path), name
        except FileNotFoundError:
            raise file_not_found(self.uri_of(path)) from None

    def create(self, path: str, *, exclusive: bool = True) -> _LocalOutput:
        return _LocalOutput(self, path, *self._writable(path), exclusive)

    def _writable(self, path: str) -> tuple[int, str]:
        """(descriptor of `path`'s directory, created if missing, durably; its name there)."""
        rel_dir, _, name = validate_relative_path(path).rpartition("/")
        return self._directory(rel_dir, path, create=True), name

    def put_file(self, local_path: str, path: str, *, exclusive: bool = True) -> int:
        """Publish by hard link when `local_path` is on the same file system (no second copy and
        fsync of the bytes: the commit path's common case), else by copy.

        After a link the published file shares `local_path`'s inode: callers publish only files they
        never modify again (sealed changelogs, RocksDB's immutable SSTs) and may unlink them.
        """
        directory, name = self._writable(path)
        try:
            return self._link_or_copy(local_path, path, directory, name, exclusive)
        finally:
            os.close(directory)

    def _link_or_copy(self, local_path: str, path: str, directory: int, name: str, exclusive: bool) -> int:
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
                os.link(local_path, name, dst_dir_fd=directory)
            else:
                tmp = temp_name_for(name)
                os.link(local_path, tmp, dst_dir_fd=directory)
                try:
                    os.replace(tmp, name, src_dir_fd=directory, dst_dir_fd=directory)
                except BaseException:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp, dir_fd=directory)
                    raise
        except FileExistsError:
            raise overwrite_refused(self.uri_of(path)) from None
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                raise CheckpointWriteError(self.uri_of(path), e) from e
            return self._copy_file(local_path, path, exclusive)
        os.fsync(directory)
        return size

    def _copy_file(self, local_path: str, path: str, exclusive: bool) -> int:
        with self.create(path, exclusive=exclusive) as out, open(local_path, "rb") as src:
            assert out._file is not None
            shutil.copyfileobj(src, out._file, 1 << 20)
            return out._file.tell()

    def _open_regular(self, path: str) -> tuple[int, int]:
        """(descriptor, size) of `path` opened for reading, if it is a regular file inside the root.

        Opened in its directory's descriptor (`_directory`), without blocking and without following a symlink
        at its name, then checked on the open descriptor (no race with a rename): a FIFO, device, socket or
        symlink named like a checkpoint file, or one reached through a symlinked directory, is a
        `CorruptFileError` naming it, never read (DESIGN invariant 12).
        """
        directory, name = self._entry(path)
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=directory)
        except FileNotFoundError:
            raise file_not_found(self.uri_of(path)) from None
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EMLINK, errno.ENXIO, errno.EISDIR):
                raise CorruptFileError(
                    "not a regular file (a symlink, socket or directory)", self.uri_of(path)
                ) from None
            raise
        finally:
            os.close(directory)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise CorruptFileError("not a regular file (a FIFO, device or directory)", self.uri_of(path))
        except BaseException:
            os.close(fd)
            raise
        return fd, st.st_size

    def _lstat(self, path: str) -> os.stat_result:
        directory, name = self._entry(path)
        try:
            return os.stat(name, dir_fd=directory, follow_symlinks=False)
        except FileNotFoundError:
            raise file_not_found(self.uri_of(path)) from None
        finally:
            os.close(directory)

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
        """Whether `path` is a regular file (one reached through a symlink is not)."""
        try:
            return stat.S_ISREG(self._lstat(path).st_mode)
        except (FileNotFoundError, CorruptFileError):
            return False

    def info(self, path: str) -> FileInfo:
        st = self._lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise CorruptFileError("not a regular file (a symlink, FIFO, device or directory)", self.uri_of(path))
        return FileInfo(path, st.st_size, st.st_mtime)

    def list(self, prefix: str = "", *, start_after: str | None = None) -> Iterator[FileInfo]:
        validate_listing(prefix, start_after)
        fault_point("local.list", prefix)
        if "/" in prefix:
            base_rel, _, name_prefix = prefix.rpartition("/")
        else:
            base_rel, name_prefix = "", prefix
        yield from self._walk(base_rel, name_prefix, start_after)

    def list_with_temp_files(self, prefix: str = "", specials: Paths | None = None) -> tuple[FileInfos, FileInfos]:
        """What `list(prefix)` lists, and the temp files under `prefix` (`list_temp_files`), from one walk; the
        paths of special entries (symlinks, FIFOs, devices: never listed) are appended to `specials` if given."""
        validate_prefix(prefix)
        fault_point("local.list", prefix)
        base_rel, _, name_prefix = prefix.rpartition("/")
        temps: FileInfos = []
        published = [*self._walk(base_rel, name_prefix, None, temps, specials)]
        return published, temps

    def _walk(
        self,
        rel: str,
        name_prefix: str,
        start_after: str | None,
        temps: FileInfos | None = None,
        specials: Paths | None = None,
    ) -> Iterator[FileInfo]:
        """Files under the root's directory `rel` in key order (temp files met on the way appended to `temps` if
        given); iterative (a stack of open directories, each opened from its parent's descriptor without following
        a symlink, as `_directory` does), so a file is not passed up through one generator per level."""
        try:
            top = self._directory(rel, rel)
        except (FileNotFoundError, NotADirectoryError):
            return
        except CorruptFileError:  # reached through a symlink: nothing under it is listed
            _special(rel, specials)
            return
        stack = [(_entries_of(top, rel, name_prefix, temps, specials), top)]
        try:
            while stack:
                entries, directory = stack[-1]
                item = next(entries, None)
                if item is None:
                    stack.pop()
                    os.close(directory)
                    continue
                rel_path, entry, is_dir = item
                if is_dir:
                    # Prune subtrees that lie entirely at or before `start_after`.
                    if start_after is not None and rel_path < start_after and not start_after.startswith(rel_path):
                        continue
                    try:
                        child = self._child(directory, entry.name, rel_path, False)
                    except FileNotFoundError:
                        continue
                    except CorruptFileError:  # replaced by a symlink or a file since it was listed
                        _special(rel_path.rstrip("/"), specials)
                        continue
                    stack.append((_entries_of(child, rel_path.rstrip("/"), "", temps, specials), child))
                    continue
                if start_after is not None and rel_path <= start_after:
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                yield FileInfo(rel_path, st.st_size, st.st_mtime)
        finally:
            for _, directory in stack:
                os.close(directory)

    def list_temp_files(self, prefix: str = "") -> Iterator[FileInfo]:
        """Leftovers of writes that never published (crashed or still running) under `prefix`."""
        return iter(self.list_with_temp_files(prefix)[1])

    def delete_many(self, paths: Iterable[str]) -> DeleteResult:
        """Each file unlinked in its directory's descriptor (`_directory`: nothing outside the root goes, even
        through a directory replaced by a symlink meanwhile); each directory synced once its deletions are done."""
        result = DeleteResult()
        dirs: dict[str, int | str | None] = {}  # directory -> descriptor, why it is refused, or None: missing
        touched: set[str] = set()
        try:
            for path in validate_paths_to_delete(paths, allow_temp=True):
                fault_point("local.delete", path)
                rel_dir, _, name = path.rpartition("/")
                if rel_dir not in dirs:
                    if len(dirs) >= _DIRS_OPEN:
                        _sync_and_close(dirs, touched)
                    dirs[rel_dir] = self._deletable(rel_dir, path)
                directory = dirs[rel_dir]
                if isinstance(directory, str):
                    result.errors[path] = directory
                    continue
                if directory is not None:
                    try:
                        os.unlink(name, dir_fd=directory)
                    except FileNotFoundError:
                        pass
                    except OSError as e:
                        result.errors[path] = _os_error(e)
                        continue
                    touched.add(rel_dir)
                result.deleted.append(path)
        finally:
            _sync_and_close(dirs, touched)
        return result

    def _deletable(self, rel_dir: str, path: str) -> int | str | None:
        """`_directory(rel_dir)`, or why nothing in it can be deleted, or None if it does not exist."""
        try:
            return self._directory(rel_dir, path)
        except FileNotFoundError:
            return None
        except CorruptFileError:
            return f"{THROUGH_A_LINK}: not deleted"
        except OSError as e:
            return _os_error(e)


def _os_error(e: OSError) -> str:
    return f"{errno.errorcode.get(e.errno or 0, 'OSError')}: {e.strerror}"


def _sync_and_close(dirs: dict[str, int | str | None], touched: set[str]) -> None:
    """fsync the directories deletions changed and close every descriptor (all of them, whatever fails), then
    forget them; the first failed fsync is raised."""
    failed: list[OSError] = []
    for rel_dir, directory in dirs.items():
        if isinstance(directory, int):
            try:
                if rel_dir in touched:
                    os.fsync(directory)
            except OSError as e:
                failed.append(e)
            finally:
                os.close(directory)
    dirs.clear()
    touched.clear()
    if failed:
        raise failed[0]
