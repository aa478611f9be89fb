"""Catalog sync: fill the lineage catalog (`statekeeper.sql`) from a checkpoint location, the source of truth.

Two modes, both idempotent (running twice changes nothing):

- **incremental** (`sync_catalog`): lists only what can be new since the last sync, with per-prefix
  cursors kept in the catalog (S3 ``StartAfter``): commit records after the last one read; per known
  store, changelogs from the version after the newest committed one seen at the last sync, manifests
  from the newest version listed, and the SST directory only of stores with a new manifest. It does
  not notice deletions (maintenance operations report theirs with `Catalog.mark_deleted`), nor files
  outside that pattern: a losing attempt of an already committed version written late, an SST no new
  manifest references, temp files, foreign files. A full pass finds those.
- **full** (`sync_catalog(full=True)`): lists the whole root (and a local root's temp files), reads
  every commit record and manifest the catalog lacks, marks every file it did not list as deleted.
  `rebuild_catalog` forgets the root first and runs a full pass: the catalog of a checkpoint
  location from the location alone (DESIGN invariant 6).

Reads per sync: one GET per new commit record and per new manifest; one changelog header only for a
committed version whose predecessor left no record (to learn its parent id). A file that cannot be
read (corrupt, unknown format) is named in the result's errors and left for the next sync: the
cursor does not move past it and its store's SSTs are not reclassified from partial knowledge.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from statekeeper.maintenance import file_kinds
from statekeeper.maintenance.sync_view import InventoryView
from statekeeper.sql import (
    Catalog,
    CommitObservation,
    FileObservation,
    SnapshotObservation,
    SyncWriter,
    layout_rows,
)
from statekeeper.sql.models import (
    KIND_COMMIT,
    KIND_FOREIGN,
    KIND_MANIFEST,
)
from statekeeper.store.errors import CheckpointError, ConfigurationError, StatekeeperError
from statekeeper.store.files import CheckpointFileManager, FileInfo
from statekeeper.store.formats.changelog import read_header
from statekeeper.store.formats.commit import CommitRecord
from statekeeper.store.formats.snapshot import SnapshotManifest
from statekeeper.store.layout import (
    COMMITS_DIR,
    VERSION_DIGITS,
    StoreId,
    parse_commit_name,
)
from statekeeper.store.snapshot import read_manifest

log = logging.getLogger(__name__)

BATCH = 2000
"""Listed files per catalog transaction."""

T = TypeVar("T")
R = TypeVar("R")


class CatalogSyncError(StatekeeperError):
    """Some files could not be read; the catalog holds everything else. `result.errors` names them."""

    def __init__(self, result: CatalogSyncResult) -> None:
        shown = "; ".join(result.errors[:5])
        more = f" (and {len(result.errors) - 5} more)" if len(result.errors) > 5 else ""
        super().__init__(f"catalog sync of {result.root} could not read {len(result.errors)} file(s): {shown}{more}")
        self.result = result


@dataclass
class CatalogSyncResult:
    root: str
    mode: str
    """incremental, full or rebuild."""
    commits: int = 0
    files_listed: int = 0
    files_new: int = 0
    files_deleted: int = 0
    snapshots: int = 0
    reads: int = 0
    """Commit records, manifests and changelog headers read."""
    listings: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Classified:
    kind: str
    operator: str | None = None
    partition: int | None = None
    version: int | None = None
    checkpoint_id: str | None = None


def classify(path: str, *, temp_listing: bool = False) -> Classified:
    """What a path relative to the root is: the inventory's reading (`file_kinds.classify`, one reading of
    the layout), with a foreign file's store dropped (the catalog keeps no store for what is not ours)."""
    k = file_kinds.classify(path, temp_listing=temp_listing)
    if k.kind == KIND_FOREIGN or k.store is None:
        return Classified(k.kind, version=k.version)
    return Classified(k.kind, k.store.operator, k.store.partition, k.version, k.checkpoint_id)


def _observe(info: FileInfo, temp_listing: bool = False) -> FileObservation:
    c = classify(info.path, temp_listing=temp_listing)
    return FileObservation(
        info.path, c.kind, info.size, info.mtime, c.operator, c.partition, c.version, c.checkpoint_id
    )


def _batched(items: Iterable[T], n: int = BATCH) -> Iterator[list[T]]:
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) >= n:
            yield batch
            batch = []
    if batch:
        yield batch


class _Syncer:
    def __init__(
        self,
        catalog: Catalog,
        fm: CheckpointFileManager,
        result: CatalogSyncResult,
        workers: int,
        view: InventoryView | None = None,
    ) -> None:
        self.catalog = catalog
        self.fm = fm
        self.uri = fm.root_uri
        self.result = result
        self.workers = max(1, workers)
        self.view = view
        self.unreadable_stores: set[tuple[str, int]] = set()

    def _map(self, fn: Callable[[T], R], items: list[T]) -> list[R]:
        if self.workers == 1 or len(items) <= 1:
            return [fn(x) for x in items]
        with ThreadPoolExecutor(max_workers=min(self.workers, len(items)), thread_name_prefix="catalog-sync") as pool:
            return list(pool.map(fn, items))

    def _list(self, prefix: str, start_after: str | None = None) -> list[FileInfo]:
        listed = self.view.listing(prefix, start_after) if self.view is not None else None
        if listed is not None:
            return listed
        self.result.listings += 1
        return list(self.fm.list(prefix, start_after=start_after))

    # -- commit records -------------------------------------------------------------------------
    def _held_commit(self, path: str) -> tuple[str, CommitRecord | None]:
        """`path` with the record the view already parsed from it (None: it is to be read)."""
        return path, self.view.commit_record(path) if self.view is not None else None

    def _read_commit(self, held: tuple[str, CommitRecord | None]) -> CommitObservation | str:
        path, record = held
        try:
            if record is None:
                record = CommitRecord.from_bytes(self.fm.read_bytes(path), f"{self.uri}/{path}")
        except (CheckpointError, OSError) as e:
            return f"{path}: {e}"
        if record.version != parse_commit_name(path):
            return f"{path}: commit record claims version {record.version}"
        layouts = layout_rows(record.version, record.checkpoint_ids, record.layouts, record.change)
        return CommitObservation(record.version, record.created_at, record.checkpoint_ids, layouts, record.batch_id)

    def ingest_commits(self, writer: SyncWriter, paths: list[str]) -> set[str]:
        """Read and record the commit records of `paths` the catalog lacks; returns the unreadable paths."""
        known = writer.known_commit_versions(parse_commit_name(p) for p in paths)
        todo = [p for p in paths if parse_commit_name(p) not in known]
        held = [self._held_commit(p) for p in todo]
        results = self._map(self._read_commit, held)
        self.result.reads += sum(record is None for _, record in held)
        good: list[CommitObservation] = []
        bad: set[str] = set()
        for path, res in zip(todo, results, strict=True):
            if isinstance(res, str):
                self.result.errors.append(res)
                bad.add(path)
            else:
                good.append(res)
        for chunk in _batched(good, 200):
            unknown = writer.add_commits(chunk)
            if unknown:
                writer.set_parents(p for p in self._map(self._parent_from_header, unknown) if p is not None)
        self.result.commits += len(good)
        return bad

    def _parent_from_header(self, item: tuple[str, int, int, str]) -> tuple[str, int, int, str] | None:
        op, part, version, cid = item
        path = StoreId(op, part).changelog(version, cid)
        try:
            with self.fm.open(path) as f:
                header = read_header(f, f"{self.uri}/{path}")
        except FileNotFoundError:
            return None  # expired: the parent stays unknown
        except (CheckpointError, OSError) as e:
            self.result.errors.append(f"{path}: {e}")
            return None
        finally:
            self.result.reads += 1
        if header.lineage and header.lineage[0][0] == version - 1:
            return op, part, version, header.lineage[0][1]
        return None

    # -- manifests ------------------------------------------------------------------------------
    def _held_manifest(self, path: str) -> tuple[str, SnapshotManifest | None]:
        """`path` with the manifest the view already parsed from it (None: it is to be read)."""
        return path, self.view.manifest(path) if self.view is not None else None

    def _read_manifest(self, held: tuple[str, SnapshotManifest | None]) -> SnapshotObservation | str:
        path, m = held
        c = classify(path)
        assert c.operator is not None and c.partition is not None and c.version is not None and c.checkpoint_id
        store = StoreId(c.operator, c.partition)
        try:
            if m is None:  # one the inventory parsed was checked by the same `read_manifest`
                m = read_manifest(self.fm, store, c.version, c.checkpoint_id)
        except (CheckpointError, OSError) as e:
            return f"{path}: {e}"
        try:
            ssts = [(store.sst(f.remote_name), f.size) for f in m.sst_files]
        except ConfigurationError as e:
            return f"{path}: {e}"
        return SnapshotObservation(
            c.operator, c.partition, c.version, c.checkpoint_id, path, ssts, m.num_keys, m.created_at
        )

    def ingest_manifests(self, writer: SyncWriter, paths: list[str]) -> set[str]:
        """Record the snapshots of `paths` not yet known; returns the paths that could not be read."""
        todo = _unknown_snapshots(writer, paths)
        held = [self._held_manifest(p) for p in todo]
        results = self._map(self._read_manifest, held)
        self.result.reads += sum(m is None for _, m in held)
        bad: set[str] = set()
        good: list[SnapshotObservation] = []
        for path, res in zip(todo, results, strict=True):
            if isinstance(res, str):
                self.result.errors.append(res)
                bad.add(path)
                c = classify(path)
                assert c.operator is not None and c.partition is not None
                self.unreadable_stores.add((c.operator, c.partition))
            else:
                good.append(res)
        for chunk in _batched(good, 100):
            writer.add_snapshots(chunk)
        self.result.snapshots += len(good)
        return bad

    def add_files(self, writer: SyncWriter, infos: Iterable[FileInfo]) -> None:
        self.add_observations(writer, map(_observe, infos))

    def add_observations(self, writer: SyncWriter, observations: Iterable[FileObservation]) -> None:
        for batch in _batched(observations):
            writer.add_files(batch)


def _unknown_snapshots(writer: SyncWriter, paths: list[str]) -> list[str]:
    """The manifests in `paths` whose snapshot the catalog does not hold (present) yet."""
    keys = {}
    for path in paths:
        c = classify(path)
        assert c.operator is not None and c.partition is not None and c.version is not None and c.checkpoint_id
        keys[path] = (c.operator, c.partition, c.version, c.checkpoint_id)
    known = writer.known_snapshots(keys.values())
    return [p for p in paths if keys[p] not in known]


def _last_before_bad(paths: list[str], bad: set[str]) -> str | None:
    last = None
    for p in paths:
        if p in bad:
            break
        last = p
    return last


def _changelog_cursor(store: StoreId, latest: int | None) -> str | None:
    """Changelogs from version latest + 1 on: later attempts of committed versions are losing ones."""
    if not latest:
        return None
    return f"{store.changelog_dir()}{latest + 1:0{VERSION_DIGITS}d}"


def _snapshot_cursor(store: StoreId, paths: list[str], bad: set[str], previous: str | None) -> str | None:
    """Manifests from the newest listed version on (same-version manifests are listed again)."""
    cursor = previous
    for path in paths:  # ascending
        if path in bad:
            break
        c = classify(path)
        if c.version is not None:
            cursor = f"{store.snapshot_dir()}{c.version:0{VERSION_DIGITS}d}"
    return cursor


def _finish(
    catalog: Catalog, syncer: _Syncer, writer: SyncWriter, started: float, raise_on_error: bool
) -> CatalogSyncResult:
    for op, part in syncer.unreadable_stores:
        writer.freeze_store(op, part)
    stats = writer.finish()
    result = syncer.result
    result.files_listed = stats.files_seen
    result.files_new = stats.files_new
    result.files_deleted = stats.files_deleted
    result.seconds = time.perf_counter() - started
    for err in result.errors:
        log.error("catalog sync of %s: %s", result.root, err)
    if result.errors and raise_on_error:
        raise CatalogSyncError(result)
    return result


def _incremental(
    catalog: Catalog, syncer: _Syncer, started: float, raise_on_error: bool, only: frozenset[StoreId] | None
) -> CatalogSyncResult:
    writer = catalog.sync_writer(syncer.uri, full=False)
    commits_prefix = f"{COMMITS_DIR}/"
    # Every listed file goes to the catalog in one `add_files` at the end (the order of the writes does not
    # matter: states are derived in `finish`; a sync that stops half way leaves its cursors and lists again).
    listed_files = syncer._list(commits_prefix, writer.cursor(commits_prefix))
    if syncer.view is not None:
        listed_files = syncer.view.within_horizon(listed_files)
    commit_paths = [i.path for i in listed_files if classify(i.path).kind == KIND_COMMIT]
    bad_commits = syncer.ingest_commits(writer, commit_paths)
    cursors: dict[str, str] = {}
    last_commit = _last_before_bad(commit_paths, bad_commits)
    if last_commit is not None:
        cursors[commits_prefix] = last_commit
    latest = writer.latest_versions()
    stores = [StoreId(op, part) for op, part in writer.known_stores()]
    if only is not None:
        stores = [s for s in stores if s in only]

    def list_store(store: StoreId) -> tuple[StoreId, list[FileInfo], list[FileInfo]]:
        changelogs = syncer._list(store.changelog_dir(), writer.cursor(store.changelog_dir()))
        manifests = syncer._list(store.snapshot_dir(), writer.cursor(store.snapshot_dir()))
        return store, changelogs, manifests

    manifest_paths: dict[StoreId, list[str]] = {}
    for store, changelogs, manifests in syncer._map(list_store, stores):
        listed_files += changelogs
        listed_files += manifests
        manifest_paths[store] = [i.path for i in manifests if classify(i.path).kind == KIND_MANIFEST]
        cursor = _changelog_cursor(store, latest.get((store.operator, store.partition)))
        if cursor is not None:
            cursors[store.changelog_dir()] = cursor
    new_manifests = _unknown_snapshots(writer, [p for ps in manifest_paths.values() for p in ps])
    bad = syncer.ingest_manifests(writer, new_manifests)
    # The SST directory of a store is listed on its first sync and when it has a new snapshot.
    fresh = {(c.operator, c.partition) for c in map(classify, new_manifests)}
    new_manifest_stores = [
        s for s in stores if (s.operator, s.partition) in fresh or writer.cursor(s.sst_dir()) is None
    ]
    for store, paths in manifest_paths.items():
        cursor = _snapshot_cursor(store, paths, bad, writer.cursor(store.snapshot_dir()))
        if cursor is not None:
            cursors[store.snapshot_dir()] = cursor

    def list_ssts(store: StoreId) -> list[FileInfo]:
        return syncer._list(store.sst_dir())

    for store, ssts in zip(new_manifest_stores, syncer._map(list_ssts, new_manifest_stores), strict=True):
        listed_files += ssts
        cursors[store.sst_dir()] = ""  # marks the SST directory as listed once
    syncer.add_files(writer, listed_files)
    writer.set_cursors(cursors)
    return _finish(catalog, syncer, writer, started, raise_on_error)


def _full(catalog: Catalog, syncer: _Syncer, started: float, raise_on_error: bool) -> CatalogSyncResult:
    fm = syncer.fm
    writer = catalog.sync_writer(syncer.uri, full=True)
    commit_paths: list[str] = []
    manifest_paths: list[str] = []

    syncer.result.listings += 1
    # A local root gives its temp files from the same walk (duck-typed per backend, as the inventory's).
    with_temps = getattr(fm, "list_with_temp_files", None)
    published, temps = with_temps("") if callable(with_temps) else (fm.list(""), [])

    def observed() -> Iterator[FileObservation]:  # each path classified once, for the catalog and for these lists
        for info in published:
            o = _observe(info)
            if o.kind in file_kinds.NOT_CATALOGUED:  # the maintainers' leases and deployment record
                continue
            if o.kind == KIND_COMMIT:
                commit_paths.append(o.path)
            elif o.kind == KIND_MANIFEST:
                manifest_paths.append(o.path)
            yield o

    syncer.add_observations(writer, observed())
    syncer.add_observations(writer, (_observe(i, temp_listing=True) for i in temps))
    bad_commits = syncer.ingest_commits(writer, commit_paths)
    bad = syncer.ingest_manifests(writer, manifest_paths)

    # Cursors so that an incremental sync continues from here.
    cursors: dict[str, str] = {}
    last_commit = _last_before_bad(commit_paths, bad_commits)
    if last_commit is not None:
        cursors[f"{COMMITS_DIR}/"] = last_commit
    latest = writer.latest_versions()
    by_store: dict[StoreId, list[str]] = {}
    for p in manifest_paths:
        c = classify(p)
        assert c.operator is not None and c.partition is not None
        by_store.setdefault(StoreId(c.operator, c.partition), []).append(p)
    for op, part in writer.known_stores():
        store = StoreId(op, part)
        cursor = _changelog_cursor(store, latest.get((op, part)))
        if cursor is not None:
            cursors[store.changelog_dir()] = cursor
        snap_cursor = _snapshot_cursor(store, by_store.get(store, []), bad, None)
        if snap_cursor is not None:
            cursors[store.snapshot_dir()] = snap_cursor
        cursors[store.sst_dir()] = ""
    writer.set_cursors(cursors)
    return _finish(catalog, syncer, writer, started, raise_on_error)


def sync_catalog(
    catalog: Catalog,
    fm: CheckpointFileManager,
    *,
    full: bool = False,
    workers: int = 8,
    raise_on_error: bool = True,
    record_run: bool = False,
    orchestrator_run_id: str | None = None,
    stores: Iterable[StoreId] | None = None,
    view: InventoryView | None = None,
) -> CatalogSyncResult:
    """Bring the catalog of `fm`'s root up to date (incremental, or with `full` a whole listing).

    `stores` (incremental only): list the directories of these stores alone, with every new commit record
    (none: the commit records alone); for a maintainer that just wrote their files (the snapshots it made),
    not a listing of the whole fleet. A root the catalog does not know yet is listed whole all the same.
    `view` (incremental only): the caller's inventory, whose commit records and served stores are taken
    instead of listing and reading them again (`statekeeper.maintenance.sync_view`).
    """
    mode = "full" if full else "incremental"
    if full and (stores is not None or view is not None):
        raise ValueError("a full sync lists every store: stores and view are for an incremental sync")
    only = None if stores is None or catalog.find_root(fm.root_uri) is None else frozenset(stores)
    return _run(catalog, fm, mode, workers, raise_on_error, record_run, orchestrator_run_id, only, view)


def rebuild_catalog(
    catalog: Catalog,
    fm: CheckpointFileManager,
    *,
    workers: int = 8,
    raise_on_error: bool = True,
    record_run: bool = False,
    orchestrator_run_id: str | None = None,
) -> CatalogSyncResult:
    """Forget what the catalog derived from `fm`'s root, then a full sync: the catalog from the location alone.

    Maintenance run history and leases (not derived from the location) are kept.
    """
    catalog.reset_root(fm.root_uri)
    return _run(catalog, fm, "rebuild", workers, raise_on_error, record_run, orchestrator_run_id, None, None)


def _run(
    catalog: Catalog,
    fm: CheckpointFileManager,
    mode: str,
    workers: int,
    raise_on_error: bool,
    record_run: bool,
    orchestrator_run_id: str | None,
    only: frozenset[StoreId] | None,
    view: InventoryView | None,
) -> CatalogSyncResult:
    started = time.perf_counter()
    syncer = _Syncer(catalog, fm, CatalogSyncResult(fm.root_uri, mode), workers, view)

    def go() -> CatalogSyncResult:
        if mode == "incremental":
            return _incremental(catalog, syncer, started, raise_on_error, only)
        return _full(catalog, syncer, started, raise_on_error)

    if not record_run:
        return go()
    with catalog.record_run(fm.root_uri, f"catalog-{mode}", orchestrator_run_id=orchestrator_run_id) as run:
        try:
            result = go()
        finally:
            r = syncer.result
            run.files = r.files_new
            run.details = r.to_json()
            run.errors = list(r.errors)
        run.stores = len(catalog.stores(fm.root_uri))
        return result


__all__ = [
    "CatalogSyncError",
    "CatalogSyncResult",
    "Classified",
    "classify",
    "rebuild_catalog",
    "sync_catalog",
]
