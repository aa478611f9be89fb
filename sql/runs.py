"""Maintenance run records: one row per run of an operation, with what it did and how it ended.

Maintenance operations wrap their work in `Catalog.record_run`, fill in a `RunRecorder` and get a
succeeded or failed row (with counts, bytes and errors) whatever happens; Dagster sensors and
`statekeeper catalog runs` read the history back (`Catalog.runs`). Run records are not derived from the
checkpoint location, so a rebuild of the catalog keeps them.
"""

from __future__ import annotations

import datetime as dt
import traceback
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Select, or_, select, update

from statekeeper.sql.base import CatalogBase, table_of
from statekeeper.sql.errors import CatalogConfigError, NotInCatalogError
from statekeeper.sql.models import (
    RUN_FAILED,
    RUN_RUNNING,
    RUN_STATUSES,
    RUN_SUCCEEDED,
    CheckpointRoot,
    MaintenanceRun,
    utcnow,
)


@dataclass(frozen=True, slots=True)
class RunInfo:
    id: int
    root: str
    kind: str
    status: str
    dry_run: bool
    started_at: dt.datetime
    ended_at: dt.datetime | None
    orchestrator_run_id: str | None
    store_count: int
    file_count: int
    byte_count: int
    error_count: int
    errors: str | None
    details: dict[str, Any] | None

    @property
    def seconds(self) -> float | None:
        return (self.ended_at - self.started_at).total_seconds() if self.ended_at else None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "root": self.root,
            "kind": self.kind,
            "status": self.status,
            "dry_run": self.dry_run,
            "started_at": self.started_at.isoformat(),
            "ended_at": self.ended_at.isoformat() if self.ended_at else None,
            "seconds": self.seconds,
            "orchestrator_run_id": self.orchestrator_run_id,
            "stores": self.store_count,
            "files": self.file_count,
            "bytes": self.byte_count,
            "error_count": self.error_count,
            "errors": self.errors,
            "details": self.details,
        }


@dataclass
class RunRecorder:
    """Counters a maintenance operation fills in while it runs (see `Catalog.record_run`)."""

    run_id: int
    stores: int = 0
    files: int = 0
    bytes: int = 0
    errors: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    status: str | None = None
    """Leave None for succeeded (failed when `errors` is non-empty or an exception escapes)."""


class RunRecords(CatalogBase):
    """Record maintenance runs and read their history."""

    def start_run(
        self,
        uri: str,
        kind: str,
        *,
        dry_run: bool = False,
        orchestrator_run_id: str | None = None,
        started_at: dt.datetime | None = None,
    ) -> int:
        if not kind or len(kind) > 32:
            raise CatalogConfigError(f"invalid maintenance run kind {kind!r}")
        with self.write() as conn:  # the root's id read in the transaction that writes with it (`root_in`)
            rid = self.ensure_root_in(conn, uri)
            return int(
                conn.execute(
                    table_of(MaintenanceRun)
                    .insert()
                    .values(
                        root_id=rid,
                        kind=kind,
                        started_at=started_at or utcnow(),
                        status=RUN_RUNNING,
                        dry_run=dry_run,
                        orchestrator_run_id=orchestrator_run_id,
                        store_count=0,
                        file_count=0,
                        byte_count=0,
                        error_count=0,
                    )
                    .returning(table_of(MaintenanceRun).c.id)
                ).scalar_one()
            )

    def finish_run(
        self,
        run_id: int,
        *,
        status: str = RUN_SUCCEEDED,
        stores: int = 0,
        files: int = 0,
        bytes: int = 0,
        errors: Sequence[str] = (),
        details: Mapping[str, Any] | None = None,
        ended_at: dt.datetime | None = None,
    ) -> None:
        if status not in RUN_STATUSES or status == RUN_RUNNING:
            raise CatalogConfigError(f"invalid final run status {status!r}: use succeeded or failed")
        with self.write() as conn:
            n = conn.execute(
                update(MaintenanceRun)
                .where(MaintenanceRun.id == run_id)
                .values(
                    status=status,
                    ended_at=ended_at or utcnow(),
                    store_count=stores,
                    file_count=files,
                    byte_count=bytes,
                    error_count=len(errors),
                    errors="\n".join(errors) if errors else None,
                    details=dict(details) if details else None,
                )
            ).rowcount
        if n != 1:
            raise NotInCatalogError(f"maintenance run {run_id} is not in the catalog")

    @contextmanager
    def record_run(
        self, uri: str, kind: str, *, dry_run: bool = False, orchestrator_run_id: str | None = None
    ) -> Iterator[RunRecorder]:
        """Record a maintenance run around a block; an escaping exception marks it failed (and propagates)."""
        rec = RunRecorder(self.start_run(uri, kind, dry_run=dry_run, orchestrator_run_id=orchestrator_run_id))
        try:
            yield rec
        except BaseException as e:
            text = "".join(traceback.format_exception_only(type(e), e)).strip()
            self._finish_recorded(rec, RUN_FAILED, [*rec.errors, text])
            raise
        self._finish_recorded(rec, rec.status or (RUN_FAILED if rec.errors else RUN_SUCCEEDED), rec.errors)

    def _finish_recorded(self, rec: RunRecorder, status: str, errors: Sequence[str]) -> None:
        self.finish_run(
            rec.run_id,
            status=status,
            stores=rec.stores,
            files=rec.files,
            bytes=rec.bytes,
            errors=errors,
            details=rec.details,
        )

    def runs_after(
        self, uri: str, after: int, *, also: Collection[int] = (), outside_orchestrator: bool = True, limit: int = 1000
    ) -> list[RunInfo]:
        """The runs of root `uri` whose id is above `after` or in `also`, oldest first, at most `limit`;
        with `outside_orchestrator`, only those no orchestrator run recorded (the ``statekeeper`` CLI, the
        `maintain` loop). Reading on from the last id seen costs the new rows, not the whole history."""
        q = self._run_columns().where(CheckpointRoot.uri == uri)
        newer = MaintenanceRun.id > after
        q = q.where(or_(newer, MaintenanceRun.id.in_(list(also))) if also else newer)
        if outside_orchestrator:
            q = q.where(MaintenanceRun.orchestrator_run_id.is_(None))
        with self.read() as conn:
            rows: Sequence[Any] = conn.execute(q.order_by(MaintenanceRun.id).limit(limit)).all()
        return [RunInfo(*row) for row in rows]

    @staticmethod
    def _run_columns() -> Select[*tuple[Any, ...]]:  # the columns of `RunInfo`, in its order
        return select(
            MaintenanceRun.id,
            CheckpointRoot.uri,
            MaintenanceRun.kind,
            MaintenanceRun.status,
            MaintenanceRun.dry_run,
            MaintenanceRun.started_at,
            MaintenanceRun.ended_at,
            MaintenanceRun.orchestrator_run_id,
            MaintenanceRun.store_count,
            MaintenanceRun.file_count,
            MaintenanceRun.byte_count,
            MaintenanceRun.error_count,
            MaintenanceRun.errors,
            MaintenanceRun.details,
        ).join(CheckpointRoot, CheckpointRoot.id == MaintenanceRun.root_id)

    def runs(
        self,
        uri: str | None = None,
        *,
        kind: str | None = None,
        status: str | None = None,
        limit: int = 100,
    ) -> list[RunInfo]:
        """Maintenance run history, newest first."""
        q = self._run_columns()
        if uri is not None:
            q = q.where(CheckpointRoot.uri == uri)
        if kind is not None:
            q = q.where(MaintenanceRun.kind == kind)
        if status is not None:
            q = q.where(MaintenanceRun.status == status)
        q = q.order_by(MaintenanceRun.started_at.desc(), MaintenanceRun.id.desc()).limit(limit)
        with self.read() as conn:
            rows: Sequence[Any] = conn.execute(q).all()
        return [RunInfo(*row) for row in rows]
