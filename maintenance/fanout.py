"""Snapshot and verify over many stores as one Spark job, for fleets beyond one maintenance process.

The operations stay :func:`statekeeper.maintenance.snapshot_builds.create_snapshots` and
:func:`statekeeper.maintenance.verify.verify_root`: the driver lists the root, plans, records the run and
syncs the catalog as the one-process engine does. :class:`SparkEngine` is only their per-store
executor (`statekeeper.maintenance.executors`): the stores to work on are distributed over Spark's
executors (``mapInArrow`` over a DataFrame of store names, so it runs on a classic session and over
Spark Connect alike). Each task opens the checkpoint root and the catalog itself and runs the same
per-store step on its stores one at a time -- a snapshot under the store's catalog lease (invariant 5
holds across machines, since the lease lives in the shared database) -- returning one JSON row per store.

Executors need the ``[maintenance]`` extra and access to the checkpoint root and the catalog database
(a file SQLite catalog works only when every executor sees the same file, e.g. on one machine).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from statekeeper.maintenance.executors import Row, StoreStep, StoreTask, parse_store
from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.reports import SnapshotReport, VerifyReport
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_builds import create_snapshots, snapshot_row
from statekeeper.maintenance.verify import VerifyOptions, verify_root, verify_row
from statekeeper.store.errors import ConfigurationError
from statekeeper.store.extras import require
from statekeeper.store.files import CheckpointFileManager, open_file_manager
from statekeeper.store.layout import StoreId

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from statekeeper.sql.catalog import Catalog

log = logging.getLogger(__name__)

ENGINES = ("local", "spark")
RESULT_SCHEMA = "result string"


@dataclass(frozen=True)
class SparkEngine:
    """Where fanned-out maintenance runs: a Spark master URL (``spark://host:7077``, ``local[4]``, ...),
    a Spark Connect URL (``sc://host:15002``), or None for the active session. ``tasks`` caps the
    number of tasks (default: one per store, at most 1000). A per-store executor
    (`statekeeper.maintenance.executors.StoreExecutor`) for `create_snapshots` and `verify_root`."""

    master: str | None = None
    conf: Mapping[str, str] = field(default_factory=dict)
    tasks: int | None = None
    app_name: str = "statekeeper-maintenance"

    def session(self) -> SparkSession:
        require(("pyspark",), "spark", "maintenance on Spark (--engine spark)")
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.appName(self.app_name)
        if self.master is not None and self.master.startswith("sc://"):
            builder = builder.remote(self.master)
        elif self.master is not None:
            builder = builder.master(self.master)
        for key, value in self.conf.items():
            builder = builder.config(key, value)
        return builder.getOrCreate()

    def partitions(self, stores: int) -> int:
        return max(1, min(stores, self.tasks or 1000))

    def run_stores(self, task: StoreTask, stores: Sequence[StoreId], step: StoreStep) -> dict[StoreId, Row]:
        """Ship `task` to Spark's executors, one row per store back (`step` is the driver's: not used)."""
        if not stores:
            return {}
        spark = self.session()
        df = spark.createDataFrame([(str(s),) for s in stores], "store string")
        df = df.repartition(self.partitions(len(stores)))
        rows = df.mapInArrow(functools.partial(_run_task, task), RESULT_SCHEMA).collect()
        by_store = {}
        for r in rows:
            row = json.loads(r[0])
            by_store[parse_store(row["store"])] = row
        return by_store


def _run_task(task: StoreTask, batches: Iterator[Any]) -> Iterator[Any]:
    """One Spark task: open the root (and the catalog), run the task's step on each store of its rows."""
    import pyarrow as pa

    stores = [parse_store(name) for batch in batches for name in batch.column(0).to_pylist()]
    if not stores:
        return
    fm = open_file_manager(task.root)
    catalog = _open_catalog(task.catalog_url)
    try:
        verifying = task.operation == "verify"
        due_at: Mapping[str, int] = task.options.get("due_at", {})
        inv = Inventory.scan(fm, parallelism=1, stores=stores, use_cache=not verifying)
        settings = task.settings.with_(build_processes=0)  # the executors are the build processes here
        results = []
        for store in stores:
            if verifying:
                row = verify_row(fm, inv, store, settings, VerifyOptions(**task.options))
            else:
                row = snapshot_row(fm, inv, store, settings, catalog, due_at.get(str(store)))
            results.append(json.dumps(row, default=str))
        yield pa.RecordBatch.from_pydict({"result": results})
    finally:
        if catalog is not None:
            catalog.close()


def _open_catalog(url: str | None) -> Catalog | None:
    if url is None:
        return None
    from statekeeper.sql.catalog import Catalog

    return Catalog.open(url)


def create_snapshots_on_spark(
    fm: CheckpointFileManager, settings: MaintenanceSettings, engine: SparkEngine, **kwargs: Any
) -> SnapshotReport:
    """:func:`statekeeper.maintenance.snapshot_builds.create_snapshots` with the stores' snapshots built on Spark
    executors (same keyword arguments; `progress` bars are not shown)."""
    return create_snapshots(fm, settings, executor=engine, **kwargs)


def verify_root_on_spark(
    fm: CheckpointFileManager, settings: MaintenanceSettings, engine: SparkEngine, **kwargs: Any
) -> VerifyReport:
    """:func:`statekeeper.maintenance.verify.verify_root` with the stores verified on Spark executors; read-only."""
    return verify_root(fm, settings, executor=engine, **kwargs)


def check_engine(name: str, master: str | None) -> SparkEngine | None:
    """The engine for `--engine NAME --master URL`: None for the one-process engine."""
    if name not in ENGINES:
        raise ConfigurationError(f"unknown maintenance engine {name!r}: expected one of {', '.join(ENGINES)}")
    if name == "local":
        if master is not None:
            raise ConfigurationError("--master needs --engine spark")
        return None
    return SparkEngine(master=master)


def snapshot_operation(engine: str, master: str | None) -> Callable[..., SnapshotReport]:
    """`create_snapshots` for engine 'local', its Spark fan-out for 'spark' (same keyword arguments)."""
    spark = check_engine(engine, master)
    return create_snapshots if spark is None else functools.partial(create_snapshots_on_spark, engine=spark)


def verify_operation(engine: str, master: str | None) -> Callable[..., VerifyReport]:
    """`verify_root` for engine 'local', its Spark fan-out for 'spark' (same keyword arguments)."""
    spark = check_engine(engine, master)
    return verify_root if spark is None else functools.partial(verify_root_on_spark, engine=spark)


__all__ = [
    "ENGINES",
    "SparkEngine",
    "check_engine",
    "create_snapshots_on_spark",
    "snapshot_operation",
    "verify_operation",
    "verify_root_on_spark",
]
