"""Where per-store maintenance work runs: this process's pool, or elsewhere (Spark executors).

Snapshot creation and verification plan on the driver (one inventory, one recorded run) and then do
the same thing to each of many stores. That per-store step is the seam: the operation hands a
:class:`StoreExecutor` a picklable :class:`StoreTask` (what to do, to which root, with which
settings) and the stores, plus the step as a closure over its live file manager, inventory and
catalog. :class:`InProcess` runs the closure on a bounded pool; `statekeeper.maintenance.fanout`'s
Spark engine ships the task to executors, which open the root and the catalog themselves and run the
same step. Either way the result is one JSON-able row per store, which the operation accounts into
its report exactly once, so the frames (planning, recording, catalog sync) exist once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.workers import run_each
from statekeeper.store.layout import StoreId

if TYPE_CHECKING:
    from statekeeper.sql.catalog import Catalog

Row = dict[str, Any]
"""One store's outcome: JSON-able, with at least "store" (``operator/partition``)."""

StoreStep = Callable[[StoreId], Row]
"""The per-store step over this process's live objects (it never raises: failures are rows)."""


@dataclass(frozen=True)
class StoreTask:
    """What every store of a run gets done to, in a form that travels to another process.

    Never a live client or connection: a remote executor opens the root (`root`) and the catalog
    (`catalog_url`, which carries its password and so is never shown in a repr) itself.
    """

    operation: str
    """"snapshot" or "verify"."""
    root: str
    settings: MaintenanceSettings
    catalog_url: str | None = field(default=None, repr=False)
    options: Mapping[str, Any] = field(default_factory=dict)
    """Operation options as plain values (verify: `statekeeper.maintenance.verify.VerifyOptions`; snapshot:
    ``due_at``, store name -> the version its snapshot was requested at)."""


class StoreExecutor(Protocol):
    """Runs a task's step for each store and returns their rows by store (missing: no result came back)."""

    def run_stores(self, task: StoreTask, stores: Sequence[StoreId], step: StoreStep) -> dict[StoreId, Row]: ...


@dataclass(frozen=True)
class InProcess:
    """The default executor: `step` on a pool of `parallelism` threads here, with a progress bar; with `lane`
    (the build process of a store), the threads are shared out among the lanes (`run_each`)."""

    parallelism: int
    progress: bool = False
    lane: Callable[[StoreId], int] | None = None

    def run_stores(self, task: StoreTask, stores: Sequence[StoreId], step: StoreStep) -> dict[StoreId, Row]:
        results = run_each(
            stores, step, parallelism=self.parallelism, progress=self.progress, desc=task.operation, lane=self.lane
        )
        rows: dict[StoreId, Row] = {}
        for store, res in zip(stores, results, strict=True):
            # a step turns its failures into rows; anything else escaping it is a bug, still reported by name
            rows[store] = {"store": str(store), "error": str(res)} if isinstance(res, Exception) else res
        return rows


def catalog_url(catalog: Catalog | None) -> str | None:
    """The catalog's URL with its password, for executors that connect to the same database (never logged)."""
    return None if catalog is None else catalog.engine.url.render_as_string(hide_password=False)


def parse_store(name: str) -> StoreId:
    """The store of a row's "store" field (``operator/partition``)."""
    operator, _, partition = name.rpartition("/")
    return StoreId(operator, int(partition))


__all__ = ["InProcess", "Row", "StoreExecutor", "StoreStep", "StoreTask", "catalog_url", "parse_store"]
