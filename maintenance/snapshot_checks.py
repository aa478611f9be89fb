"""Is a store's snapshot sound? What snapshot repair (DESIGN invariant 10) asks of maintenance.

A load repairs around an unreadable snapshot by replaying from an older base, so maintenance must
(1) notice the bad snapshot, (2) write a fresh one at the next snapshot run, even below the chain
threshold, and (3) never move the expiry base onto a bad snapshot, which would delete the changelogs
the repair replays. The plan (`statekeeper.maintenance.plan`) sees structural damage from the inventory (an
unreadable manifest, a missing or resized SST); a bit flip inside an SST shows only in its SHA-256,
which this module checks by downloading the SST. SST names derive from their content, so an SST
checked once in this process (or uploaded by it) is not downloaded again: checking a new snapshot
costs its new SSTs.

Each Dagster run is a new process, so with a persistent work directory (the one that keeps the warm
replicas, `MaintenanceSettings.work_dir`) the SSTs found sound are also remembered in a small JSON
file per store there (`VerifiedSsts`): a later process skips downloading and hashing an SST whose
size and modification time are still the ones it had when it was hashed, and hashes it again when
either differs (a rewritten or replaced copy). A copy damaged in place without either changing is
noticed by `verify`, which always reads the bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Collection
from dataclasses import dataclass

from statekeeper.maintenance.parsed_cache import (
    CORRUPT_SSTS,
    PROVEN_SNAPSHOTS,
    SOUND_SSTS,
    UNOPENABLE_SNAPSHOTS,
    UNOPENABLE_WHY,
)
from statekeeper.maintenance.plan import StorePlan
from statekeeper.store.errors import CorruptFileError, StatekeeperError, UnsupportedFormatError
from statekeeper.store.files import CheckpointFileManager
from statekeeper.store.files.base import FileInfo
from statekeeper.store.formats.changelog import read_header
from statekeeper.store.formats.snapshot import SnapshotManifest, SstFile
from statekeeper.store.layout import StoreId
from statekeeper.store.load_plan import check_full_state, check_header
from statekeeper.store.snapshot import file_sha256, restore_snapshot
from statekeeper.store.snapshot_content import check_restored

log = logging.getLogger(__name__)

VERIFIED_DIR = "verified-ssts"
"""Folder of the work directory holding the persisted `VerifiedSsts` files."""

_hashed_lock = threading.Lock()
_hashed = 0
"""SSTs this process downloaded and hashed (`ssts_hashed`)."""


def forget() -> None:
    """Drop what this process learnt about SST contents (as a new maintainer process starts)."""
    global _hashed
    SOUND_SSTS.clear()
    CORRUPT_SSTS.clear()
    PROVEN_SNAPSHOTS.clear()
    UNOPENABLE_SNAPSHOTS.clear()
    UNOPENABLE_WHY.clear()
    with _hashed_lock:
        _hashed = 0


def ssts_hashed() -> int:
    """How many SSTs this process downloaded and hashed to check them (since start or `forget`)."""
    with _hashed_lock:
        return _hashed


def corrupt_ssts(root: str, store: StoreId) -> frozenset[str]:
    """SST names of `store` found corrupt in this process."""
    return CORRUPT_SSTS.names(root, store)


def mark_sound(root: str, store: StoreId, manifest: SnapshotManifest) -> None:
    """Record the SSTs of a snapshot this process just wrote from local files it hashed, and the snapshot as
    proven: its manifest's key count and digest were taken by opening those very files."""
    SOUND_SSTS.add(root, store, (s.remote_name for s in manifest.sst_files))
    PROVEN_SNAPSHOTS.add(root, store, [store.manifest(manifest.version, manifest.checkpoint_id)])


def _fingerprint(manifest: SnapshotManifest) -> str:
    return hashlib.sha256(manifest.to_bytes()).hexdigest()


def proof_problem(
    fm: CheckpointFileManager,
    store: StoreId,
    manifest: SnapshotManifest,
    *,
    work_dir: str | None = None,
    again: bool = False,
) -> str | None:
    """Why the snapshot cannot be a base (None: it is proven). DESIGN invariant 14.

    Proving restores it into a temporary directory (each SST's size and SHA-256 checked), opens it and
    finds the key count and digest its manifest recorded at build time. The outcome is kept for the process
    (`PROVEN_SNAPSHOTS`, `UNOPENABLE_SNAPSHOTS`) and, with `work_dir`, a proof for later processes beside the
    verified SSTs (`VerifiedSsts`, keyed by the manifest's exact bytes). `again`: open it whatever is known
    (verify reads the bytes)."""
    root = fm.root_uri
    path = store.manifest(manifest.version, manifest.checkpoint_id)
    name = f"{root}/{path}"
    verified = VerifiedSsts(work_dir, root, store) if work_dir is not None else None
    if not again:
        if (root, store, path) in UNOPENABLE_SNAPSHOTS:
            why = UNOPENABLE_WHY.get((root, path), "it does not open to what it recorded")
            return f"snapshot {name} cannot be a base: {why}"
        if (root, store, path) in PROVEN_SNAPSHOTS:
            return None
        if verified is not None and verified.proven.get(path) == _fingerprint(manifest):
            PROVEN_SNAPSHOTS.add(root, store, [path])
            return None
    global _hashed
    tmp = tempfile.mkdtemp(prefix="statekeeper-prove-")
    try:
        restore_snapshot(fm, store, manifest, os.path.join(tmp, "db"))
        with _hashed_lock:
            _hashed += len(manifest.sst_files)
        check_restored(manifest, os.path.join(tmp, "db"), name)
    except (CorruptFileError, UnsupportedFormatError, FileNotFoundError) as e:
        UNOPENABLE_WHY[(root, path)] = str(e)
        UNOPENABLE_SNAPSHOTS.add(root, store, [path])
        PROVEN_SNAPSHOTS.discard(root, store, [path])
        if verified is not None:
            verified.proven.pop(path, None)
            verified.changed()
            verified.save()
        return f"snapshot {name} cannot be a base: {e}"
    except (StatekeeperError, OSError) as e:
        return f"snapshot {name} could not be opened to prove it ({e})"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    SOUND_SSTS.add(root, store, (s.remote_name for s in manifest.sst_files))
    PROVEN_SNAPSHOTS.add(root, store, [path])
    UNOPENABLE_SNAPSHOTS.discard(root, store, [path])
    if verified is not None:
        verified.proven[path] = _fingerprint(manifest)
        for old in sorted(verified.proven)[:-PROOFS_KEPT]:  # names sort by version: the newest stay
            del verified.proven[old]
        verified.changed()
        verified.save()
    return None


PROOFS_KEPT = 8
"""Proofs a store's `VerifiedSsts` file keeps: its newest snapshots, the only ones that become bases."""


@dataclass(frozen=True, slots=True)
class VerifiedSst:
    """An SST whose content matched `sha256` when it had this size and modification time."""

    size: int
    mtime: float
    sha256: str


class VerifiedSsts:
    """The SSTs of one store found sound by earlier processes: a JSON file in the work directory.

    ``{"root": ..., "store": ..., "ssts": {remote name: {"size", "mtime", "sha256"}}}``; a file that
    does not parse, or names another root or store, is ignored (every SST is hashed again).
    """

    def __init__(self, work_dir: str, root: str, store: StoreId) -> None:
        digest = hashlib.sha256(root.encode()).hexdigest()[:16]
        self.path = os.path.join(work_dir, VERIFIED_DIR, digest, store.operator, f"{store.partition:05d}.json")
        self.root = root
        self.store = str(store)
        self.proven: dict[str, str] = {}
        """Manifest path -> SHA-256 of its bytes, for the snapshots proven to open (`proof_problem`)."""
        self.entries: dict[str, VerifiedSst] = self._read()
        self._changed = False

    def _read(self) -> dict[str, VerifiedSst]:
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
            if data.get("root") != self.root or data.get("store") != self.store:
                return {}
            self.proven = {str(k): str(v) for k, v in data.get("snapshots", {}).items()}
            return {
                str(name): VerifiedSst(int(e["size"]), float(e["mtime"]), str(e["sha256"]))
                for name, e in data["ssts"].items()
            }
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
            log.warning("ignoring the verified-SST cache %s (%s): its SSTs are hashed again", self.path, e)
            self.proven = {}
            return {}

    def changed(self) -> None:
        self._changed = True

    def is_sound(self, sst: SstFile, size: int, mtime: float) -> bool:
        """Whether `sst`, now listed with `size` and `mtime`, is the copy found sound before."""
        known = self.entries.get(sst.remote_name)
        return known is not None and known == VerifiedSst(size, mtime, sst.sha256) and size == sst.size

    def add(self, sst: SstFile, size: int, mtime: float) -> None:
        self.entries[sst.remote_name] = VerifiedSst(size, mtime, sst.sha256)
        self._changed = True

    def discard(self, sst: SstFile) -> None:
        if self.entries.pop(sst.remote_name, None) is not None:
            self._changed = True

    def keep(self, referenced: Collection[str]) -> None:
        """Drop the SSTs no listed snapshot of the store names any more (expiry deleted them): the file stays as
        large as the store's snapshots, not as every SST the store ever had."""
        gone = self.entries.keys() - set(referenced)
        for name in gone:
            del self.entries[name]
        self._changed = self._changed or bool(gone)

    def keep_snapshots(self, manifests: Collection[str]) -> None:
        """Drop the proofs of snapshots no longer listed (`manifests`: the store's manifest paths)."""
        gone = self.proven.keys() - set(manifests)
        for path in gone:
            del self.proven[path]
        self._changed = self._changed or bool(gone)

    def save(self) -> None:
        """Write the file atomically if anything changed (a failure is logged: the cache is an optimisation)."""
        if not self._changed:
            return
        ssts = {n: {"size": e.size, "mtime": e.mtime, "sha256": e.sha256} for n, e in sorted(self.entries.items())}
        data = {"root": self.root, "store": self.store, "ssts": ssts, "snapshots": dict(sorted(self.proven.items()))}
        text = json.dumps(data, indent=0)
        folder = os.path.dirname(self.path)
        try:
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".verified-", dir=folder)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(text)
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
            self._changed = False
        except OSError as e:
            log.warning("cannot write the verified-SST cache %s: %s", self.path, e)


def checksum_problem(
    fm: CheckpointFileManager,
    store: StoreId,
    manifest: SnapshotManifest,
    *,
    work_dir: str | None = None,
    referenced: Collection[str] | None = None,
) -> str | None:
    """Why the snapshot's SSTs do not match the manifest's checksums (None: they all match).

    With `work_dir`, SSTs verified by an earlier process and unchanged since (same size and
    modification time) are not downloaded again (`VerifiedSsts`); `referenced`: the SSTs the store's listed
    snapshots name, the only ones that file keeps.
    """
    root = fm.root_uri
    verified = VerifiedSsts(work_dir, root, store) if work_dir is not None else None
    try:
        return _check_ssts(fm, store, manifest, verified)
    finally:
        if verified is not None:
            if referenced is not None:
                verified.keep(referenced)
            verified.save()


def _referenced(manifests: dict[tuple[int, str], SnapshotManifest]) -> set[str]:
    return {sst.remote_name for m in manifests.values() for sst in m.sst_files}


def _check_ssts(
    fm: CheckpointFileManager, store: StoreId, manifest: SnapshotManifest, verified: VerifiedSsts | None
) -> str | None:
    global _hashed
    root = fm.root_uri
    for sst in manifest.sst_files:
        if (root, store, sst.remote_name) in SOUND_SSTS:
            continue
        path = store.sst(sst.remote_name)
        listed: FileInfo | None = None
        if verified is not None:
            try:
                listed = fm.info(path)
            except (StatekeeperError, OSError) as e:
                return f"SST {root}/{path} cannot be read: {e}"
            if verified.is_sound(sst, listed.size, listed.mtime):
                SOUND_SSTS.add(root, store, [sst.remote_name])
                continue
        fd, tmp = tempfile.mkstemp(prefix="statekeeper-sst-")
        os.close(fd)
        try:
            size = fm.download(path, tmp)
            digest = file_sha256(tmp)
            with _hashed_lock:
                _hashed += 1
        except (StatekeeperError, OSError) as e:
            return f"SST {root}/{path} cannot be read: {e}"
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if size != sst.size or digest != sst.sha256:
            CORRUPT_SSTS.add(root, store, [sst.remote_name])
            if verified is not None:
                verified.discard(sst)
            return f"SST {root}/{path} does not match the checksum in its snapshot manifest"
        SOUND_SSTS.add(root, store, [sst.remote_name])
        if verified is not None and listed is not None:
            verified.add(sst, listed.size, listed.mtime)
    return None


def base_problem(
    fm: CheckpointFileManager,
    plan: StorePlan,
    manifests: dict[tuple[int, str], SnapshotManifest],
    *,
    work_dir: str | None = None,
) -> str | None:
    """Why the plan's expiry base must not become the base (None: it is sound or there is none)."""
    if plan.base is None:
        return None
    manifest = manifests.get(plan.base)
    if manifest is None:
        return full_state_problem(fm, plan.store, plan.base) if plan.base[0] in plan.full_state else None
    why = checksum_problem(fm, plan.store, manifest, work_dir=work_dir, referenced=_referenced(manifests))
    if why is None:
        return None
    return (
        f"the snapshot {plan.store.manifest(*plan.base)} is corrupt ({why}); expiry keeps the changelogs a load "
        "replays around it until a newer intact snapshot exists"
    )


def full_state_problem(fm: CheckpointFileManager, store: StoreId, base: tuple[int, str]) -> str | None:
    """Why the changelog `base` of `store`, which its commit record declares full-state (a rescale or rollback
    wrote it), must not be an expiry base (None: its header agrees). The record is a claim about a file a load
    reads: a header naming a lineage makes every load below it walk that lineage, which expiry would delete."""
    path = store.changelog(*base)
    name = f"{fm.root_uri}/{path}"
    try:
        with fm.open(path) as f:
            header = read_header(f, name)
        check_header(store, header, *base, name)
        check_full_state(store, header, name)
    except (StatekeeperError, OSError) as e:
        return f"{e}; expiry keeps the changelogs a load replays below it"
    return None


def newest_snapshot_problem(
    fm: CheckpointFileManager,
    plan: StorePlan,
    manifests: dict[tuple[int, str], SnapshotManifest],
    *,
    checksums: bool,
    work_dir: str | None = None,
) -> str | None:
    """Why the newest committed snapshot of the store is unusable (None: it is intact, or there is none).

    Structural damage comes from the plan; with `checksums` the newest intact snapshot's SSTs are
    also checked against their SHA-256 (each SST downloaded once per process, or once per change of
    the SST with a persistent `work_dir`).
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
    why = checksum_problem(fm, plan.store, manifest, work_dir=work_dir, referenced=_referenced(manifests))
    if why is not None:
        return f"snapshot {plan.store.manifest(*ref)} is corrupt: {why}"
    return proof_problem(fm, plan.store, manifest, work_dir=work_dir)


__all__ = [
    "VerifiedSst",
    "VerifiedSsts",
    "base_problem",
    "checksum_problem",
    "corrupt_ssts",
    "forget",
    "mark_sound",
    "newest_snapshot_problem",
    "proof_problem",
    "ssts_hashed",
]
