"""The code location: ``dagster dev -w workspace.yaml`` loads ``defs`` from here.

Everything is built from `OrchestrationConfig.from_env()` (see orchestration/config.py and
docs/orchestration.md); `build_definitions` takes an explicit configuration for tests.
"""

from __future__ import annotations

from typing import Any

from dagster import Definitions, StaticPartitionsDefinition, in_process_executor

from statekeeper.orchestration.assets import ORPHANS, RETAINED, SNAPSHOTS, build_assets
from statekeeper.orchestration.checks import build_checks
from statekeeper.orchestration.config import OrchestrationConfig
from statekeeper.orchestration.external_runs import build_external_runs_sensor
from statekeeper.orchestration.fleet import build_fleet_job
from statekeeper.orchestration.jobs import build_jobs, build_snapshot_and_expiry_job
from statekeeper.orchestration.rescale_jobs import rescale_jobs
from statekeeper.orchestration.resources import build_resources
from statekeeper.orchestration.schedules import build_schedules
from statekeeper.orchestration.sensors import build_checkpoint_sensor, build_failure_sensor
from statekeeper.orchestration.verification import verification_job


def root_partitions(config: OrchestrationConfig) -> StaticPartitionsDefinition:
    """One partition per checkpoint root; the key is the root's normalised URI."""
    return StaticPartitionsDefinition(list(config.roots))


def build_definitions(
    config: OrchestrationConfig | None = None, resources: dict[str, Any] | None = None
) -> Definitions:
    config = config or OrchestrationConfig.from_env()
    partitions = root_partitions(config)
    jobs = build_jobs()
    snapshot_and_expiry_job = build_snapshot_and_expiry_job()
    fleet_job = build_fleet_job()
    return Definitions(
        assets=build_assets(partitions),
        asset_checks=build_checks(partitions),
        jobs=[*jobs.values(), snapshot_and_expiry_job, fleet_job, verification_job, *rescale_jobs()],
        sensors=[
            build_checkpoint_sensor(config, [jobs[SNAPSHOTS], jobs[RETAINED], snapshot_and_expiry_job, fleet_job]),
            build_failure_sensor(config),
            build_external_runs_sensor(config),
        ],
        schedules=build_schedules(config, partitions, jobs[RETAINED], jobs[ORPHANS], fleet_job),
        resources=resources if resources is not None else build_resources(config),
        # one process per run: a step is one operation over a root, parallel inside (threads, or Spark
        # executors); a process per step would import Dagster and statekeeper again for each
        executor=in_process_executor,
    )


defs = build_definitions()

__all__ = ["build_definitions", "defs", "root_partitions"]
