"""The Dagster maintainer of the fleet benchmarks, in one process: the checkpoint sensor ticked on a
cadence, every run it requests executed in process as the daemon would launch it (its job, and only
the asset checks the request names), and the schedules' runs (expiry, verification, orphan cleanup) on
their own cadence. `bench.fleet.beside` runs it beside real-time writers,
`bench.fleet lockstep --dagster` in lock step with them."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import psutil

from bench.report import ROOT

if TYPE_CHECKING:
    from statekeeper.maintenance.settings import MaintenanceSettings

WORKSPACE = ROOT / "workspace.yaml"
log = logging.getLogger("bench.fleet")


class DagsterMaintainer:
    """The code location's definitions over `roots` with `settings` as its maintenance resource and the catalog at
    `catalog_url`; `tick` evaluates the sensor once and executes the runs it requests in this process, so what a
    process keeps across runs (the catalog's engine, the build processes and their replicas) is kept."""

    def __init__(self, roots: str, settings: MaintenanceSettings, catalog_url: str) -> None:
        from dagster import DagsterInstance

        from statekeeper.orchestration.config import OrchestrationConfig, parse_roots
        from statekeeper.orchestration.definitions import build_definitions
        from statekeeper.orchestration.resources import CatalogDatabase, CheckpointStorage, MaintenanceConfig
        from statekeeper.orchestration.sensors import SENSOR_NAME

        self.config = OrchestrationConfig(roots=parse_roots(roots))
        self.resources: dict[str, Any] = {
            "storage": CheckpointStorage(roots=list(self.config.roots)),
            "catalog": CatalogDatabase(url=catalog_url),
            "maintenance": MaintenanceConfig.from_settings(settings),
        }
        self.defs = build_definitions(self.config, self.resources)
        self.sensor = self.defs.get_repository_def().get_sensor_def(SENSOR_NAME)
        self.instance = DagsterInstance.ephemeral()
        self.cursor: str | None = None
        self.runs: dict[str, int] = {}

    def tick(self) -> list[str]:
        """One sensor tick, and the runs it requests; returns what the failed runs' steps said."""
        from dagster import SensorResult, build_sensor_context

        from statekeeper.orchestration.jobs import requested_job

        result = self.sensor(build_sensor_context(cursor=self.cursor, resources=self.resources, instance=self.instance))
        if not isinstance(result, SensorResult):
            return []
        self.cursor = result.cursor
        errors: list[str] = []
        for request in result.run_requests or []:
            job = requested_job(self.defs, request)
            errors += self._execute(job, request.partition_key, request.run_config, request.tags)
        return errors

    def schedules(self) -> list[str]:
        """One tick of each schedule (expiry, verification, orphan cleanup), its runs executed as deployed."""
        from dagster import build_schedule_context

        from statekeeper.orchestration.jobs import requested_job

        repo = self.defs.get_repository_def()
        errors: list[str] = []
        for schedule in repo.schedule_defs:
            ctx = build_schedule_context(instance=self.instance, repository_def=repo)
            for request in schedule.evaluate_tick(ctx).run_requests or []:
                job = requested_job(self.defs, request, schedule.job_name)
                errors += self._execute(job, request.partition_key, request.run_config, request.tags)
        return errors

    def _execute(self, job: Any, partition: str | None, run_config: Any, tags: Any) -> list[str]:
        self.runs[job.name] = self.runs.get(job.name, 0) + 1
        result = job.execute_in_process(
            run_config=run_config, partition_key=partition, tags=tags, instance=self.instance, raise_on_error=False
        )
        return [
            f"{job.name} {partition}: {event.step_key}: {event.step_failure_data.error.message.strip()}"
            for event in result.get_step_failure_events()
            if event.step_failure_data.error is not None
        ] or ([] if result.success else [f"{job.name} {partition}: run failed"])

    def close(self) -> None:
        self.instance.dispose()


def run_daemon(
    roots: str,
    work: str,
    stop: Path,
    settings: MaintenanceSettings,
    catalog_url: str,
    *,
    cycle: float,
    schedules_every_minute: bool = False,
    env: Mapping[str, str] | None = None,
) -> DaemonOutcome:
    """Dagster as deployed: `dagster-daemon run -w workspace.yaml` (its code server, and a process per run
    launched by the default run launcher) on the roots (comma-separated) until `stop` exists, with `settings` as
    its maintenance resource (through their ``STATEKEEPER_*`` variables), the catalog at `catalog_url`, the
    sensors every `cycle` seconds and the schedules on their default crons (or all every minute); `env`: more
    variables of the code location. Returns what its instance recorded (`DaemonOutcome`).

    The caller becomes the subreaper of everything the daemon starts, so that every process's CPU ends
    up in its `RUSAGE_CHILDREN`, also when the process that started it does not wait for it."""
    from statekeeper.orchestration.run_local import prepare_home

    home = str(prepare_home(Path(work, "dagster_home")))  # the instance settings `make run` deploys
    variables = {
        **os.environ,
        **{settings.env_name(k): str(v) for k, v in settings.to_json().items() if v is not None},
        "DAGSTER_HOME": home,
        "STATEKEEPER_CHECKPOINT_ROOTS": roots,
        "STATEKEEPER_DB_URL": catalog_url,
        "STATEKEEPER_SENSOR_INTERVAL_SECONDS": str(max(1, round(cycle))),
        **(env or {}),
    }
    if schedules_every_minute:
        variables.update({f"STATEKEEPER_{name}_SCHEDULE": "* * * * *" for name in ("EXPIRY", "VERIFY", "ORPHAN")})
    _become_subreaper()
    with open(os.path.join(work, "daemon.log"), "w") as out:
        daemon = subprocess.Popen(
            [os.path.join(os.path.dirname(sys.executable), "dagster-daemon"), "run", "-w", str(WORKSPACE)],
            cwd=WORKSPACE.parent,
            env=variables,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        while not stop.exists() and daemon.poll() is None:
            time.sleep(0.2)
        if daemon.poll() is not None:
            raise RuntimeError(f"dagster-daemon exited {daemon.returncode}: see {out.name}")
        daemon.send_signal(signal.SIGINT)
        _reap_all(timeout=120.0)
    return _recorded(home)


def _become_subreaper() -> None:
    """Orphaned descendants are reparented to this process (Linux), which reaps them in `_reap_all`."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _own_processes() -> set[int]:
    """This process's own children, which the daemon's end must not wait for nor kill: those multiprocessing started
    (the maintainer's build processes, the benchmark's publisher) and multiprocessing's resource tracker."""
    from multiprocessing import active_children, resource_tracker

    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)  # private: no public accessor
    return {p.pid for p in active_children() if p.pid is not None} | ({tracker} if tracker else set())


def _reap_all(timeout: float) -> None:
    """Wait for (reap) every child but this process's own (`_own_processes`): the daemon, its code server and the
    run processes reparented here; kill what is left after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        own = _own_processes()
        others = [c for c in psutil.Process().children() if c.pid not in own]
        if not others:
            return
        for child in others:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(child.pid, os.WNOHANG)
        if time.monotonic() > deadline:
            for child in others:
                for proc in [*child.children(recursive=True), child]:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        proc.kill()
            deadline = math.inf
        time.sleep(0.1)


class DaemonOutcome(NamedTuple):
    """What the daemon's instance recorded: sensor ticks per sensor, runs per job, and materializations per asset
    (the runs' and those sensors reported, such as the external-maintenance sensor's)."""

    ticks: dict[str, int]
    runs: dict[str, int]
    materializations: dict[str, int]


def _recorded(home: str) -> DaemonOutcome:
    from dagster import AssetKey, DagsterInstance
    from dagster._core.definitions.run_request import InstigatorType

    from statekeeper.orchestration.assets import ASSET_NAMES

    with DagsterInstance.from_config(home) as instance:
        ticks = {
            state.instigator_name: len(instance.get_ticks(state.instigator_origin_id, state.selector_id))
            for state in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR)
        }
        runs: dict[str, int] = {}
        records = sorted(instance.get_run_records(), key=lambda r: r.create_timestamp)
        first = records[0].create_timestamp.timestamp() if records else 0.0
        for record in records:
            run = record.dagster_run
            runs[run.job_name] = runs.get(run.job_name, 0) + 1
            created = record.create_timestamp.timestamp()
            start, end = record.start_time or math.nan, record.end_time or math.nan
            log.info(
                "run %s (%s): created at %.1f s, queued %.1f s, ran %.1f s",
                run.job_name,
                run.status.value,
                created - first,
                start - created,
                end - start,
            )
        made = {name: instance.fetch_materializations(AssetKey(name), limit=10_000).records for name in ASSET_NAMES}
    return DaemonOutcome(ticks, runs, {name: len(records) for name, records in made.items() if records})
