"""Fleet fan-out: stores snapshotted per second, one maintenance process vs a Spark standalone cluster.

The same fleet (S stores of `keys` keys, each with `versions` committed versions of `updates` updates
after its bulk load, no snapshot yet) is copied twice; `create_snapshots` snapshots every store of one
copy in this process (a pool of `parallelism` threads) and of the other with the Spark engine as its
per-store executor (`statekeeper.maintenance.fanout.SparkEngine`) on a standalone cluster started on
127.0.0.1 for the run (`testkit/spark.py`: `workers` workers of one core each). The
session is created before the clock starts; the job, its tasks' Python workers and their cold
builds are inside it. Both runs build cold (no replica): what a new maintainer of a fleet does first.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.fleet.writers import FleetWriters
from bench.report import Table

log = logging.getLogger("bench.fleet")


@dataclass(frozen=True)
class FanoutParams:
    stores: int = 64
    keys: int = 10_000
    updates: int = 1_000
    versions: int = 10
    parallelism: int = 2
    workers: int = 2


@dataclass
class FanoutResult:
    engine: str
    stores: int
    snapshots: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.snapshots / self.seconds if self.seconds else 0.0


def build_fleet(root: str, p: FanoutParams, work: str) -> None:
    """S stores with a bulk load and `versions` update commits each, commit records as a driver writes them."""
    with FleetWriters([root], p.stores, 1, p.keys, p.updates, work) as writers:
        for _ in range(p.versions + 1):
            writers.commit_next()


def run_fanout(p: FanoutParams) -> list[FanoutResult]:
    from statekeeper.maintenance.fanout import SparkEngine
    from statekeeper.maintenance.replica_pool import close_replicas
    from statekeeper.maintenance.settings import MaintenanceSettings
    from statekeeper.maintenance.snapshot_builds import create_snapshots
    from statekeeper.store.files import open_file_manager
    from testkit.spark import StandaloneCluster, spark_env

    base = Path(tempfile.mkdtemp(prefix="statekeeper-fanout-"))
    results = []
    try:
        build_fleet((base / "one").as_uri(), p, str(base / "writer"))
        shutil.copytree(base / "one", base / "spark")
        settings = MaintenanceSettings(snapshot_threshold=1, parallelism=p.parallelism, work_dir=str(base / "work-one"))
        t0 = time.perf_counter()
        report = create_snapshots(open_file_manager((base / "one").as_uri()), settings)
        results.append(FanoutResult("one process", p.stores, report.snapshots, time.perf_counter() - t0))
        close_replicas()
        cluster = StandaloneCluster(base / "cluster", workers=p.workers).start()
        try:
            os.environ.update(spark_env())  # the driver's Python workers: this interpreter and repository
            engine = SparkEngine(master=cluster.master_url, conf=cluster.session_conf(base / "spark-local"))
            spark = engine.session()
            try:
                spark_settings = MaintenanceSettings(snapshot_threshold=1, work_dir=str(base / "work-spark"))
                t0 = time.perf_counter()
                fm = open_file_manager((base / "spark").as_uri())
                report = create_snapshots(fm, spark_settings, executor=engine)
                seconds = time.perf_counter() - t0
                engine_name = f"Spark standalone, {p.workers} x 1 core"
                results.append(FanoutResult(engine_name, p.stores, report.snapshots, seconds))
                if not report.ok:
                    log.warning("fan-out snapshot errors: %s", report.errors[:5])
            finally:
                spark.stop()
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return results


def fanout_table(p: FanoutParams, results: list[FanoutResult]) -> Table:
    return Table(
        "Fleet: stores snapshotted per second, one process vs fan-out over a Spark cluster",
        ["engine", "stores", "snapshots", "seconds", "stores snapshotted / s"],
        [[r.engine, r.stores, r.snapshots, round(r.seconds, 2), round(r.per_second, 2)] for r in results],
        notes=[
            f"Each store: {p.keys:,} keys, {p.versions} versions of {p.updates:,} updates after the bulk load, no "
            f"snapshot yet (cold builds). One process: {p.parallelism} threads. Spark: a standalone cluster on this "
            f"machine ({p.workers} workers x 1 core), the session up before the clock starts. On one shared "
            "machine the cluster only adds cores it does not have: the row shows the fan-out's overhead here, "
            "its gain needs executors on other machines."
        ],
    )


__all__ = ["FanoutParams", "FanoutResult", "fanout_table", "run_fanout"]
