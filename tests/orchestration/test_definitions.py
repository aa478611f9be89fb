"""The code location loads, validates, and takes its configuration from the environment."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DefaultScheduleStatus, DefaultSensorStatus

from statekeeper.orchestration.assets import ASSET_NAMES
from statekeeper.orchestration.checks import CHECK_NAMES
from statekeeper.orchestration.config import OrchestrationConfig, default_roots, parse_cron
from statekeeper.orchestration.definitions import build_definitions
from statekeeper.orchestration.external_runs import SENSOR_NAME as EXTERNAL_SENSOR_NAME
from statekeeper.orchestration.jobs import JOB_NAMES
from statekeeper.orchestration.schedules import EXPIRY_SCHEDULE, ORPHAN_SCHEDULE, VERIFY_SCHEDULE
from statekeeper.orchestration.sensors import FAILURE_SENSOR_NAME, SENSOR_NAME
from statekeeper.store.errors import ConfigurationError

REPO = Path(__file__).resolve().parents[2]


def test_defs_load_with_everything() -> None:
    config = OrchestrationConfig.from_env({})
    defs = build_definitions(config)
    repo = defs.get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert keys == set(ASSET_NAMES)
    checks = {k.name for k in repo.asset_graph.asset_check_keys}
    assert checks == set(CHECK_NAMES)
    assert {j for j in JOB_NAMES.values()} <= {j.name for j in repo.get_all_jobs()}
    assert {s.name for s in repo.sensor_defs} == {SENSOR_NAME, FAILURE_SENSOR_NAME, EXTERNAL_SENSOR_NAME}
    assert repo.get_sensor_def(EXTERNAL_SENSOR_NAME).default_status == DefaultSensorStatus.RUNNING
    assert {s.name for s in repo.schedule_defs} == {EXPIRY_SCHEDULE, VERIFY_SCHEDULE, ORPHAN_SCHEDULE}
    # the embedded default: the checkpoint `make run`'s demo writes
    assert config.roots == (Path(default_roots()[0]).resolve().as_uri(),)
    assert repo.get_schedule_def(EXPIRY_SCHEDULE).cron_schedule == "0 * * * *"
    assert repo.get_schedule_def(ORPHAN_SCHEDULE).cron_schedule == "30 3 * * *"
    assert repo.get_sensor_def(SENSOR_NAME).default_status == DefaultSensorStatus.RUNNING


def test_config_from_env(tmp_path: Path) -> None:
    env = {
        "STATEKEEPER_CHECKPOINT_ROOTS": f"{tmp_path}/a, s3://bucket-one/ckpt/\n{tmp_path}/a",
        "STATEKEEPER_S3_ENDPOINT_URL": "http://127.0.0.1:9000",
        "STATEKEEPER_DB_URL": "postgresql://u:secret@127.0.0.1/db",
        "STATEKEEPER_EXPIRY_SCHEDULE": "off",
        "STATEKEEPER_ORPHAN_SCHEDULE": "15 2 * * 0",
        "STATEKEEPER_VERIFY_SCHEDULE": "45 */6 * * *",
        "STATEKEEPER_CHECKPOINT_SENSOR": "off",
        "STATEKEEPER_EXTERNAL_RUNS_SENSOR": "off",
        "STATEKEEPER_SENSOR_INTERVAL_SECONDS": "5",
        "STATEKEEPER_SENSOR_LISTING_SECONDS": "60",
        "STATEKEEPER_SENSOR_FLEET_ROOTS": "3",
        "STATEKEEPER_SNAPSHOT_THRESHOLD": "7",
    }
    config = OrchestrationConfig.from_env(env)
    assert config.roots == ((tmp_path / "a").as_uri(), "s3://bucket-one/ckpt")
    assert config.expiry_cron is None and config.orphan_cron == "15 2 * * 0"
    assert config.verify_cron == "45 */6 * * *"
    assert not config.sensor_enabled and config.sensor_interval_seconds == 5
    assert config.sensor_listing_seconds == 60
    assert config.sensor_fleet_roots == 3 and OrchestrationConfig.from_env({}).sensor_fleet_roots == 2
    assert OrchestrationConfig.from_env({"STATEKEEPER_SENSOR_FLEET_ROOTS": "off"}).sensor_fleet_roots == 0
    assert config.db_url_from_env
    defs = build_definitions(config)
    repo = defs.get_repository_def()
    assert repo.get_schedule_def(EXPIRY_SCHEDULE).default_status == DefaultScheduleStatus.STOPPED
    assert repo.get_schedule_def(ORPHAN_SCHEDULE).default_status == DefaultScheduleStatus.RUNNING
    assert repo.get_sensor_def(SENSOR_NAME).default_status == DefaultSensorStatus.STOPPED
    assert repo.get_sensor_def(EXTERNAL_SENSOR_NAME).default_status == DefaultSensorStatus.STOPPED
    # the password never shows in the resource's configuration: it is read through EnvVar
    assert "secret" not in repr((defs.resources or {})["catalog"])


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("STATEKEEPER_CHECKPOINT_ROOTS", "ftp://nope/x"),
        ("STATEKEEPER_CHECKPOINT_ROOTS", " , "),
        ("STATEKEEPER_EXPIRY_SCHEDULE", "every hour"),
        ("STATEKEEPER_CHECKPOINT_SENSOR", "maybe"),
        ("STATEKEEPER_EXTERNAL_RUNS_SENSOR", "sometimes"),
        ("STATEKEEPER_SENSOR_INTERVAL_SECONDS", "0"),
        ("STATEKEEPER_SENSOR_LISTING_SECONDS", "soon"),
        ("STATEKEEPER_SENSOR_FLEET_ROOTS", "many"),
        ("STATEKEEPER_SENSOR_FLEET_ROOTS", "-1"),
    ],
)
def test_bad_configuration_is_refused_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigurationError, match=name):
        OrchestrationConfig.from_env({name: value})


def test_parse_cron() -> None:
    assert parse_cron(None, "X", "0 * * * *") == "0 * * * *"
    assert parse_cron("OFF", "X", "0 * * * *") is None
    assert parse_cron(" */5  * * * * ", "X", "0 * * * *") == "*/5 * * * *"


def test_dagster_definitions_validate(tmp_path: Path) -> None:
    """`dagster definitions validate -w workspace.yaml`, as `dagster dev` would load it."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "orchestration" / "dagster.yaml", home / "dagster.yaml")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "STATEKEEPER_CHECKPOINT_ROOTS": str(tmp_path / "ckpt"),
        "STATEKEEPER_DB_URL": f"sqlite:///{tmp_path / 'catalog.db'}",
    }
    dagster = Path(sys.executable).with_name("dagster")
    proc = subprocess.run(
        [str(dagster), "definitions", "validate", "-w", "workspace.yaml"],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "statekeeper" in out


def test_a_run_is_one_process_and_a_queued_run_starts_within_a_second(tmp_path: Path) -> None:
    """Every job runs its steps in the run's own process, and the instance `make run` deploys dequeues
    runs every second while keeping one maintenance run per root and one fleet run at a time."""
    from dagster import DagsterInstance

    from statekeeper.orchestration.fleet import FLEET_TAG
    from statekeeper.orchestration.run_local import prepare_home

    repo = build_definitions(OrchestrationConfig.from_env({})).get_repository_def()
    assert {job.executor_def.name for job in repo.get_all_jobs()} == {"in_process"}
    with DagsterInstance.from_config(str(prepare_home(tmp_path / "home"))) as instance:
        coordinator = instance.run_coordinator
        assert getattr(coordinator, "dequeue_interval_seconds", None) == 1
        queue = instance.get_concurrency_config().run_queue_config
        assert queue is not None
        limits = queue.tag_concurrency_limits
        assert [(limit["key"], limit["limit"]) for limit in limits] == [("dagster/partition", 1), (FLEET_TAG, 1)]


def test_maintenance_config_carries_every_setting() -> None:
    """The Dagster resource and the settings name the same fields, and every value survives the round trip."""
    from dataclasses import fields

    from statekeeper.maintenance.settings import MaintenanceSettings
    from statekeeper.orchestration.resources import MaintenanceConfig

    settings = MaintenanceSettings(
        snapshot_threshold=3,
        min_versions_to_retain=7,
        orphan_grace_seconds=5.5,
        load_grace_seconds=1.5,
        parallelism=2,
        lease_ttl_seconds=30.0,
        lease_timeout_seconds=2.0,
        work_dir="/tmp/statekeeper-work",
        delete_batch_size=10,
    )
    assert {f.name for f in fields(MaintenanceSettings)} <= set(MaintenanceConfig.model_fields)
    assert MaintenanceConfig.from_settings(settings).settings() == settings
