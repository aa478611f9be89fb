"""Writing and restoring snapshots (format in `statekeeper.store.formats.snapshot`).

Writing: RocksDB checkpoint of an open DB -> upload SST files not yet in the store's sst/ directory
(content-derived names, so an unchanged SST is never uploaded twice) -> write the manifest last.
Restoring: download the SSTs under their RocksDB names, write the small files, open.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass

import rocksdict as rd

from statekeeper.store.errors import CheckpointFileExistsError, CorruptFileError
from statekeeper.store.faults import reached as fault_point
from statekeeper.store.files.base import CheckpointFileManager
from statekeeper.store.formats.names import Shape, join_inside, name_from_file
from statekeeper.store.formats.snapshot import SnapshotManifest, SstFile
from statekeeper.store.layout import StoreId
from statekeeper.store.snapshot_content import content_of

log = logging.getLogger(__name__)

_SKIP_PREFIXES = ("LOG",)  # RocksDB info logs are not state


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a file's content, hex (what a manifest records of each SST file)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@dataclass(frozen=True)
class SnapshotResult:
    manifest_path: str
    manifest: SnapshotManifest
    uploaded_files: int
    uploaded_bytes: int
    reused_files: int
    seconds: float


def write_snapshot(
    fm: CheckpointFileManager,
    store: StoreId,
    version: int,
    checkpoint_id: str,
    db: rd.Rdict,
    work_dir: str,
    *,
    existing_ssts: set[str] | None = None,
    hash_cache: dict[tuple[str, int], str] | None = None,
    corrupt_ssts: frozenset[str] = frozenset(),
) -> SnapshotResult:
    """Snapshot `db`, which must hold exactly committed (version, checkpoint_id) of `store`.

    `existing_ssts` (remote names already uploaded) saves a listing; `hash_cache` maps
    (local name, size) -> sha256 so a replica does not rehash SSTs it hashed before (RocksDB never
    rewrites an SST under the same number). An SST is named by the first 40 hex digits of its
    SHA-256; when that name holds a corrupt copy (`corrupt_ssts`, found by maintenance) the SST is
    uploaded under its full 64-digit digest instead, and a listed full-digest name is always
    preferred, so no later snapshot references the corrupt copy (snapshot repair, invariant 10).
    """
    t0 = time.perf_counter()
    if existing_ssts is None:
        existing_ssts = {info.path.rpartition("/")[2] for info in fm.list(store.sst_dir())}
    ckpt_dir = os.path.join(work_dir, f"checkpoint-{uuid.uuid4().hex}")
    fault_point("rocks.checkpoint", store.sst_dir())
    rd.Checkpoint(db).create_checkpoint(ckpt_dir)
    try:
        ssts: list[SstFile] = []
        db_files: dict[str, bytes] = {}
        uploaded = uploaded_bytes = reused = 0
        live: set[tuple[str, int]] = set()
        for name in sorted(os.listdir(ckpt_dir)):
            full = os.path.join(ckpt_dir, name)
            if name.startswith(_SKIP_PREFIXES):
                continue
            size = os.path.getsize(full)
            if not name.endswith(".sst"):
                with open(full, "rb") as f:
                    db_files[name] = f.read()
                continue
            key = (name, size)
            live.add(key)
            digest = hash_cache.get(key) if hash_cache is not None else None
            if digest is None:
                digest = file_sha256(full)
                if hash_cache is not None:
                    hash_cache[key] = digest
            remote = sst_name(digest, existing_ssts, corrupt_ssts)
            ssts.append(SstFile(name, remote, size, digest))
            if remote in existing_ssts:
                reused += 1
                continue
            try:
                fm.put_file(full, store.sst(remote), exclusive=True)
                uploaded += 1
                uploaded_bytes += size
            except CheckpointFileExistsError:
                reused += 1  # same name means same content
            existing_ssts.add(remote)
        if hash_cache is not None:  # compactions deleted the others: keep the cache as large as the DB
            for gone in hash_cache.keys() - live:
                del hash_cache[gone]
        num_keys = 0
        cfs = tuple(rd.Rdict.list_cf(ckpt_dir, rd.Options(raw_mode=True)))
        for cf in cfs:
            num_keys += db.get_column_family(cf).property_int_value("rocksdb.estimate-num-keys") or 0
        key_count, content_sha256 = content_of(ckpt_dir)  # the files as uploaded open to this (invariant 14)
        manifest = SnapshotManifest(
            operator=store.operator,
            partition=store.partition,
            version=version,
            checkpoint_id=checkpoint_id,
            sst_files=tuple(ssts),
            db_files=db_files,
            column_families=cfs,
            num_keys=num_keys,
            key_count=key_count,
            content_sha256=content_sha256,
        )
        path = store.manifest(version, checkpoint_id)
        with fm.create(path, exclusive=True) as out:
            out.write(manifest.to_bytes())
    finally:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    return SnapshotResult(path, manifest, uploaded, uploaded_bytes, reused, time.perf_counter() - t0)


def sst_name(digest: str, existing: set[str], corrupt: frozenset[str] = frozenset()) -> str:
    """The remote name of an SST with SHA-256 `digest` (see `write_snapshot`)."""
    short, full = f"{digest[:40]}.sst", f"{digest}.sst"
    return full if full in existing or short in corrupt else short


def read_manifest(fm: CheckpointFileManager, store: StoreId, version: int, checkpoint_id: str) -> SnapshotManifest:
    """The manifest of snapshot (`version`, `checkpoint_id`) of `store`; `CorruptFileError` naming it unless it says
    it is that snapshot: a well-framed manifest of another version or store under this name would restore other
    state as this version's."""
    path = store.manifest(version, checkpoint_id)
    name = manifest_uri(fm, path)
    manifest = SnapshotManifest.from_bytes(fm.read_bytes(path), name)
    expected = (store.operator, store.partition, version, checkpoint_id)
    got = (manifest.operator, manifest.partition, manifest.version, manifest.checkpoint_id)
    if got != expected:
        raise CorruptFileError(f"snapshot manifest says {got}, its name says {expected}", name)
    return manifest


def manifest_uri(fm: CheckpointFileManager, path: str) -> str:
    return getattr(fm, "root_uri", "") + "/" + path


_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
"""A restored file is new in the fresh DB directory: never one already there, never through a symlink."""


def restore_snapshot(
    fm: CheckpointFileManager,
    store: StoreId,
    manifest: SnapshotManifest,
    db_dir: str,
    *,
    verify: bool = True,
    manifest_path: str | None = None,
) -> None:
    """Materialise the snapshot as a RocksDB directory at `db_dir` (which must not exist).

    Every file goes directly into `db_dir` under a name checked by `names.join_inside` (the manifest is file
    content: DESIGN invariant 12) and is created exclusively, so a manifest naming a file twice, or a
    path, writes nothing outside it. `manifest_path` names the manifest in those errors.
    """
    where = (
        manifest_uri(fm, manifest_path) if manifest_path else f"the manifest of snapshot {manifest.version} of {store}"
    )
    os.makedirs(db_dir)
    for sst in manifest.sst_files:
        target = join_inside(db_dir, sst.local_name, Shape.SST_LOCAL, where, "'sst_files' local name")
        remote = store.sst(name_from_file(sst.remote_name, Shape.SST_REMOTE, where, "'sst_files' remote name"))
        os.close(_create_new(target, where))
        size = fm.download(remote, target)
        if size != sst.size:
            raise CorruptFileError(f"SST file has {size} bytes, manifest says {sst.size}", remote)
        if verify and file_sha256(target) != sst.sha256:
            raise CorruptFileError("SST file content does not match its checksum in the manifest", remote)
    for name, data in manifest.db_files.items():
        target = join_inside(db_dir, name, Shape.DB_FILE, where, "'db_files'")
        with os.fdopen(_create_new(target, where), "wb") as f:
            f.write(data)


def _create_new(path: str, manifest: str) -> int:
    try:
        return os.open(path, _NEW_FILE, 0o644)
    except (FileExistsError, IsADirectoryError):
        name = os.path.basename(path)
        raise CorruptFileError(f"the snapshot names file {name!r} twice", manifest) from None
