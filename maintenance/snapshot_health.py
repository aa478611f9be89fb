"""Is a store's snapshot sound? What snapshot repair (DESIGN invariant 10) asks of maintenance.

A load repairs around an unreadable snapshot by replaying from an older base, so maintenance must
(1) notice the bad snapshot, (2) write a fresh one at the next snapshot run, even below the chain
threshold, and (3) never move the expiry base onto a bad snapshot, which would delete the changelogs
the repair replays. The plan (`statekeeper.maintenance.plan`) sees structural damage from the inventory (an
unreadable manifest, a missing or resized SST); a bit flip inside an SST shows only in its SHA-256,
which this module checks by downloading the SST. SST names derive from their content, so an SST
checked once in this process (or uploaded by it) is not downloaded again: checking a new snapshot
costs its new SSTs. (A copy damaged after this process checked it is noticed by `verify`, which
always reads the bytes, and by the next maintainer process.)
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading

from statekeeper.maintenance.plan import StorePlan
from statekeeper.store.errors import StatekeeperError
from statekeeper.store.files import CheckpointFileManager
from statekeeper.store.formats.snapshot import SnapshotManifest
from statekeeper.store.layout import StoreId
from statekeeper.store.snapshot import file_sha256

_sound_lock = threading.Lock()
_sound: set[tuple[str, str, str]] = set()
"""(root, store, SST name) whose content matched its checksum in this process."""
_corrupt: set[tuple[str, str, str]] = set()
"""(root, store, SST name) whose content did not match (a fresh snapshot must not reuse them)."""


def forget() -> None:
    """Drop what this process learnt about SST contents (as a new maintainer process starts)."""
    with _sound_lock:
        _sound.clear()
        _corrupt.clear()


def corrupt_ssts(root: str, store: StoreId) -> frozenset[str]:
    """SST names of `store` found corrupt in this process."""
    with _sound_lock:
        return frozenset(name for r, s, name in _corrupt if r == root and s == str(store))


def mark_sound(root: str, store: StoreId, manifest: SnapshotManifest) -> None:
    """Record the SSTs of a snapshot this process just wrote from local files it hashed."""
    with _sound_lock:
        _sound.update((root, str(store), s.remote_name) for s in manifest.sst_files)


def checksum_problem(fm: CheckpointFileManager, store: StoreId, manifest: SnapshotManifest) -> str | None:
    """Why the snapshot's SSTs do not match the manifest's checksums (None: they all match)."""
    root = fm.root_uri
    for sst in manifest.sst_files:
        key = (root, str(store), sst.remote_name)
        with _sound_lock:
            if key in _sound:
                continue
        path = store.sst(sst.remote_name)
        fd, tmp = tempfile.mkstemp(prefix="statekeeper-sst-")
        os.close(fd)
        try:
            size = fm.download(path, tmp)
            digest = file_sha256(tmp)
        except (StatekeeperError, OSError) as e:
            return f"SST {root}/{path} cannot be read: {e}"
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if size != sst.size or digest != sst.sha256:
            with _sound_lock:
                _corrupt.add(key)
            return f"SST {root}/{path} does not match the checksum in its snapshot manifest"
        with _sound_lock:
            _sound.add(key)
    return None


def base_problem(
    fm: CheckpointFileManager, plan: StorePlan, manifests: dict[tuple[int, str], SnapshotManifest]
) -> str | None:
    """Why the plan's expiry base must not become the base (None: it is sound or there is none)."""
    if plan.base is None:
        return None
    manifest = manifests.get(plan.base)
    if manifest is None:
        return None  # the plan only picks readable manifests
    why = checksum_problem(fm, plan.store, manifest)
    if why is None:
        return None
    return (
        f"the snapshot {plan.store.manifest(*plan.base)} is corrupt ({why}); expiry keeps the changelogs a load "
        "replays around it until a newer intact snapshot exists"
    )


def newest_snapshot_problem(
    fm: CheckpointFileManager, plan: StorePlan, manifests: dict[tuple[int, str], SnapshotManifest], *, checksums: bool
) -> str | None:
    """Why the newest committed snapshot of the store is unusable (None: it is intact, or there is none).

    Structural damage comes from the plan; with `checksums` the newest intact snapshot's SSTs are
    also checked against their SHA-256 (each SST downloaded once per process).
    """
    intact = max(plan.intact_snapshots, default=0)
    newer_broken = [why for v, why in sorted(plan.broken_snapshots.items()) if v > intact]
    if newer_broken:
        return newer_broken[-1]
    if not checksums or not intact:
        return None
    ref = (intact, plan.intact_snapshots[intact])
    manifest = manifests.get(ref)
    if manifest is None:
        return None
    why = checksum_problem(fm, plan.store, manifest)
    return None if why is None else f"snapshot {plan.store.manifest(*ref)} is corrupt: {why}"


__all__ = ["base_problem", "checksum_problem", "corrupt_ssts", "forget", "mark_sound", "newest_snapshot_problem"]
