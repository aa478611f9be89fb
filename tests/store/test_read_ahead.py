"""`ReadAhead`: a run of checkpoint files read in order while the next few are fetched, on every backend."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import BinaryIO

import pytest

from statekeeper.store.errors import CheckpointFileNotFoundError
from statekeeper.store.files import CheckpointFileManager, open_file_manager
from statekeeper.store.files.read_ahead import READ_AHEAD, ReadAhead


def _publish(fm: CheckpointFileManager, n: int) -> list[str]:
    paths = [f"state/op/00000/changelogs/{v:020d}_x.changelog" for v in range(1, n + 1)]
    for i, path in enumerate(paths):
        with fm.create(path) as out:
            out.write(b"%d:" % i + os.urandom(64 << 10))
    return paths


class _CountingOpens:
    """The real file manager, counting `open` calls (what `ReadAhead` has put in flight)."""

    def __init__(self, fm: CheckpointFileManager) -> None:
        self._fm, self.opened, self._lock = fm, 0, threading.Lock()

    def open(self, path: str) -> BinaryIO:
        with self._lock:
            self.opened += 1
        return self._fm.open(path)

    def __getattr__(self, name: str) -> object:
        return getattr(self._fm, name)


@pytest.mark.parametrize("depth", [0, 3])
def test_files_come_in_order_with_their_content_and_a_few_fetched_ahead(
    checkpoint_root: str, tmp_path: Path, depth: int
) -> None:
    fm = open_file_manager(checkpoint_root)
    paths = _publish(fm, 12)
    counting = _CountingOpens(fm)
    with ReadAhead(counting, paths, str(tmp_path), depth) as files:  # type: ignore[arg-type]
        for i, f in enumerate(files):
            if i == 0:  # while the first is read, the next `depth` are in flight and no more
                deadline = time.monotonic() + 10
                while counting.opened < depth + 1 and time.monotonic() < deadline:
                    time.sleep(0.01)
                time.sleep(0.05)
                assert counting.opened == depth + 1
            with f:
                assert f.seekable()
                assert f.read(8).startswith(b"%d:" % i)
                f.seek(0)
                assert f.read() == fm.read_bytes(paths[i])
    assert counting.opened == len(paths)


def test_a_missing_file_fails_at_its_turn_naming_it_and_the_rest_are_dropped(
    checkpoint_root: str, tmp_path: Path
) -> None:
    fm = open_file_manager(checkpoint_root)
    paths = _publish(fm, 8)
    fm.delete_many([paths[3]])
    taken = []
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(CheckpointFileNotFoundError, match=paths[3]), ReadAhead(fm, paths, str(tmp_path)) as files:
        for f in files:
            with f:
                taken.append(f.read(2))
    assert taken == [b"0:", b"1:", b"2:"]
    if checkpoint_root.startswith("file:"):  # local files hold descriptors (S3's pool keeps its connections)
        deadline = time.monotonic() + 10  # the files fetched past the failure are closed as their fetches end
        while len(os.listdir("/proc/self/fd")) > fds and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(os.listdir("/proc/self/fd")) <= fds


def test_a_forked_child_reads_ahead_with_its_own_threads(tmp_path: Path) -> None:
    """A child forked after the parent read ahead (as Spark's daemon forks its Python workers) inherits the pool
    object but none of its threads: the child must get a fresh pool, not queue work for threads it lacks."""
    fm = open_file_manager(tmp_path.as_uri())
    paths = _publish(fm, 12)

    def read_all(depth: int = READ_AHEAD) -> list[bytes]:
        with ReadAhead(fm, paths, str(tmp_path), depth) as files:
            return [f.read() for f in files]

    expected = [fm.read_bytes(p) for p in paths]
    assert read_all(depth=len(paths)) == expected  # every thread of the parent's pool now exists, idle
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if it read everything
        os._exit(0 if read_all() == expected else 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung reading ahead")
