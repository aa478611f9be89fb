"""A checkpoint that stays bounded: a writer commits hundreds of batches while the maintenance loop runs
beside it, and at every sample the root holds at most what the rules allow.

Bound per store, with N = min_versions_to_retain and T = snapshot_threshold:

- changelogs <= N + T + 2 M + 2, where the margin M is the number of versions the writer committed in
  the last two maintenance rounds plus the load grace (what maintenance cannot have seen yet, or
  may not expire yet) and 2 M covers losing attempts of those versions younger than the orphan grace;
- manifests <= 3 + M / T (the base, the newest, those younger than the load grace);
- bytes <= changelog bound x the largest changelog + manifest bound x the largest snapshot (a manifest
  and its SSTs; SSTs are shared between snapshots, so usually much less).

Root: commit records <= N + T + 2 M + 2 (from the floor on). The writer (tests/maintenance/writer_proc.py)
restarts every few batches and checks every state it rebuilds from what maintenance left.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from statekeeper.maintenance.expiry import expire_versions
from statekeeper.maintenance.inventory import Inventory, StoreFiles
from statekeeper.maintenance.orphans import clean_orphans
from statekeeper.maintenance.replica_pool import close_replicas
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_builds import create_snapshots
from statekeeper.maintenance.verify import verify_root
from statekeeper.store.files import open_file_manager
from tests.maintenance import writer_proc

N, T, GRACE = 3, 4, 1.0


@dataclass
class Sample:
    at: float
    latest: int
    files: int
    bytes: int
    max_changelogs: int
    margin: int


def _snapshot_bytes(files: StoreFiles) -> int:
    sizes = [files.manifests[k].size + sum(s.size for s in m.sst_files) for k, m in files.manifest_data.items()]
    return max(sizes, default=0)


class Bounds:
    """Samples the root and checks the bound (module docstring) at every sample."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.history: list[tuple[float, int]] = [(time.monotonic(), 0)]
        self.round_seconds = 0.0
        self.max_changelog = 0
        self.max_snapshot = 0
        self.samples: list[Sample] = []

    def latest_at(self, t: float) -> int:
        return max((v for at, v in self.history if at <= t), default=0)

    def sample(self) -> Sample:
        now = time.monotonic()
        inv = Inventory.scan(open_file_manager(self.root))
        self.history.append((now, inv.latest))
        window = 2 * self.round_seconds + GRACE
        margin = inv.latest - self.latest_at(now - window)
        changelog_bound = N + T + 2 * margin + 2
        worst = 0
        for store in inv.store_ids():
            files = inv.files_of(store)
            self.max_changelog = max([self.max_changelog, *(e.size for e in files.changelogs.values())])
            self.max_snapshot = max(self.max_snapshot, _snapshot_bytes(files))
            n = len(files.changelogs)
            worst = max(worst, n)
            size = sum(e.size for e in files.entries())
            where = f"store {store} at version {inv.latest} (margin {margin})"
            assert n <= changelog_bound, f"{where}: {n} changelogs > {changelog_bound}"
            manifest_bound = 3 + margin // T
            assert len(files.manifests) <= manifest_bound, f"{where}: {len(files.manifests)} manifests"
            byte_bound = changelog_bound * self.max_changelog + manifest_bound * self.max_snapshot
            assert size <= byte_bound, f"{where}: {size} bytes > {byte_bound}"
        assert len(inv.commit_files) <= changelog_bound, f"{len(inv.commit_files)} commit records > {changelog_bound}"
        entries = list(inv.all_entries())
        s = Sample(now, inv.latest, len(entries), sum(e.size for e in entries), worst, margin)
        self.samples.append(s)
        return s


@pytest.mark.parametrize(
    "batches", [pytest.param(60, id="short"), pytest.param(400, id="long", marks=pytest.mark.slow)]
)
def test_a_checkpoint_stays_bounded_while_maintenance_runs_beside_the_writer(tmp_path: Path, batches: int) -> None:
    root = (tmp_path / "ckpt" / uuid.uuid4().hex[:8]).as_uri()
    os.makedirs(tmp_path / "ckpt", exist_ok=True)
    out = tmp_path / "writer.json"
    writer = writer_proc.spawn(root, batches, out, 0.05)
    settings = MaintenanceSettings(
        snapshot_threshold=T,
        min_versions_to_retain=N,
        orphan_grace_seconds=GRACE,
        load_grace_seconds=GRACE,
        parallelism=2,
        work_dir=str(tmp_path / "work"),
    )
    bounds = Bounds(root)
    fm = open_file_manager(root)
    try:
        while writer.poll() is None:
            if not (tmp_path / "ckpt" / root.rsplit("/", 1)[1] / "commits").exists():
                time.sleep(0.1)  # the job has not committed its first batch yet
                continue
            t0 = time.monotonic()
            for report in (create_snapshots(fm, settings), expire_versions(fm, settings)):
                assert report.ok, report.errors
            bounds.sample()  # mid-round: snapshots and expiry done, orphans not yet
            assert clean_orphans(fm, settings).ok
            bounds.round_seconds = max(bounds.round_seconds, time.monotonic() - t0)
            bounds.sample()
            time.sleep(0.1)  # a maintainer polls; it does not spin
    finally:
        if writer.poll() is None:
            writer.kill()
        _, err = writer.communicate(timeout=60)
        close_replicas()
    assert writer.returncode == 0, err
    assert json.loads(out.read_text())["rebuilds"] > 0
    assert len(bounds.samples) >= 6, bounds.samples
    # Settled (no writer, no grace left): exactly the retained versions' chains and the commit records they need.
    # The snapshots come first: one built now (the writer's last versions, when the loop above did not get to
    # them) becomes the expiry base only after the load grace.
    assert create_snapshots(fm, settings).ok
    time.sleep(GRACE)
    assert expire_versions(fm, settings).ok
    assert clean_orphans(fm, settings).ok and verify_root(fm, settings).ok
    final = bounds.sample()
    assert final.latest == batches and final.max_changelogs <= N - 1 + T, final
    print(
        f"{len(bounds.samples)} samples over {batches} batches: max files {max(s.files for s in bounds.samples)}, "
        f"max bytes {max(s.bytes for s in bounds.samples)}, max changelogs/store "
        f"{max(s.max_changelogs for s in bounds.samples)}, max margin {max(s.margin for s in bounds.samples)}"
    )
