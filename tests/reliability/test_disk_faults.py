"""ENOSPC and EIO on local writes during commit, snapshot and catalog work (DESIGN invariants 1, 3, 7).

The fault seam (`store/faults.py`) raises the error the kernel would (an `OSError` with no file name)
at a chosen point of a real run on a local checkpoint root. Each time: the error names the file, the
attempt is aborted, nothing partial is visible (no temp file, no new name under the root), the
previous committed version still loads with exactly its state, and a retry once the disk is healthy
again succeeds. (The file manager alone is covered step by step in
`tests/store/test_file_manager_model.py`.)
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from statekeeper.maintenance.replica_pool import close_replicas
from statekeeper.maintenance.snapshot_builds import create_snapshots
from statekeeper.store import CommitLog, StateStore, faults
from statekeeper.store.errors import CheckpointWriteError
from statekeeper.store.files import LocalFileManager, open_file_manager
from tests.model_steps import INJECTED
from tests.reliability.scenarios import (
    OPERATOR,
    SCENARIOS,
    check,
    expected_state,
    settings,
    store_config,
    write_batches,
)

CODES = [pytest.param(errno.ENOSPC, id="ENOSPC"), pytest.param(errno.EIO, id="EIO")]


@contextmanager
def disk_fails(point: str, code: int) -> Iterator[list[str]]:
    """Every write reaching `point` fails with `code` while the block runs; yields what failed."""
    failed: list[str] = []

    def hook(reached: str, subject: str) -> None:
        if reached == point:
            failed.append(subject)
            INJECTED[errno.errorcode[code]] += 1
            raise OSError(code, os.strerror(code))

    previous = faults.arm(hook)
    try:
        yield failed
    finally:
        faults.arm(previous)


def listing(root: Path) -> list[str]:
    fm = LocalFileManager(str(root))
    assert list(fm.list_temp_files()) == [], "a failed write left a temp file"
    return [i.path for i in fm.list()]


@pytest.mark.parametrize("code", CODES)
def test_commit_on_a_failing_disk_aborts_and_the_previous_version_loads(tmp_path: Path, code: int) -> None:
    root, work = tmp_path / "root", str(tmp_path / "work")
    write_batches(str(root), work, 3)
    before = listing(root)
    store = StateStore(str(root), OPERATOR, 0, config=store_config(work, "failing"))
    try:
        store.load(3)
        store.put(b"new", b"value")
        with disk_fails("local.put_file", code) as failed, pytest.raises(CheckpointWriteError) as raised:
            store.commit()
        assert failed and failed[0] in str(raised.value), f"the error does not name the file: {raised.value}"
        assert raised.value.errno == code
        assert listing(root) == before, "a failed commit published something"
        assert CommitLog(LocalFileManager(str(root))).latest() == 3
        store.load(3)  # the local DB held the failed batch's updates: rebuilt from the checkpoint
        assert tuple(store.items()) == expected_state(0, 3)
    finally:
        store.close()
    assert write_batches(str(root), work, 1) == 4  # the disk is healthy again: the next batch commits
    assert check(str(root), work, SCENARIOS["commit"], 4) == []


@pytest.mark.parametrize("point", ["local.put_file", "local.publish", "local.write"])
@pytest.mark.parametrize("code", CODES)
def test_snapshot_on_a_failing_disk_leaves_nothing_partial(tmp_path: Path, point: str, code: int) -> None:
    root, work = tmp_path / "root", str(tmp_path / "work")
    write_batches(str(root), work, 4)
    before = listing(root)
    try:
        with disk_fails(point, code) as failed:
            report = create_snapshots(open_file_manager(str(root)), settings(work))
        assert failed, f"the snapshot never reached {point}"
        assert not report.ok and any(failed[0] in e for e in report.errors), report.errors
        assert not [p for p in listing(root) if p not in before and p.endswith(".manifest")], "a manifest published"
        assert check(str(root), work, SCENARIOS["snapshot"], 4) == []
        # healthy again: the snapshot is written
        assert create_snapshots(open_file_manager(str(root)), settings(work)).ok
        assert check(str(root), work, SCENARIOS["snapshot"], 4) == []
    finally:
        close_replicas()
