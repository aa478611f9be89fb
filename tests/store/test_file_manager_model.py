"""The local checkpoint file manager against a dict model, with disk faults (DESIGN invariants 1, 2, 7).

A hypothesis state machine creates (exclusive, replacing, in pieces), publishes local files,
cancels, deletes and lists, and injects ENOSPC and EIO through the fault seam (`statekeeper.store.faults`) at
each step of a write: before a piece is written, before the fsync, before the publish. After every
step the files under the root are exactly the model's, byte for byte, and no temp file is left. A
failed write raises `CheckpointWriteError` naming the file and carrying the errno, and changes
nothing visible. Steps are cheap (local disk only), so this machine carries most of the default
run's model-based steps (`tests/model_steps.py`).
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from statekeeper.store import faults
from statekeeper.store.errors import CheckpointFileExistsError, CheckpointWriteError
from statekeeper.store.files import LocalFileManager
from tests.model_steps import INJECTED, CountedSteps, scaled

NAMES = st.sampled_from([f"{d}/{n}" for d in ("a", "a/b", "c") for n in ("f1", "f2", "f3.bin")])
DATA = st.binary(max_size=300)
WRITE_POINTS = ("local.write", "local.fsync", "local.publish")
FAULTS = {"ENOSPC": errno.ENOSPC, "EIO": errno.EIO}


@contextmanager
def failing(point: str, code: int) -> Iterator[None]:
    """The next time `point` is reached, fail as the kernel does: an OSError without a file name."""

    def hook(reached: str, subject: str) -> None:
        if reached == point:
            faults.arm(None)
            raise OSError(code, os.strerror(code))

    previous = faults.arm(hook)
    try:
        yield
    finally:
        faults.arm(previous)


class FileManagerMachine(CountedSteps, RuleBasedStateMachine):
    model_name = "file manager"

    @initialize()
    def setup(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="sk-fm-model-")
        self.fm = LocalFileManager(os.path.join(self.dir, "root"))
        self.model: dict[str, bytes] = {}

    def teardown(self) -> None:
        faults.arm(None)
        shutil.rmtree(getattr(self, "dir", ""), ignore_errors=True)

    def _write(self, path: str, data: bytes, exclusive: bool, pieces: int) -> None:
        with self.fm.create(path, exclusive=exclusive) as out:
            step = max(1, len(data) // pieces)
            for i in range(0, len(data), step):
                out.write(data[i : i + step])

    @rule(path=NAMES, data=DATA, exclusive=st.booleans(), pieces=st.integers(1, 4))
    def create(self, path: str, data: bytes, exclusive: bool, pieces: int) -> None:
        if exclusive and path in self.model:
            with pytest.raises(CheckpointFileExistsError):
                self._write(path, data, exclusive, pieces)
            return
        self._write(path, data, exclusive, pieces)
        self.model[path] = data

    @rule(path=NAMES, data=DATA)
    def put_file(self, path: str, data: bytes) -> None:
        local = os.path.join(self.dir, f"src-{len(os.listdir(self.dir))}")
        with open(local, "wb") as f:
            f.write(data)
        if path in self.model:
            with pytest.raises(CheckpointFileExistsError):
                self.fm.put_file(local, path)
            return
        assert self.fm.put_file(local, path) == len(data)
        self.model[path] = data

    @rule(path=NAMES, data=DATA)
    def cancel(self, path: str, data: bytes) -> None:
        with pytest.raises(RuntimeError), self.fm.create(path, exclusive=False) as out:
            out.write(data)
            raise RuntimeError("the writer gives up")

    @rule(
        path=NAMES,
        data=st.binary(min_size=1, max_size=300),
        exclusive=st.booleans(),
        point=st.sampled_from(WRITE_POINTS),
        fault=st.sampled_from(sorted(FAULTS)),
    )
    def write_fails(self, path: str, data: bytes, exclusive: bool, point: str, fault: str) -> None:
        if exclusive and path in self.model:
            return
        with failing(point, FAULTS[fault]), pytest.raises(CheckpointWriteError) as raised:
            self._write(path, data, exclusive, 2)
        assert raised.value.errno == FAULTS[fault]
        assert path in str(raised.value), f"the error does not name the file: {raised.value}"
        INJECTED[fault] += 1

    @rule(paths=st.lists(NAMES, max_size=4))
    def delete(self, paths: list[str]) -> None:
        result = self.fm.delete_many(paths)
        assert not result.errors
        for p in paths:
            self.model.pop(p, None)

    @rule(prefix=st.sampled_from(["", "a", "a/", "a/b/", "c/f"]), start_after=st.none() | NAMES)
    def listing(self, prefix: str, start_after: str | None) -> None:
        got = [i.path for i in self.fm.list(prefix, start_after=start_after)]
        want = sorted(p for p in self.model if p.startswith(prefix) and (start_after is None or p > start_after))
        assert got == want

    @invariant()
    def files_are_the_model(self) -> None:
        if not hasattr(self, "fm"):
            return
        assert {i.path: i.size for i in self.fm.list()} == {p: len(d) for p, d in self.model.items()}
        for p, d in self.model.items():
            assert self.fm.read_bytes(p) == d
        assert list(self.fm.list_temp_files()) == [], "a failed or cancelled write left a temp file"


def test_file_manager_matches_model_under_disk_faults() -> None:
    FileManagerMachine.TestCase.settings = settings(
        max_examples=scaled(180),
        stateful_step_count=50,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    before = dict(INJECTED)
    FileManagerMachine.TestCase().runTest()
    assert all(INJECTED.get(k, 0) > before.get(k, 0) for k in FAULTS), "both ENOSPC and EIO were injected"
