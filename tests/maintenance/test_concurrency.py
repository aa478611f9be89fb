"""Maintenance in this process while a streaming job commits in another: the job never breaks (it
checks every state it rebuilds from the checkpoint) and every retained version stays loadable."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from statekeeper.maintenance.expiry import expire_versions
from statekeeper.maintenance.orphans import clean_orphans
from statekeeper.maintenance.replica_pool import close_replicas
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_builds import create_snapshots
from statekeeper.maintenance.verify import verify_root
from statekeeper.store import StateStore, StoreConfig
from statekeeper.store.errors import ConfigurationError
from statekeeper.store.files import open_file_manager
from tests.maintenance import writer_proc
from tests.maintenance.helpers import content, scripted_state


@pytest.mark.parametrize(
    ("batches", "orphan_grace", "load_grace"),
    [
        pytest.param(24, 6.0, 6.0, id="fast"),
        # the default orphan grace (1 h): the base still moves, held back only by the load grace
        pytest.param(24, 3600.0, 3.0, id="default-orphan-grace"),
        # the default load grace (0): a snapshot is the base at once; a load that loses a file to
        # expiry (the writer's rebuilds, the losing attempts) starts over from the newer snapshot
        pytest.param(24, 6.0, 0.0, id="default-load-grace"),
        pytest.param(150, 6.0, 6.0, id="long", marks=pytest.mark.slow),
    ],
)
def test_maintenance_while_a_writer_commits(
    checkpoint_root: str, tmp_path: Path, batches: int, orphan_grace: float, load_grace: float
) -> None:
    root = f"{checkpoint_root.rstrip('/')}/{uuid.uuid4().hex[:10]}"
    out = tmp_path / "writer.json"
    writer = writer_proc.spawn(root, batches, out, 0.25)
    # The orphan grace must outlast the writer's slowest write; a few seconds do here.
    settings = MaintenanceSettings(
        snapshot_threshold=3,
        min_versions_to_retain=2,
        orphan_grace_seconds=orphan_grace,
        load_grace_seconds=load_grace,
        parallelism=2,
        work_dir=str(tmp_path / "work"),
    )
    rounds = snapshots = deleted = expired = 0
    fm = open_file_manager(root)
    try:
        while writer.poll() is None:
            try:
                s = create_snapshots(fm, settings)
                e = expire_versions(fm, settings)
                o = clean_orphans(fm, settings)
            except ConfigurationError as err:
                if "does not exist" in str(err) or "does not look like" in str(err):
                    time.sleep(0.2)  # the job has not written its first file yet
                    continue
                raise
            for r in (s, e, o):
                assert r.ok, r.errors
            rounds += 1
            snapshots += s.snapshots
            deleted += e.files + o.files
            expired += e.changelogs
    finally:
        if writer.poll() is None:
            writer.kill()
        _, writer_err = writer.communicate(timeout=60)
    assert writer.returncode == 0, writer_err
    assert rounds >= 3 and snapshots > 0 and deleted > 0, (rounds, snapshots, deleted)
    if orphan_grace > 60:
        assert expired > 0, "expiry must not wait for the orphan grace"
    ids = json.loads(out.read_text())["ids"]

    settle = MaintenanceSettings(**{**settings.to_json(), "orphan_grace_seconds": 0, "load_grace_seconds": 0})
    assert expire_versions(fm, settle).ok and clean_orphans(fm, settle).ok
    assert verify_root(fm, settle, rebuild=True).ok
    latest = len(ids) - 1
    for p in range(2):
        probe = StateStore(fm, "agg", p, config=StoreConfig(local_dir=str(tmp_path / f"probe{p}")))
        try:
            for v in range(latest - settle.min_versions_to_retain + 1, latest + 1):
                probe.load(v, ids[v][p])
                assert content(probe) == scripted_state(p, v), f"version {v} of partition {p}"
                probe.abort()
        finally:
            probe.close()
    close_replicas()
