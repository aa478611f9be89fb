"""Maintenance fanned out on the standalone cluster: `statekeeper snapshot|verify --engine spark --master ...`.

The command runs as its own process (the Spark driver); the stores are worked on by the cluster's
executors, each snapshot under its catalog lease, and the results come back into one recorded run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from statekeeper.store.errors import ConfigurationError
from tests.orchestration.helpers import CheckpointWriter
from tests.spark.cluster_support import StandaloneCluster
from tests.spark.conftest import ROOT, spark_env

PARTITIONS = 6


def _cli(*args: str, home: Path) -> Any:
    env = {
        **os.environ,
        **spark_env(),
        "STATEKEEPER_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_HOSTNAME": "127.0.0.1",
    }
    env.pop("STATEKEEPER_DB_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "statekeeper.maintenance", *args, "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    assert done.returncode == 0, f"{args}: rc={done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return json.loads(done.stdout)


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
    report = create_snapshots_on_spark(root, settings, SparkEngine(tasks=2))
    assert report.ok and report.snapshots == 4 and report.stores == 4, report.errors
    assert sorted((r["store"], r["version"]) for r in report.items) == [(f"agg/{p}", 5) for p in range(4)]
    verify = verify_root_on_spark(root, settings, SparkEngine())
    assert verify.ok and verify.stores_ok == 4 and verify.snapshots == 4, verify.errors


def test_the_dagster_resource_selects_the_engine() -> None:
    import functools

    from statekeeper.maintenance.fanout import create_snapshots_on_spark, verify_root_on_spark
    from statekeeper.maintenance.snapshots import create_snapshots
    from statekeeper.orchestration.resources import MaintenanceConfig

    assert MaintenanceConfig().snapshot_operation() is create_snapshots
    on_spark = MaintenanceConfig(engine="spark", spark_master="spark://127.0.0.1:7077")
    snapshot, verify = on_spark.snapshot_operation(), on_spark.verify_operation()
    assert isinstance(snapshot, functools.partial) and snapshot.func is create_snapshots_on_spark
    assert isinstance(verify, functools.partial) and verify.func is verify_root_on_spark
    assert snapshot.keywords["engine"].master == "spark://127.0.0.1:7077"
    with pytest.raises(ConfigurationError, match="unknown maintenance engine"):
        MaintenanceConfig(engine="yarn").snapshot_operation()
