"""SSTs verified by one maintenance process are not downloaded and hashed again by the next one.

Each maintenance run (a Dagster run) is a new process: they run here as real subprocesses, one after
the other, on one work directory. The second hashes no SST; an SST damaged afterwards (its
modification time changes, as any rewrite's does) is hashed again and found corrupt.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_builds import create_snapshots
from statekeeper.maintenance.snapshot_checks import VERIFIED_DIR, VerifiedSsts, checksum_problem
from statekeeper.store.formats.snapshot import SnapshotManifest
from tests.maintenance.helpers import History, clobber

REPO = Path(__file__).resolve().parents[2]

MAINTAINER = """
import json, sys
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_builds import create_snapshots
from statekeeper.maintenance.snapshot_checks import ssts_hashed
from statekeeper.store.files import open_file_manager

root, settings = sys.argv[1], MaintenanceSettings(**json.loads(sys.argv[2]))
report = create_snapshots(open_file_manager(root), settings)
print(json.dumps({"hashed": ssts_hashed(), "snapshots": report.snapshots, "errors": report.errors}))
"""


def _maintainer_process(root: str, settings: MaintenanceSettings) -> dict[str, Any]:
    given = {
        "snapshot_threshold": settings.snapshot_threshold,
        "min_versions_to_retain": settings.min_versions_to_retain,
        "lease_ttl_seconds": settings.lease_ttl_seconds,
        "work_dir": settings.work_dir,
    }
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", MAINTAINER, root, json.dumps(given)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_second_process_hashes_no_sst_and_a_rewritten_one_is_checked_again(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    h = make_local_history(operators={"agg": 1}, keys=300)
    h.batches(5)
    assert create_snapshots(h.fm, settings).snapshots == 1  # at version 5, written by this process
    h.batches(2)  # chain 2: below the threshold, so only a bad snapshot makes a run write one

    first = _maintainer_process(h.root, settings)
    assert first["hashed"] >= 1 and first["snapshots"] == 0, first
    assert settings.work_dir is not None and (Path(settings.work_dir) / VERIFIED_DIR).is_dir()
    second = _maintainer_process(h.root, settings)
    assert second == {"hashed": 0, "snapshots": 0, "errors": []}

    store = h.stores[0]
    files = Inventory.scan(h.fm, use_cache=False).files_of(store)
    manifest = SnapshotManifest.from_bytes(h.fm.read_bytes(files.manifests[max(files.manifests)].path), "manifest")
    sst = store.sst(max(manifest.sst_files, key=lambda f: f.size).remote_name)
    raw = bytearray(h.fm.read_bytes(sst))
    raw[len(raw) // 2] ^= 0x10
    clobber(h.root, sst, bytes(raw))  # same size, new modification time
    full = os.path.join(str(h.fm.root_path), sst)  # type: ignore[attr-defined]
    os.utime(full, (os.stat(full).st_atime, os.stat(full).st_mtime + 5))  # a coarse clock still sees a change

    third = _maintainer_process(h.root, settings)
    assert third["hashed"] >= 1 and third["snapshots"] == 1, third  # the repair: a fresh snapshot at once


def test_the_verified_file_keeps_only_the_ssts_of_listed_snapshots(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    """Entries of SSTs no listed snapshot names any more (expiry deleted them) leave the file when a check
    saves it: the file stays as large as the store's snapshots, not as every SST the store ever had."""
    h = make_local_history(operators={"agg": 1}, keys=300)
    h.batches(settings.snapshot_threshold + 1)
    assert create_snapshots(h.fm, settings).snapshots == 1
    assert _maintainer_process(h.root, settings)["errors"] == []  # another process verified its SSTs
    store = h.stores[0]
    manifest = next(iter(Inventory.scan(h.fm, use_cache=False).files_of(store).manifest_data.values()))
    names = {sst.remote_name for sst in manifest.sst_files}
    path = VerifiedSsts(settings.work_dir or "", h.fm.root_uri, store).path
    assert set(json.loads(Path(path).read_text())["ssts"]) == names
    kept = min(names)
    assert checksum_problem(h.fm, store, manifest, work_dir=settings.work_dir, referenced={kept}) is None
    assert set(json.loads(Path(path).read_text())["ssts"]) == {kept}


def test_an_unreadable_verified_file_is_ignored_and_its_ssts_hashed_again(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    """The file is maintenance's own cache in its work directory, read as untrusted all the same: garbage or JSON
    nested past the parser's recursion is a cache miss (every SST hashed again), never a failed check."""
    h = make_local_history(operators={"agg": 1}, keys=300)
    h.batches(settings.snapshot_threshold + 1)
    assert create_snapshots(h.fm, settings).snapshots == 1
    store = h.stores[0]
    manifest = next(iter(Inventory.scan(h.fm, use_cache=False).files_of(store).manifest_data.values()))
    path = VerifiedSsts(settings.work_dir or "", h.fm.root_uri, store).path
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    for broken in ("{not json", "[" * 100_000, '{"ssts": ' * 5000 + "{}" + "}" * 5000):
        Path(path).write_text(broken)
        assert VerifiedSsts(settings.work_dir or "", h.fm.root_uri, store).entries == {}
        assert checksum_problem(h.fm, store, manifest, work_dir=settings.work_dir) is None
