"""Snapshot and verify over many stores as one Spark job, for fleets beyond one maintenance process.

The driver lists the root and plans as :func:`statekeeper.maintenance.snapshots.create_snapshots` and
:func:`statekeeper.maintenance.verify.verify_root` do; the stores to work on are then distributed over Spark's
executors (``mapInArrow`` over a DataFrame of store names, so it runs on a classic session and over
Spark Connect alike). Each task opens the checkpoint root and the catalog itself, works on its stores
one at a time -- a snapshot under the store's catalog lease (invariant 5 holds across machines, since
the lease lives in the shared database) -- and returns one JSON row per store. The driver gathers the
rows into the same report the one-process engine produces, recorded in the catalog as one run, and
syncs the catalog so it knows the new snapshots.

Executors need the ``[maintenance]`` extra and access to the checkpoint root and the catalog database
(a file SQLite catalog works only when every executor sees the same file, e.g. on one machine).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.plan import plan_store
from statekeeper.maintenance.reports import SnapshotReport, VerifyReport, recorded
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshots import (
    account_snapshot,
    check_work_dir,
    create_snapshots,
    snapshot_store,
    sync_after_snapshots,
)
from statekeeper.maintenance.verify import StoreVerification, account_verification, verify_root, verify_store
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
    number of tasks (default: one per store, at most 1000)."""

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


@dataclass(frozen=True)
class _TaskSpec:
    """What every task gets (pickled into the closure): never a live client or connection."""

    operation: str
    root: str
    settings: MaintenanceSettings
    catalog_url: str | None
    rebuild: bool = False
    checksums: bool = True


def _run_task(spec: _TaskSpec, batches: Iterator[Any]) -> Iterator[Any]:
    """One Spark task: work on each store of its rows, yield one JSON result row per store."""
    import pyarrow as pa

    stores = [_parse_store(name) for batch in batches for name in batch.column(0).to_pylist()]
    if not stores:
        return
    fm = open_file_manager(spec.root)
    catalog = _open_catalog(spec.catalog_url) if spec.operation == "snapshot" else None
    try:
        inv = Inventory.scan(fm, parallelism=1, stores=stores, use_cache=spec.operation != "verify")
        results = []
        for store in stores:
            if spec.operation == "snapshot":
                try:
                    row = snapshot_store(fm, inv, store, spec.settings, catalog)
                except Exception as e:
                    log.debug("snapshot of store %s failed", store, exc_info=True)
                    row = {"store": str(store), "action": "failed", "error": str(e)}
            else:
                try:
                    res = verify_store(fm, inv, store, spec.settings, rebuild=spec.rebuild, checksums=spec.checksums)
                except Exception as e:
                    res = StoreVerification(store, [f"store {store}: verification failed: {e}"])
                row = {**asdict(res), "store": str(store)}
            results.append(json.dumps(row, default=str))
        yield pa.RecordBatch.from_pydict({"result": results})
    finally:
        if catalog is not None:
            catalog.close()


def _parse_store(name: str) -> StoreId:
    operator, _, partition = name.rpartition("/")
    return StoreId(operator, int(partition))


def _open_catalog(url: str | None) -> Catalog | None:
    if url is None:
        return None
    from statekeeper.sql.catalog import Catalog

    return Catalog.open(url)


def _fan_out(engine: SparkEngine, spec: _TaskSpec, stores: list[StoreId]) -> list[dict[str, Any]]:
    if not stores:
        return []
    spark = engine.session()
    df = spark.createDataFrame([(str(s),) for s in stores], "store string")
    df = df.repartition(engine.partitions(len(stores)))
    rows = df.mapInArrow(functools.partial(_run_task, spec), RESULT_SCHEMA).collect()
    return [json.loads(r[0]) for r in rows]


def _catalog_url(catalog: Catalog | None) -> str | None:
    """The catalog's URL with its password: the executors connect to the same database (never logged)."""
    return None if catalog is None else catalog.engine.url.render_as_string(hide_password=False)


def create_snapshots_on_spark(
    root_uri: str | CheckpointFileManager,
    settings: MaintenanceSettings,
    engine: SparkEngine,
    *,
    catalog: Catalog | None = None,
    orchestrator_run_id: str | None = None,
    dry_run: bool = False,
    progress: bool = False,
    stores: Iterable[StoreId] | None = None,
) -> SnapshotReport:
    """:func:`statekeeper.maintenance.snapshots.create_snapshots`, with the stores' snapshots built on Spark executors.

    A dry run only plans (on the driver, as the one-process engine does); `progress` bars are not shown.
    """
    if dry_run:
        return create_snapshots(
            root_uri, settings, catalog=catalog, orchestrator_run_id=orchestrator_run_id, dry_run=True, stores=stores
        )
    t0 = time.perf_counter()
    fm = open_file_manager(root_uri) if isinstance(root_uri, str) else root_uri
    check_work_dir(fm, settings)
    wanted = None if stores is None else list(stores)
    report = SnapshotReport(root=fm.root_uri)
    with recorded(catalog, report, orchestrator_run_id=orchestrator_run_id):
        try:
            inv = Inventory.scan(fm, parallelism=settings.parallelism, stores=wanted)
            plans = [plan_store(inv, s, settings) for s in (wanted if wanted is not None else inv.store_ids())]
            report.stores = len(plans)
            report.max_chain_length = max((p.chain_length for p in plans), default=0)
            todo = [p.store for p in plans if p.latest is not None and p.chain_length >= settings.snapshot_threshold]
            report.candidates = len(todo)
            spec = _TaskSpec("snapshot", fm.root_uri, settings, _catalog_url(catalog))
            for row in _fan_out(engine, spec, todo):
                if row["action"] == "failed":
                    report.error(f"store {row['store']}: {row['error']}")
                    report.items.append(row)
                else:
                    account_snapshot(report, row)
            if catalog is not None and report.snapshots:
                sync_after_snapshots(catalog, fm, report)
        finally:
            report.seconds = time.perf_counter() - t0
    log.info(report.summary())
    return report


def verify_root_on_spark(
    root_uri: str | CheckpointFileManager,
    settings: MaintenanceSettings,
    engine: SparkEngine,
    *,
    catalog: Catalog | None = None,
    rebuild: bool = False,
    checksums: bool = True,
    orchestrator_run_id: str | None = None,
    progress: bool = False,
    stores: Iterable[StoreId] | None = None,
) -> VerifyReport:
    """:func:`statekeeper.maintenance.verify.verify_root`, with the stores verified on Spark executors; read-only.

    `progress` bars are not shown (the work happens on the executors).
    """
    t0 = time.perf_counter()
    fm = open_file_manager(root_uri) if isinstance(root_uri, str) else root_uri
    wanted = None if stores is None else list(stores)
    report = VerifyReport(root=fm.root_uri)
    with recorded(catalog, report, orchestrator_run_id=orchestrator_run_id):
        try:
            ids = wanted if wanted is not None else Inventory.scan(fm, parallelism=settings.parallelism).store_ids()
            report.stores = len(ids)
            spec = _TaskSpec("verify", fm.root_uri, settings, None, rebuild=rebuild, checksums=checksums)
            by_store = {row["store"]: row for row in _fan_out(engine, spec, list(ids))}
            for s in ids:
                row = by_store.get(str(s))
                if row is None:
                    account_verification(report, StoreVerification(s, [f"store {s}: no result from Spark"]))
                else:
                    account_verification(report, StoreVerification(**{**row, "store": s}))
        finally:
            report.seconds = time.perf_counter() - t0
    log.info(report.summary())
    return report


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
