"""The Dagster maintainer of the fleet benchmarks, in one process: the checkpoint sensor ticked on a
cadence, every run it requests executed in process as the daemon would launch it (its job, and only
the asset checks the request names), and the expiry and orphan-cleanup schedules' runs on their own
cadence (with all their checks). `bench.bench_fleet` runs it beside real-time writers,
`bench.fleet_profile --dagster` in lock step with them."""

from __future__ import annotations

import os
from typing import Any


class DagsterMaintainer:
    def __init__(
        self, root: str, work: str, *, threshold: int, retain: int, orphan_grace: float, load_grace: float
    ) -> None:
        from dagster import DagsterInstance

        from statekeeper.orchestration.config import OrchestrationConfig, parse_roots
        from statekeeper.orchestration.definitions import build_definitions
        from statekeeper.orchestration.resources import CatalogDatabase, CheckpointStorage, MaintenanceConfig
        from statekeeper.orchestration.sensors import SENSOR_NAME

        self.config = OrchestrationConfig(roots=parse_roots(root))
        self.resources: dict[str, Any] = {
            "storage": CheckpointStorage(roots=list(self.config.roots)),
            "catalog": CatalogDatabase(url=f"sqlite:///{os.path.join(work, 'catalog.db')}"),
            "maintenance": MaintenanceConfig(
                snapshot_threshold=threshold,
                min_versions_to_retain=retain,
                orphan_grace_seconds=orphan_grace,
                load_grace_seconds=load_grace,
                work_dir=os.path.join(work, "replicas"),
            ),
        }
        self.defs = build_definitions(self.config, self.resources)
        self.sensor = self.defs.get_repository_def().get_sensor_def(SENSOR_NAME)
        self.instance = DagsterInstance.ephemeral()
        self.cursor: str | None = None
        self.runs: dict[str, int] = {}

    def tick(self) -> None:
        """One sensor tick, and the runs it requests."""
        from dagster import SensorResult, build_sensor_context

        result = self.sensor(build_sensor_context(cursor=self.cursor, resources=self.resources, instance=self.instance))
        if not isinstance(result, SensorResult):
            return
        self.cursor = result.cursor
        for request in result.run_requests or []:
            assert request.job_name is not None
            job = self.defs.resolve_job_def(request.job_name)
            if request.asset_check_keys is not None:  # as the daemon launches it: the checks requested
                job = job.get_subset(
                    asset_selection=set(job.asset_layer.executable_asset_keys),
                    asset_check_selection=set(request.asset_check_keys),
                )
            self._execute(job, request.partition_key, request.run_config, request.tags)

    def schedules(self) -> None:
        """The expiry and orphan-cleanup schedules' runs of the root."""
        from statekeeper.orchestration.assets import ORPHANS, RETAINED
        from statekeeper.orchestration.jobs import JOB_NAMES

        for asset in (RETAINED, ORPHANS):
            self._execute(self.defs.resolve_job_def(JOB_NAMES[asset]), self.config.roots[0], None, {})

    def _execute(self, job: Any, partition: str | None, run_config: Any, tags: Any) -> None:
        self.runs[job.name] = self.runs.get(job.name, 0) + 1
        job.execute_in_process(
            run_config=run_config, partition_key=partition, tags=tags, instance=self.instance, raise_on_error=False
        )

    def close(self) -> None:
        self.instance.dispose()
