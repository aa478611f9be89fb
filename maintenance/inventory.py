"""One listing pass over a checkpoint root: every file classified, commit records and manifests read.

Every maintenance operation works from an :class:`Inventory` instead of listing on its own, so one
run costs one paginated listing of the root (plus, per store it changes, one listing of that store's
prefix taken *after* its lease is held: `Inventory.rescan_store`). What each file is *for* (needed by
a retained version, expired, orphan, in flight) is decided in `statekeeper.maintenance.plan`.

Commit records and manifests never change once written (DESIGN invariant 2), so their parsed content
is cached per process while their files are listed (`statekeeper.maintenance.parsed_cache`): a maintainer
that runs every few seconds reads only the new ones; verification reads everything again. So is each
listed file's kind, which a maintainer would otherwise work out again from its path every cycle.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from copy import copy as shallow_copy
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

from statekeeper.maintenance.file_kinds import (
    BATCH,
    CHANGELOG,
    COMMIT,
    FOREIGN,
    HEARTBEAT,
    MANIFEST,
    NOT_CATALOGUED,
    SST,
    SST_NAME,
    TEMP,
    UPLOAD,
    FileEntry,
    classify,
)
from statekeeper.maintenance.parsed_cache import CORRUPT_SSTS, SOUND_SSTS, ParsedFiles
from statekeeper.maintenance.progress import bar as progress_bar
from statekeeper.store.errors import CheckpointError, ConfigurationError
from statekeeper.store.files import CheckpointFileManager, FileInfo, LocalFileManager
from statekeeper.store.formats.commit import CommitRecord
from statekeeper.store.formats.snapshot import SnapshotManifest
from statekeeper.store.layout import (
    COMMITS_DIR,
    SPARK_DIR,
    STATE_DIR,
    StoreId,
)
from statekeeper.store.snapshot import read_manifest

log = logging.getLogger(__name__)

SPECIAL_WHY = "not a regular file (a symlink, FIFO or device): never opened; remove it or restore the file"
T = TypeVar("T")
R = TypeVar("R")


@dataclass
class StoreFiles:
    """Everything listed under one store's prefix, by kind."""

    store: StoreId
    changelogs: dict[tuple[int, str], FileEntry] = field(default_factory=dict)
    manifests: dict[tuple[int, str], FileEntry] = field(default_factory=dict)
    ssts: dict[str, FileEntry] = field(default_factory=dict)
    """Content-derived SST name -> entry."""
    temps: list[FileEntry] = field(default_factory=list)
    """Temp files of unfinished local writes and incomplete multipart uploads."""
    foreign: list[FileEntry] = field(default_factory=list)
    manifest_data: dict[tuple[int, str], SnapshotManifest] = field(default_factory=dict)
    unreadable: dict[str, str] = field(default_factory=dict)
    """Path -> why it could not be read (corrupt, unknown format, content does not match its name)."""

    def add(self, entry: FileEntry) -> None:
        if entry.kind == CHANGELOG:
            assert entry.version is not None and entry.checkpoint_id is not None
            self.changelogs[(entry.version, entry.checkpoint_id)] = entry
        elif entry.kind == MANIFEST:
            assert entry.version is not None and entry.checkpoint_id is not None
            self.manifests[(entry.version, entry.checkpoint_id)] = entry
        elif entry.kind == SST:
            self.ssts[entry.name] = entry
        elif entry.kind in (TEMP, UPLOAD):
            self.temps.append(entry)
        else:
            self.foreign.append(entry)

    def copy(self) -> StoreFiles:
        """A new view with the same files (what a plan was made of stays as it was: `plan_store` keeps the
        plan of each view)."""
        containers = {f.name: shallow_copy(getattr(self, f.name)) for f in fields(self) if f.name != "store"}
        return replace(self, **containers)

    def discard(self, entry: FileEntry) -> None:
        """Forget a file this maintainer deleted."""
        key = (entry.version or 0, entry.checkpoint_id or "")
        if entry.kind == CHANGELOG:
            self.changelogs.pop(key, None)
        elif entry.kind == MANIFEST:
            self.manifests.pop(key, None)
            self.manifest_data.pop(key, None)
        elif entry.kind == SST:
            self.ssts.pop(entry.name, None)
        elif entry in self.temps:
            self.temps.remove(entry)
        self.unreadable.pop(entry.path, None)

    def entries(self) -> Iterator[FileEntry]:
        yield from self.changelogs.values()
        yield from self.manifests.values()
        yield from self.ssts.values()
        yield from self.temps
        yield from self.foreign


_records: ParsedFiles[CommitRecord] = ParsedFiles()
_manifests: ParsedFiles[SnapshotManifest] = ParsedFiles()


def _keep_listed_ssts(root: str, listed: Iterable[StoreFiles], *, whole_root: bool) -> None:
    ssts = {files.store: files.ssts.keys() for files in listed}
    for known in (SOUND_SSTS, CORRUPT_SSTS):
        known.keep_listed(root, ssts, whole_root=whole_root)


def _keep_view(root: str, files: StoreFiles) -> None:
    """Forget what the caches hold of `files.store` that its view lacks (listed again, or deleted since)."""
    prefix = f"{files.store.prefix}/"
    _manifests.keep_listed(root, [prefix], {e.path for e in files.manifests.values()})
    _keep_listed_ssts(root, [files], whole_root=False)


def _forget(root: str, deleted: list[FileEntry]) -> None:
    """Drop what the caches hold of files this maintainer deleted: O(deleted), whatever the stores hold."""
    _records.discard(root, [e.path for e in deleted if e.kind == COMMIT])
    _manifests.discard(root, [e.path for e in deleted if e.kind == MANIFEST])
    ssts: dict[StoreId, list[str]] = {}
    for e in deleted:
        if e.kind == SST and e.store is not None:
            ssts.setdefault(e.store, []).append(e.name)
    for store, names in ssts.items():
        for known in (SOUND_SSTS, CORRUPT_SSTS):
            known.discard(root, store, names)


def clear_caches() -> None:
    """Forget parsed commit records and manifests (tests that rewrite a root in place)."""
    _records.clear()
    _manifests.clear()


def _map(fn: Callable[[T], R], items: list[T], workers: int) -> list[R]:
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items)), thread_name_prefix="inventory") as pool:
        return list(pool.map(fn, items))


class Inventory:
    """The classified content of one checkpoint root at one point in time."""

    def __init__(self, fm: CheckpointFileManager, *, parallelism: int = 4, use_cache: bool = True) -> None:
        self.fm = fm
        self.use_cache = use_cache
        self.root_uri = fm.root_uri
        self.parallelism = parallelism
        self.scanned_at = 0.0
        self.commit_files: dict[int, FileEntry] = {}
        self.records: dict[int, CommitRecord] = {}
        self.unreadable: dict[str, str] = {}
        """Root-level files that could not be read (commit records)."""
        self.stores: dict[StoreId, StoreFiles] = {}
        self.batch_files: list[FileEntry] = []
        """The Spark driver's batch files (`spark/<operator>/batches/`), tied to the version they commit."""
        self.heartbeats: list[FileEntry] = []
        """Running (or killed) Spark drivers' heartbeats (`spark/<operator>/heartbeat/`)."""
        self.temps: list[FileEntry] = []
        """Unfinished writes outside any store (commit records, batch files)."""
        self.foreign: list[FileEntry] = []
        """Files outside any store that are not in the layout; never deleted."""
        self.listings = 0
        self.reads = 0
        self.seconds = 0.0
        self._committed: dict[StoreId, dict[int, str]] | None = None
        self._current: set[StoreId] = set()
        """Stores whose view was listed while this maintainer held their lease and that it has not changed
        since: `rescan_store` returns their view without listing again."""

    # -- scanning ---------------------------------------------------------------------------------
    @classmethod
    def scan(
        cls,
        fm: CheckpointFileManager,
        *,
        parallelism: int = 4,
        progress: bool = False,
        stores: Iterable[StoreId] | None = None,
        use_cache: bool = True,
        leased: Iterable[StoreId] = (),
    ) -> Inventory:
        """List the root once and read every commit record and manifest not read before.

        With `stores`, only those stores' prefixes (and the commit records) are listed. Without
        `use_cache` every commit record and manifest is read again (verification). `leased`: stores
        whose lease the caller held before this listing started and holds while it uses the
        inventory (the maintenance loop's cycle leases): their listing is already one taken under
        the lease, so `rescan_store` does not list them again.
        """
        inv = cls(fm, parallelism=parallelism, use_cache=use_cache)
        inv._current.update(leased)
        check_root(fm)
        t0 = time.perf_counter()
        inv.scanned_at = time.time()
        bar = progress_bar(progress, f"listing {fm.root_uri}")
        try:
            if stores is None:
                prefixes = [""]
            else:
                prefixes = [f"{COMMITS_DIR}/", *(f"{s.prefix}/" for s in sorted(stores, key=_store_key))]
            for prefix in prefixes:
                inv.listings += 1
                published, unfinished, specials = _listing(fm, prefix)
                for info in published:
                    inv._add(FileEntry(info.path, "", info.size, info.mtime), temp_listing=False)
                    bar.update(1)
                for entry in unfinished:
                    inv._add(entry, temp_listing=True)
                for path in specials:
                    inv._special(path)
            if stores is not None:
                for s in stores:
                    inv.stores.setdefault(s, StoreFiles(s))
        finally:
            bar.close()
        inv._read_commits(list(inv.commit_files.values()))
        for files in inv.stores.values():
            inv._read_manifests(files)
        _records.keep_listed(inv.root_uri, [f"{COMMITS_DIR}/"], {e.path for e in inv.commit_files.values()})
        listed = {e.path for files in inv.stores.values() for e in files.manifests.values()}
        _manifests.keep_listed(inv.root_uri, [p for p in prefixes if p != f"{COMMITS_DIR}/"], listed)
        _keep_listed_ssts(inv.root_uri, inv.stores.values(), whole_root=stores is None)
        inv.seconds = time.perf_counter() - t0
        log.info(
            "inventory of %s: %d commit records, %d stores, %d foreign files (%.2fs)",
            inv.root_uri,
            len(inv.commit_files),
            len(inv.stores),
            len(inv.foreign) + sum(len(f.foreign) for f in inv.stores.values()),
            inv.seconds,
        )
        return inv

    def rescan_store(self, store: StoreId) -> StoreFiles:
        """List one store's prefix again (after taking its lease) and read its new manifests.

        Commit records are not listed again: a stale view of them only keeps more files. A store
        listed under the lease this maintainer still holds, and not changed by it since (`changed`),
        is not listed again: only its writer adds files meanwhile, and files missing from a view
        are never deleted.
        """
        if self.is_current(store):
            return self.stores[store]
        files = StoreFiles(store)
        prefix = f"{store.prefix}/"
        self.listings += 1
        published, unfinished, specials = _listing(self.fm, prefix)
        for path in specials:
            if classify(path).store == store:
                files.unreadable[path] = SPECIAL_WHY
        for info in published:
            entry = self._entry(FileEntry(info.path, "", info.size, info.mtime), temp_listing=False)
            if entry.store == store:
                files.add(entry)
        for raw in unfinished:
            entry = self._entry(raw, temp_listing=True)
            if entry.store == store:
                files.add(entry)
        self._read_manifests(files)
        _keep_view(self.root_uri, files)
        self.stores[store] = files
        return files

    def is_current(self, store: StoreId) -> bool:
        """Whether `rescan_store` returns this view of `store` as it is (listed under a lease held since)."""
        return store in self._current and store in self.stores

    def changed(self, store: StoreId) -> None:
        """This maintainer wrote files of `store` (or may have deleted some): the next `rescan_store` lists it
        again."""
        self._current.discard(store)

    def wrote_snapshot(
        self, store: StoreId, manifest_path: str, manifest: SnapshotManifest, manifest_size: int, *, current: bool
    ) -> None:
        """This maintainer wrote a snapshot of `store`: its manifest, and the SSTs it names that the view
        lacks, join the view, whose files are then exactly what the store holds (but for what its writer
        added), so no later operation of the cycle lists it again if it was `current` before the snapshot.
        Their mtime is now: younger than any grace, as the listing would show."""
        files = self.files_of(store).copy()
        now = time.time()
        for sst in manifest.sst_files:
            entry = self._entry(FileEntry(store.sst(sst.remote_name), "", sst.size, now), temp_listing=False)
            if entry.name not in files.ssts:
                files.add(entry)
        files.add(self._entry(FileEntry(manifest_path, "", manifest_size, now), temp_listing=False))
        files.manifest_data[(manifest.version, manifest.checkpoint_id)] = manifest
        self.stores[store] = files
        if current:
            self._current.add(store)

    def deleted(self, attempted: Iterable[FileEntry], deleted: Iterable[FileEntry], *, failed: bool) -> None:
        """This maintainer deleted `deleted` of the `attempted` files: their stores' views become new ones
        without them, which stay current, so the next operation of the cycle does not list them again. If the
        deletion `failed`, what went is not known for sure: every store among `attempted` is listed again."""
        views: dict[StoreId, StoreFiles] = {}
        gone = list(deleted)
        for e in gone:
            if e.store is None or e.store not in self.stores:
                continue
            if e.store not in views:
                views[e.store] = self.stores[e.store].copy()
            views[e.store].discard(e)
        self.stores.update(views)
        _forget(self.root_uri, gone)
        if failed:
            for store in {e.store for e in attempted if e.store is not None}:
                self.changed(store)

    def _entry(self, raw: FileEntry, *, temp_listing: bool) -> FileEntry:
        k = classify(raw.path, temp_listing=temp_listing and raw.kind == TEMP)
        kind = k.kind
        if raw.kind == UPLOAD and kind != FOREIGN:
            kind = UPLOAD
        return FileEntry(raw.path, kind, raw.size, raw.mtime, k.store, k.version, k.checkpoint_id, raw.upload_id)

    def _add(self, raw: FileEntry, *, temp_listing: bool) -> None:
        entry = self._entry(raw, temp_listing=temp_listing)
        if entry.kind == COMMIT:
            assert entry.version is not None
            self.commit_files[entry.version] = entry
        elif entry.kind == BATCH:
            self.batch_files.append(entry)
        elif entry.kind == HEARTBEAT:
            self.heartbeats.append(entry)
        elif entry.kind in NOT_CATALOGUED:
            return  # the maintainers' leases and deployment record: kept by themselves (root_leases, deployment)
        elif entry.store is not None:
            files = self.stores.get(entry.store)
            if files is None:
                files = self.stores[entry.store] = StoreFiles(entry.store)
            files.add(entry)
        elif entry.kind in (TEMP, UPLOAD):
            self.temps.append(entry)
        else:
            self.foreign.append(entry)

    def _special(self, path: str) -> None:
        """A symlink, FIFO or device where a file is listed: reported as unreadable (never opened), so a
        FIFO named like a retained changelog is a named problem, not a file that looks missing."""
        k = classify(path)
        if k.store is not None:
            self.stores.setdefault(k.store, StoreFiles(k.store)).unreadable[path] = SPECIAL_WHY
        elif k.kind in (COMMIT, BATCH):
            self.unreadable[path] = SPECIAL_WHY
        else:
            log.warning("%s/%s: %s", self.root_uri, path, SPECIAL_WHY)

    def _read_commits(self, entries: list[FileEntry]) -> None:
        todo = []
        for e in entries:
            cached = _records.get(self.root_uri, e) if self.use_cache else None
            if cached is not None:
                self.records[cached.version] = cached
            else:
                todo.append(e)

        def read(e: FileEntry) -> CommitRecord | str | None:
            name = f"{self.root_uri}/{e.path}"
            try:
                record = CommitRecord.from_bytes(self.fm.read_bytes(e.path), name)
            except FileNotFoundError:
                return None  # deleted since the listing (another maintainer's expiry)
            except (CheckpointError, OSError) as err:
                return str(err)
            if record.version != e.version:
                return f"commit record claims version {record.version}: {name}"
            return record

        for e, res in zip(todo, _map(read, todo, self.parallelism), strict=True):
            self.reads += 1
            if res is None:
                del self.commit_files[e.version]  # type: ignore[arg-type]
            elif isinstance(res, str):
                self.unreadable[e.path] = res
            else:
                self.records[res.version] = res
                _records.put(self.root_uri, e, res)
        self._committed = None

    def _read_manifests(self, files: StoreFiles) -> None:
        todo = []
        for key, e in files.manifests.items():
            cached = _manifests.get(self.root_uri, e) if self.use_cache else None
            if cached is not None:
                files.manifest_data[key] = cached
            else:
                todo.append((key, e))

        def read(item: tuple[tuple[int, str], FileEntry]) -> SnapshotManifest | str | None:
            (version, ckpt), e = item
            name = f"{self.root_uri}/{e.path}"
            try:
                m = read_manifest(self.fm, files.store, version, ckpt)
            except FileNotFoundError:
                return None
            except (CheckpointError, OSError) as err:
                return str(err)
            for sst in m.sst_files:
                if not SST_NAME.match(sst.remote_name):
                    return f"snapshot manifest names an invalid SST file {sst.remote_name!r}: {name}"
            return m

        for (key, e), res in zip(todo, _map(read, todo, self.parallelism), strict=True):
            self.reads += 1
            if res is None:
                del files.manifests[key]
            elif isinstance(res, str):
                files.unreadable[e.path] = res
            else:
                files.manifest_data[key] = res
                _manifests.put(self.root_uri, e, res)

    # -- derived views ----------------------------------------------------------------------------
    @property
    def latest(self) -> int:
        """Newest committed version of the root (0: none); anything newer may be in flight."""
        return max(self.commit_files, default=0)

    @property
    def oldest_record(self) -> int | None:
        return min(self.commit_files, default=None)

    def _committed_map(self) -> dict[StoreId, dict[int, str]]:
        if self._committed is None:
            by_key: dict[tuple[str, int], dict[int, str]] = {}  # one StoreId per store, not per record
            for v, rec in self.records.items():
                for op, ids in rec.checkpoint_ids.items():
                    for p, cid in enumerate(ids):
                        versions = by_key.get((op, p))
                        if versions is None:
                            versions = by_key[(op, p)] = {}
                        versions[v] = cid
            out: dict[StoreId, dict[int, str]] = {}
            for (op, p), versions in by_key.items():
                try:
                    out[StoreId(op, p)] = versions
                except ConfigurationError:
                    continue
            self._committed = out
        return self._committed

    def full_state_versions(self, store: StoreId) -> dict[int, str]:
        """Version -> id of the committed full-state changelogs of `store` (a rescale or rollback wrote them)."""
        out: dict[int, str] = {}
        for v, rec in self.records.items():
            if rec.full_state(store.operator, store.partition):
                cid = rec.checkpoint_id(store.operator, store.partition)
                if cid is not None:
                    out[v] = cid
        return out

    def committed_ids(self, store: StoreId) -> dict[int, str]:
        """Version -> committed checkpoint id of `store`, from the commit records read."""
        return self._committed_map().get(store, {})

    def store_ids(self) -> list[StoreId]:
        """Every store with files or commits, in (operator, partition) order."""
        return sorted(set(self.stores) | set(self._committed_map()), key=_store_key)

    def files_of(self, store: StoreId) -> StoreFiles:
        files = self.stores.get(store)
        if files is None:
            files = self.stores[store] = StoreFiles(store)
        return files

    def all_entries(self) -> Iterator[FileEntry]:
        yield from self.commit_files.values()
        for files in self.stores.values():
            yield from files.entries()
        yield from self.batch_files
        yield from self.heartbeats
        yield from self.temps
        yield from self.foreign

    def summary(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        sizes: dict[str, int] = {}
        for e in self.all_entries():
            counts[e.kind] = counts.get(e.kind, 0) + 1
            sizes[e.kind] = sizes.get(e.kind, 0) + e.size
        return {
            "root": self.root_uri,
            "latest_version": self.latest,
            "oldest_commit_record": self.oldest_record,
            "stores": len(self.store_ids()),
            "files": counts,
            "bytes": sizes,
            "unreadable": dict(self.unreadable)
            | {p: why for f in self.stores.values() for p, why in f.unreadable.items()},
            "listings": self.listings,
            "reads": self.reads,
            "seconds": self.seconds,
        }


def _store_key(s: StoreId) -> tuple[str, int]:
    return (s.operator, s.partition)


def _listing(fm: CheckpointFileManager, prefix: str) -> tuple[list[FileInfo], list[FileEntry], list[str]]:
    """The published files under `prefix`, the unfinished writes there (a local root's temp files, from the
    same walk of its directories, or S3's incomplete multipart uploads; duck-typed per backend), and a local
    root's special entries (symlinks, FIFOs, devices), which S3 cannot hold."""
    with_temps = getattr(fm, "list_with_temp_files", None)
    if callable(with_temps):
        specials: list[str] = []
        published, temps = with_temps(prefix, specials=specials)
        return published, [FileEntry(t.path, TEMP, t.size, t.mtime) for t in temps], specials
    published = list(fm.list(prefix))
    list_uploads = getattr(fm, "list_incomplete_uploads", None)
    uploads = list_uploads(prefix) if callable(list_uploads) else []
    unfinished = [FileEntry(u.path, UPLOAD, 0, float(u.initiated), upload_id=u.upload_id) for u in uploads]
    return published, unfinished, []


def require_present(fm: CheckpointFileManager) -> None:
    """A local root that does not exist (a typo, an unmounted volume) is refused before maintenance writes
    anything, its leases included: a maintainer never creates a checkpoint root."""
    if isinstance(fm, LocalFileManager) and not os.path.exists(fm.root_path):
        raise ConfigurationError(f"checkpoint root {fm.root_uri} does not exist")


def check_root(fm: CheckpointFileManager) -> None:
    """Refuse a root that is clearly not a checkpoint root (a typo, a parent directory, a home dir).

    Cheap: at most four first-page listings. An empty or absent root is a valid, empty checkpoint
    location, except a local root that does not exist at all (almost always a typo).
    """
    require_present(fm)
    if isinstance(fm, LocalFileManager) and os.path.realpath(fm.root_path) == os.path.sep:
        raise ConfigurationError("refusing to maintain the file system root as a checkpoint root")
    ours = (f"{COMMITS_DIR}/", f"{STATE_DIR}/", f"{SPARK_DIR}/")
    for prefix in ours:  # the driver writes spark/ first
        if next(iter(fm.list(prefix)), None) is not None:
            return
    # A job starting while we list writes its first file after our look at its prefix: still ours. So is
    # any file `classify` calls ours at the top (the S3 capability probe a starting job writes and deletes).
    first = next((f for f in fm.list("") if classify(f.path).kind == FOREIGN), None)
    if first is not None and not first.path.startswith(ours):
        raise ConfigurationError(
            f"{fm.root_uri} does not look like a statekeeper checkpoint root: it has files (e.g. {first.path!r}) "
            f"but no {COMMITS_DIR}/, {STATE_DIR}/ or {SPARK_DIR}/ directory; nothing was read or deleted"
        )


__all__ = ["Inventory", "StoreFiles", "check_root", "clear_caches"]
