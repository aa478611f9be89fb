"""Maintenance fanned out on the standalone cluster: `statekeeper snapshot|verify --engine spark --master ...`.

The command runs as its own process (the Spark driver); the stores are worked on by the cluster's
executors, each snapshot under its catalog lease, and the results come back into one recorded run.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest

from statekeeper.store.errors import ConfigurationError
from statekeeper.store.files import open_file_manager
from testkit.spark import StandaloneCluster, spark_env
from tests.cli_support import run_cli
from tests.orchestration.helpers import CheckpointWriter

PARTITIONS = 6


def _cli(*args: str, home: Path) -> Any:
    env = {**spark_env(), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOCAL_HOSTNAME": "127.0.0.1"}
    return json.loads(run_cli(*args, "--json", home=home, env=env, timeout=420).stdout)


def _applications(cluster: StandaloneCluster) -> set[str]:
    return {p.name for p in cluster.work_dir.glob("worker-*/app-*")}


@pytest.mark.slow
def test_snapshot_and_verify_fan_out_over_the_cluster(spark_cluster: StandaloneCluster, tmp_path: Path) -> None:
    root = (tmp_path / "root").as_uri()
    with CheckpointWriter(root, partitions=PARTITIONS) as writer:
        writer.commit(6)
    common = ["--db", f"sqlite:///{tmp_path / 'catalog.db'}", "--work-dir", str(tmp_path / "work")]
    spark = ["--engine", "spark", "--master", spark_cluster.master_url]
    before = _applications(spark_cluster)
    _cli("db", "upgrade", *common[:2], home=tmp_path)

    snap = _cli("snapshot", root, "--threshold", "4", *common, *spark, home=tmp_path)
    assert snap["ok"] and snap["snapshots"] == PARTITIONS and snap["run_id"] is not None
    assert sorted(r["store"] for r in snap["rows"]) == [f"agg/{p}" for p in range(PARTITIONS)]
    assert all(r["action"] == "snapshot" and r["version"] == 6 for r in snap["rows"])
    assert _applications(spark_cluster) - before, "no Spark application ran on the cluster's workers"

    again = _cli("snapshot", root, "--threshold", "4", *common, *spark, home=tmp_path)
    assert again["ok"] and again["snapshots"] == 0 and again["candidates"] == 0

    verify = _cli("verify", root, *common, *spark, home=tmp_path)
    assert verify["ok"] and verify["stores_ok"] == PARTITIONS and verify["snapshots"] >= PARTITIONS

    inspect = _cli("inspect", root, *common, home=tmp_path)
    assert {r["store"]: r["snapshot"] for r in inspect["stores"]} == {f"agg/{p}": 6 for p in range(PARTITIONS)}
    runs = _cli("runs", root, *common[:2], home=tmp_path)
    kinds = [r["kind"] for r in runs]
    assert kinds.count("snapshot") == 2 and kinds.count("verify") == 1


def test_an_unknown_engine_or_a_master_without_spark_is_refused() -> None:
    from statekeeper.maintenance.fanout import check_engine

    with pytest.raises(ConfigurationError, match="unknown maintenance engine 'yarn'"):
        check_engine("yarn", None)
    with pytest.raises(ConfigurationError, match="--master needs --engine spark"):
        check_engine("local", "spark://127.0.0.1:7077")
    assert check_engine("local", None) is None


def test_fan_out_on_the_active_session_snapshots_and_verifies(spark: Any, tmp_path: Path) -> None:
    """The representative fast case: the same Spark job on the suite's local session (no catalog: file locks)."""
    from statekeeper.maintenance.fanout import SparkEngine, create_snapshots_on_spark, verify_root_on_spark
    from statekeeper.maintenance.settings import MaintenanceSettings

    root = (tmp_path / "root").as_uri()
    with CheckpointWriter(root, partitions=4) as writer:
        writer.commit(5)
    settings = MaintenanceSettings(snapshot_threshold=3, work_dir=str(tmp_path / "work"))
    fm = open_file_manager(root)
    report = create_snapshots_on_spark(fm, settings, SparkEngine(tasks=2))
    assert report.ok and report.snapshots == 4 and report.stores == 4, report.errors
    assert sorted((r["store"], r["version"]) for r in report.items) == [(f"agg/{p}", 5) for p in range(4)]
    verify = verify_root_on_spark(fm, settings, SparkEngine())
    assert verify.ok and verify.stores_ok == 4 and verify.snapshots == 4, verify.errors


def test_the_dagster_resource_selects_the_engine() -> None:
    import functools

    from statekeeper.maintenance.fanout import create_snapshots_on_spark, verify_root_on_spark
    from statekeeper.maintenance.snapshot_builds import create_snapshots
    from statekeeper.orchestration.resources import MaintenanceConfig

    assert MaintenanceConfig().snapshot_operation() is create_snapshots
    on_spark = MaintenanceConfig(engine="spark", spark_master="spark://127.0.0.1:7077")
    snapshot, verify = on_spark.snapshot_operation(), on_spark.verify_operation()
    assert isinstance(snapshot, functools.partial) and snapshot.func is create_snapshots_on_spark
    assert isinstance(verify, functools.partial) and verify.func is verify_root_on_spark
    assert snapshot.keywords["engine"].master == "spark://127.0.0.1:7077"
    with pytest.raises(ConfigurationError, match="unknown maintenance engine"):
        MaintenanceConfig(engine="yarn").snapshot_operation()


def test_two_maintainers_one_on_spark_never_hold_a_store_at_once(spark: Any, tmp_path: Path) -> None:
    """Invariant 5 with fan-out: a maintenance cycle in this process and a snapshot run on Spark executors,
    started together on one root, both under the catalog's leases. The in-process maintainer holds its
    first store until a Spark job runs, so the two meet on a store: nobody holds a store while the other
    does, every store is snapshotted once, and afterwards every retained version still loads."""
    import threading
    from dataclasses import replace

    from statekeeper.maintenance.fanout import SparkEngine, create_snapshots_on_spark, verify_root_on_spark
    from statekeeper.maintenance.loop import maintain
    from statekeeper.maintenance.settings import MaintenanceSettings
    from statekeeper.maintenance.verify import verify_root
    from statekeeper.sql.catalog import Catalog
    from statekeeper.store import faults

    root = (tmp_path / "root").as_uri()
    with CheckpointWriter(root, partitions=PARTITIONS) as writer:
        writer.commit(8)
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    local_settings = MaintenanceSettings(
        snapshot_threshold=3,
        min_versions_to_retain=2,
        orphan_grace_seconds=0.0,
        load_grace_seconds=0.0,
        lease_timeout_seconds=120.0,
        parallelism=1,
        work_dir=str(tmp_path / "local"),
    )
    spark_settings = replace(local_settings, work_dir=str(tmp_path / "spark"))
    tracker = spark.sparkContext.statusTracker()
    met = threading.Event()

    def hold_first_store(point: str, subject: str) -> None:
        if point == "rocks.checkpoint" and not met.is_set():  # only this process's snapshots: the driver's side
            deadline = time.monotonic() + 120
            while not tracker.getActiveJobsIds() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(3.0)  # the Spark tasks reach this store's lease and wait for it
            met.set()

    engine = SparkEngine(tasks=3)
    barrier = threading.Barrier(2)
    outcome: dict[str, Any] = {}

    def run(name: str, fn: Any) -> None:
        catalog = Catalog.open(url)
        try:
            barrier.wait()
            outcome[name] = fn(catalog)
        except BaseException as e:  # reported below
            outcome[name] = e
        finally:
            catalog.close()

    Catalog.open(url, upgrade=True).close()
    previous = faults.arm(hold_first_store)
    try:
        threads = [
            threading.Thread(
                target=run,
                args=(
                    "local",
                    lambda c: (
                        maintain(open_file_manager(root), local_settings, every=0, cycles=1, catalog=c)[-1].reports
                    ),
                ),
            ),
            threading.Thread(
                target=run,
                args=(
                    "spark",
                    lambda c: create_snapshots_on_spark(open_file_manager(root), spark_settings, engine, catalog=c),
                ),
            ),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
    finally:
        faults.arm(previous)
    local_reports, spark_report = outcome["local"], outcome["spark"]
    assert not isinstance(local_reports, BaseException), local_reports
    assert not isinstance(spark_report, BaseException), spark_report
    assert met.is_set(), "the two maintainers never ran at the same time"
    assert all(r.ok for r in local_reports), [r.errors for r in local_reports]
    assert spark_report.ok, spark_report.errors
    (local_snapshots,) = [r for r in local_reports if r.kind == "snapshot"]
    rows = [("local", r) for r in local_snapshots.items] + [("spark", r) for r in spark_report.items]
    by_store: dict[str, list[tuple[float, float, str, str]]] = {}
    for who, r in rows:
        by_store.setdefault(r["store"], []).append((r["leased_at"], r["released_at"], who, r["action"]))
    assert sorted(by_store) == [f"agg/{p}" for p in range(PARTITIONS)]
    contended = 0
    for store, holds in by_store.items():
        holds.sort()
        for (_, released, who, _), (leased, _, other, _) in itertools.pairwise(holds):
            assert leased >= released, (
                f"store {store}: {other} took it at {leased} while {who} held it until {released}"
            )
        assert [a for *_, a in holds].count("snapshot") == 1, f"store {store} snapshotted other than once: {holds}"
        contended += len({who for _, _, who, _ in holds}) > 1
    assert contended >= 1, f"no store was reached by both maintainers: {by_store}"
    # nothing a retained version needs was deleted (the local cycle expired and cleaned while Spark snapshotted)
    fm = open_file_manager(root)
    check = verify_root(fm, local_settings, rebuild=True)
    assert check.ok and check.stores_ok == PARTITIONS, check.errors
    on_spark = verify_root_on_spark(fm, spark_settings, SparkEngine())
    assert on_spark.ok and on_spark.stores_ok == PARTITIONS, on_spark.errors
