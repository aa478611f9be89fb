"""Deleting planned files: validated first, then in parallel batches through the file manager.

Every path is checked before the first deletion (relative, inside the root, in the statekeeper
layout, not foreign), so a bad plan or argument deletes nothing (DESIGN invariants 4 and 7).
Incomplete S3 multipart uploads are aborted instead of deleted.

The catalog hears about it through `CatalogMarks`, in few statements: a store's files are marked
expired in one statement before the first of them is deleted, and what went is marked deleted once
per run (the catalog is derived from the checkpoint location, invariant 6: a crash before that
statement leaves rows a sync corrects, as a crash between a deletion and its statement always did).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from statekeeper.maintenance.file_kinds import FOREIGN, MANIFEST, SST, TEMP, UPLOAD, FileEntry, classify
from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.plan import RootPlan, StorePlan, plan_root
from statekeeper.maintenance.reports import DeletionReport
from statekeeper.maintenance.root_leases import LeaseLostError
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.workers import run_each
from statekeeper.store.errors import ConfigurationError
from statekeeper.store.files import CheckpointFileManager, DeleteResult
from statekeeper.store.files.paths import validate_relative_path
from statekeeper.store.layout import StoreId

if TYPE_CHECKING:
    from statekeeper.sql.catalog import Catalog

log = logging.getLogger(__name__)


@dataclass
class DeleteOutcome:
    deleted: list[FileEntry] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stopped: bool = False
    """Something failed: steps that depend on every deletion having happened must not run."""

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self.deleted)

    def merge(self, other: DeleteOutcome) -> None:
        self.deleted.extend(other.deleted)
        self.errors.extend(other.errors)
        self.stopped = self.stopped or other.stopped


class DeletionFencedError(LeaseLostError):
    """A lost lease stopped deletions part way (fencing, invariant 15): `outcome` is what went before it was found
    lost (and in the batches in flight then), so that a report counts every file the run did delete."""

    def __init__(self, lost: LeaseLostError, outcome: DeleteOutcome) -> None:
        super().__init__(str(lost))
        self.outcome = outcome


class CatalogMarks:
    """What one maintenance run tells the catalog about the files it deletes (thread-safe).

    `expiring` writes at once (the catalog must know before the files go), each file once per run: a run
    that marked many stores' files together before deleting store by store writes nothing more for them;
    `deleted` collects, and `flush` writes everything collected in one statement.
    """

    def __init__(self, catalog: Catalog, root_uri: str) -> None:
        self.catalog = catalog
        self.root_uri = root_uri
        self._expiring: set[str] = set()
        self._deleted: list[str] = []
        self._lock = threading.Lock()

    def expiring(self, entries: Sequence[FileEntry]) -> None:
        with self._lock:
            paths = [e.path for e in entries if e.path not in self._expiring]
        if paths:
            self.catalog.mark_expired(self.root_uri, paths)
            with self._lock:
                self._expiring.update(paths)

    def deleted(self, entries: Sequence[FileEntry]) -> None:
        with self._lock:
            self._deleted.extend(e.path for e in entries)

    def flush(self) -> None:
        with self._lock:
            paths, self._deleted = self._deleted, []
        if paths:
            self.catalog.mark_deleted(self.root_uri, paths)


@contextmanager
def catalog_marks(catalog: Catalog | None, root_uri: str) -> Iterator[CatalogMarks | None]:
    """`CatalogMarks` of a run over `root_uri` (None without a catalog), flushed when the block ends,
    also when it raises (what was deleted is gone either way)."""
    if catalog is None:
        yield None
        return
    marks = CatalogMarks(catalog, root_uri)
    try:
        yield marks
    finally:
        marks.flush()


def validate_deletable(entries: Sequence[FileEntry]) -> None:
    """Raise `ConfigurationError` naming the first path maintenance must not delete."""
    for e in entries:
        if not isinstance(e.path, str) or e.path.startswith("/") or ".." in e.path.split("/"):
            raise ConfigurationError(f"refusing to delete {e.path!r}: it is not a path inside the checkpoint root")
        try:
            validate_relative_path(e.path, allow_temp=e.kind == TEMP)
        except ConfigurationError as err:
            raise ConfigurationError(f"refusing to delete {e.path!r}: {err}") from None
        k = classify(e.path, temp_listing=e.kind == TEMP)
        if FOREIGN in (e.kind, k.kind):
            raise ConfigurationError(f"refusing to delete {e.path!r}: not a file of the statekeeper layout")
        if e.kind not in (UPLOAD, k.kind):
            raise ConfigurationError(f"refusing to delete {e.path!r}: it is a {k.kind} file, the plan says {e.kind}")
        if e.kind == UPLOAD and not e.upload_id:
            raise ConfigurationError(f"refusing to abort the upload of {e.path!r}: no upload id")


def delete_entries(
    fm: CheckpointFileManager,
    entries: Sequence[FileEntry],
    *,
    batch_size: int,
    pool: ThreadPoolExecutor | None = None,
    check: Callable[[], None] | None = None,
) -> DeleteOutcome:
    """Delete `entries` in batches of `batch_size` (in parallel on `pool`); `check()` runs before each batch.

    A failing request stops the batches not yet started; what went and what failed is in the outcome
    (`stopped` tells the caller to skip dependent steps). A lost lease (`check` raising `LeaseLostError`,
    the fencing of invariant 15) stops them too and is raised once the batches in flight are done, as a
    `DeletionFencedError` holding what went before.
    """
    validate_deletable(entries)
    outcome = DeleteOutcome()
    uploads = [e for e in entries if e.kind == UPLOAD]
    files = [e for e in entries if e.kind != UPLOAD]
    by_path = {e.path: e for e in files}
    batches = [files[i : i + batch_size] for i in range(0, len(files), batch_size)]
    stop = threading.Event()
    lost: list[LeaseLostError] = []

    def run(batch: list[FileEntry]) -> DeleteResult | str:
        if stop.is_set():
            return f"skipped {len(batch)} file(s) after an earlier failure"
        try:
            if check is not None:
                check()
            return fm.delete_many([e.path for e in batch])
        except LeaseLostError as e:
            stop.set()
            lost.append(e)
            return str(e)
        except Exception as e:
            stop.set()
            return f"delete batch of {len(batch)} file(s) failed: {e}"

    if pool is None or len(batches) <= 1:
        results = [run(b) for b in batches]
    else:
        futures: list[Future[DeleteResult | str]] = [pool.submit(run, b) for b in batches]
        results = [f.result() for f in futures]
    for r in results:
        if isinstance(r, str):
            outcome.errors.append(r)
            continue
        outcome.deleted.extend(by_path[p] for p in r.deleted if p in by_path)
        outcome.errors.extend(f"cannot delete {p}: {why}" for p, why in sorted(r.errors.items()))
    if lost:
        raise DeletionFencedError(lost[0], outcome)
    abort = getattr(fm, "abort_incomplete_upload", None)
    for e in uploads:
        if stop.is_set():
            break
        if check is not None:
            try:
                check()
            except LeaseLostError as err:
                raise DeletionFencedError(err, outcome) from None
        try:
            if not callable(abort):
                raise ConfigurationError("the checkpoint backend has no multipart uploads")
            abort(e.path, e.upload_id)
        except Exception as err:
            outcome.errors.append(f"cannot abort the incomplete upload of {e.path}: {err}")
        else:
            outcome.deleted.append(e)
    outcome.stopped = stop.is_set() or bool(outcome.errors)
    return outcome


@dataclass(frozen=True)
class Deleter:
    """How one maintenance run deletes planned files: through `fm`, in batches of the settings' size on
    `pool`, telling the catalog through `marks` (if any) what went and, with `mark_expired`, what is
    about to go, and `inventory` (if any) what is gone, so its views of the stores stay true without a
    listing."""

    fm: CheckpointFileManager
    marks: CatalogMarks | None
    settings: MaintenanceSettings
    pool: ThreadPoolExecutor | None
    mark_expired: bool
    inventory: Inventory | None = None

    def delete(self, entries: Sequence[FileEntry], check: Callable[[], None] | None = None) -> DeleteOutcome:
        """`delete_entries`, with the catalog told; `check()` (a lease's) runs before each batch."""
        return self._delete(entries, check, mark_expired=self.mark_expired)

    def expiring(self, entries: Sequence[FileEntry]) -> None:
        """Refuse `entries` unless all are deletable; with `mark_expired`, then tell the catalog they are about
        to go (one statement for those this run has not marked yet)."""
        validate_deletable(entries)
        if self.marks is not None and self.mark_expired:
            self.marks.expiring(entries)

    def delete_in_order(self, entries: Sequence[FileEntry], check: Callable[[], None] | None = None) -> DeleteOutcome:
        """Manifests, then SSTs (kept if a manifest could not be deleted), then everything else.

        So no manifest that survives a failure or crash ever names a deleted SST. Nothing goes unless all of
        `entries` are deletable; with `mark_expired`, they are marked expired first (`expiring`).
        """
        self.expiring(entries)
        outcome = DeleteOutcome()
        manifests = [e for e in entries if e.kind == MANIFEST]
        ssts = [e for e in entries if e.kind == SST]
        rest = [e for e in entries if e.kind not in (MANIFEST, SST)]
        try:
            first = self._delete(manifests, check, mark_expired=False)
            outcome.merge(first)
            if first.stopped:
                outcome.errors.append(f"kept {len(ssts)} SST file(s): a manifest could not be deleted")
                outcome.stopped = True
            else:
                outcome.merge(self._delete(ssts, check, mark_expired=False))
            outcome.merge(self._delete(rest, check, mark_expired=False))
        except DeletionFencedError as e:  # what the earlier steps deleted went all the same
            outcome.merge(e.outcome)
            raise DeletionFencedError(e, outcome) from None
        return outcome

    def delete_fenced(
        self, entries: Sequence[FileEntry], check: Callable[[], None] | None = None, *, in_order: bool = False
    ) -> DeleteOutcome:
        """`delete` (`delete_in_order` with `in_order`), a lost lease an error of the outcome instead of raised:
        what went before it was found lost is in the outcome, and nothing more goes."""
        try:
            return self.delete_in_order(entries, check) if in_order else self.delete(entries, check)
        except DeletionFencedError as e:
            if str(e) not in e.outcome.errors:  # a batch that found it lost named it already
                e.outcome.errors.append(str(e))
            e.outcome.stopped = True
            return e.outcome

    def _delete(
        self, entries: Sequence[FileEntry], check: Callable[[], None] | None, *, mark_expired: bool
    ) -> DeleteOutcome:
        if not entries:
            return DeleteOutcome()
        if mark_expired:
            self.expiring(entries)
        try:
            out = delete_entries(
                self.fm, entries, batch_size=self.settings.delete_batch_size, pool=self.pool, check=check
            )
        except BaseException as e:
            went = e.outcome.deleted if isinstance(e, DeletionFencedError) else []
            if self.inventory is not None:
                self.inventory.deleted(entries, went, failed=True)
            if self.marks is not None and went:
                self.marks.deleted(went)
            raise
        if self.inventory is not None:
            self.inventory.deleted(entries, out.deleted, failed=bool(out.errors))
        if self.marks is not None and out.deleted:
            self.marks.deleted(out.deleted)
        return out


R = TypeVar("R")


@contextmanager
def run_deleter(
    fm: CheckpointFileManager,
    catalog: Catalog | None,
    settings: MaintenanceSettings,
    *,
    mark_expired: bool,
    name: str,
    inventory: Inventory | None = None,
) -> Iterator[Deleter]:
    """The `Deleter` of one run: a pool of `settings.parallelism` threads named `name`, and the catalog's
    marks, flushed when the block ends; it keeps `inventory`'s views true of what it deletes."""
    with (
        ThreadPoolExecutor(max_workers=settings.parallelism, thread_name_prefix=name) as pool,
        catalog_marks(catalog, fm.root_uri) as marks,
    ):
        yield Deleter(fm, marks, settings, pool, mark_expired=mark_expired, inventory=inventory)


def each_store(
    plans: Sequence[StorePlan],
    fn: Callable[[StoreId], R],
    report: DeletionReport,
    *,
    parallelism: int,
    progress: bool,
    desc: str,
) -> list[tuple[StorePlan, R]]:
    """`fn(store)` for every plan's store, `parallelism` at once; a store that raised is named in the
    report's errors and left out of the result (one store's failure does not stop the others)."""
    results = run_each([p.store for p in plans], fn, parallelism=parallelism, progress=progress, desc=desc)
    done: list[tuple[StorePlan, R]] = []
    for p, res in zip(plans, results, strict=True):
        if isinstance(res, Exception):
            report.error(f"store {p.store}: {res}")
        else:
            done.append((p, res))
    return done


def plan_deletions(
    inv: Inventory, settings: MaintenanceSettings, wanted: list[StoreId] | None, report: DeletionReport
) -> tuple[RootPlan, list[StorePlan]]:
    """The root's plan and the plans of the `wanted` stores (None: every store) for expiry or orphan
    cleanup, with the root's problems and warnings, and every blocked store, in `report`."""
    root = plan_root(inv, settings, all_stores=wanted is None)
    plans = [p for s, p in root.stores.items() if wanted is None or s in wanted]
    report.stores = len(plans)
    for text in root.problems:
        report.error(text)
    for text in root.warnings:
        report.warn(text)
    for p in plans:
        if p.blocked:
            report.blocked(p.problems)
    return root, plans


__all__ = [
    "CatalogMarks",
    "DeleteOutcome",
    "Deleter",
    "DeletionFencedError",
    "catalog_marks",
    "delete_entries",
    "each_store",
    "plan_deletions",
    "run_deleter",
    "validate_deletable",
]
