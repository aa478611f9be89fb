"""Reports of maintenance operations: counts for dashboards, rows for people, JSON for tools.

Every report has `kind`, `stores`, `files`, `bytes`, `seconds`, `errors` (a run with errors failed)
and `warnings` (worth a look, never a failure: someone else's files under the root); `metadata()` gives every
numeric field (what Dagster plots), `rows()` a table of what the run did per store or per file.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

from statekeeper.maintenance.file_kinds import (
    BATCH,
    CHANGELOG,
    COMMIT,
    HEARTBEAT,
    MANIFEST,
    SST,
    TEMP,
    UPLOAD,
    FileEntry,
)

if TYPE_CHECKING:
    from statekeeper.sql.catalog import Catalog

log = logging.getLogger(__name__)

_NOT_METADATA = frozenset({"kind", "root", "errors", "warnings", "items", "run_id", "dry_run"})
STATE_FIELDS = frozenset({"retained_versions", "blocked_stores", "kept_in_flight", "foreign_files"})
"""Numbers that describe the root as a run found it, not work it did: what several runs found together is the
newest run's number, never their sum (every run of a root finds the same foreign file again)."""


@dataclass
class Report:
    kind: str
    root: str
    dry_run: bool = False
    stores: int = 0
    """Stores examined."""
    files: int = 0
    """Files acted on (deleted, uploaded or checked; with dry_run: that would be)."""
    bytes: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """Reported, never a failure (foreign files outside every store)."""
    items: list[dict[str, Any]] = field(default_factory=list)
    run_id: int | None = None
    """The catalog's id of the recorded maintenance run, if one was recorded."""

    @property
    def ok(self) -> bool:
        return not self.errors

    def error(self, text: str) -> None:
        log.error("%s of %s: %s", self.kind, self.root, text)
        self.errors.append(text)

    def warn(self, text: str) -> None:
        log.warning("%s of %s: %s", self.kind, self.root, text)
        self.warnings.append(text)

    def metadata(self) -> dict[str, int | float]:
        """Every numeric field, plus the error count (for Dagster's metadata plots)."""
        out: dict[str, int | float] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _NOT_METADATA or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            out[f.name] = value
        out["errors"] = len(self.errors)
        out["warnings"] = len(self.warnings)
        out["dry_run"] = int(self.dry_run)
        return out

    def rows(self) -> list[dict[str, Any]]:
        return list(self.items)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "root": self.root,
            "dry_run": self.dry_run,
            "ok": self.ok,
            **{k: v for k, v in self.metadata().items() if k not in ("dry_run", "errors", "warnings")},
            "errors": list(self.errors),
            "error_count": len(self.errors),
            "warnings": list(self.warnings),
            "warning_count": len(self.warnings),
            "run_id": self.run_id,
            "rows": self.rows(),
        }

    def done(self) -> str:
        """What the run did, for `summary`."""
        verb = "would act on" if self.dry_run else "acted on"
        return f"{verb} {self.files} file(s), {self.bytes:,} bytes"

    def summary(self) -> str:
        text = f"{self.kind} {self.root}: {self.stores} store(s), {self.done()} in {self.seconds:.2f}s"
        text += f"; {len(self.errors)} error(s)" if self.errors else ""
        return text + (f"; {len(self.warnings)} warning(s)" if self.warnings else "")


@dataclass
class SnapshotReport(Report):
    kind: str = "snapshot"
    root: str = ""
    candidates: int = 0
    """Stores whose chain since their last snapshot reached the threshold."""
    snapshots: int = 0
    """Snapshots written."""
    changelogs_replayed: int = 0
    records_replayed: int = 0
    warm_builds: int = 0
    """Stores built from a warm local copy (only changelogs newer than it replayed)."""
    cold_builds: int = 0
    """Stores restored from a snapshot (or replayed from version 1) first."""
    ssts_uploaded: int = 0
    ssts_reused: int = 0
    max_chain_length: int = 0
    """Longest chain since a snapshot of any store before this run."""

    def done(self) -> str:
        # a dry run builds nothing: the files and bytes the builds would write are not known
        return f"would snapshot {self.candidates}" if self.dry_run else super().done()


@dataclass
class DeletionReport(Report):
    """What expiry and orphan cleanup both report: the files they delete, counted by kind, and the stores
    a problem kept them from touching."""

    changelogs: int = 0
    manifests: int = 0
    ssts: int = 0
    batch_files: int = 0
    """The Spark driver's batch files."""
    blocked_stores: int = 0
    """Stores left untouched because of a problem (named in errors)."""

    COUNTERS: ClassVar[Mapping[str, str]] = {
        CHANGELOG: "changelogs",
        MANIFEST: "manifests",
        SST: "ssts",
        BATCH: "batch_files",
    }
    """File kind -> the field that counts files of that kind."""

    def count(self, entry: FileEntry, row: dict[str, Any]) -> None:
        """One file deleted (or that would be, on a dry run): counted by kind and size, and listed as `row`."""
        self.files += 1
        self.bytes += entry.size
        name = self.COUNTERS.get(entry.kind)
        if name is not None:
            setattr(self, name, getattr(self, name) + 1)
        self.items.append(row)

    def blocked(self, problems: Iterable[str]) -> None:
        """A store left untouched: counted, its problems named in the errors."""
        self.blocked_stores += 1
        for text in problems:
            self.error(text)


@dataclass
class ExpiryReport(DeletionReport):
    kind: str = "expire"
    root: str = ""
    commit_records: int = 0
    retained_versions: int = 0
    catalog_rows_pruned: int = 0
    """Rows of the catalog's history past `catalog_history_seconds` that this run dropped."""

    COUNTERS: ClassVar[Mapping[str, str]] = {**DeletionReport.COUNTERS, COMMIT: "commit_records"}


@dataclass
class OrphanReport(DeletionReport):
    kind: str = "clean-orphans"
    root: str = ""
    temp_files: int = 0
    incomplete_uploads: int = 0
    heartbeats: int = 0
    """Stale heartbeats of Spark drivers that were killed."""
    kept_in_flight: int = 0
    """Files that are not needed but may still be being written (younger than the grace period or
    of a version newer than the newest commit)."""
    foreign_files: int = 0

    COUNTERS: ClassVar[Mapping[str, str]] = {
        **DeletionReport.COUNTERS,
        TEMP: "temp_files",
        UPLOAD: "incomplete_uploads",
        HEARTBEAT: "heartbeats",
    }


@dataclass
class VerifyReport(Report):
    kind: str = "verify"
    root: str = ""
    versions: int = 0
    """Retained versions checked."""
    stores_ok: int = 0
    stores_failed: int = 0
    changelogs: int = 0
    snapshots: int = 0
    ssts: int = 0
    rebuilt: int = 0
    """Snapshots compared with a replay of their changelogs (and latest versions loaded), with rebuild."""


@contextmanager
def recorded(catalog: Catalog | None, report: Report, *, orchestrator_run_id: str | None = None) -> Iterator[Report]:
    """Run an operation's block as one maintenance run: timed into `report.seconds` however it ends,
    recorded in the catalog when there is one (the catalog marks it failed on errors), summarized on
    the log when it ends without an exception."""
    t0 = time.perf_counter()
    with _recorded_in(catalog, report, orchestrator_run_id):
        try:
            yield report
        finally:
            report.seconds = time.perf_counter() - t0
    log.info(report.summary())


@contextmanager
def _recorded_in(catalog: Catalog | None, report: Report, orchestrator_run_id: str | None) -> Iterator[None]:
    if catalog is None:
        yield
        return
    with catalog.record_run(
        report.root, report.kind, dry_run=report.dry_run, orchestrator_run_id=orchestrator_run_id
    ) as run:
        report.run_id = run.run_id
        try:
            yield
        finally:
            run.stores = report.stores
            run.files = report.files
            run.bytes = report.bytes
            run.errors = list(report.errors)
            run.details = {k: v for k, v in report.metadata().items() if k not in ("stores", "files", "bytes")}


__all__ = [
    "STATE_FIELDS",
    "DeletionReport",
    "ExpiryReport",
    "OrphanReport",
    "Report",
    "SnapshotReport",
    "VerifyReport",
    "recorded",
]
