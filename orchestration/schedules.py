"""Schedules: expiry (hourly by default), verification (hourly) and orphan cleanup (daily), one run per root.

A fleet (at least ``STATEKEEPER_SENSOR_FLEET_ROOTS`` roots, as for the checkpoint sensor) gets one expiry run for
all its roots instead, a `fleet_maintenance_job` run (orchestration/fleet.py): a run per root per hour would
pay Dagster's start-up cost per root for what is usually little work.

The expiry schedule's runs expire only; the loadability check, which verifies every retained version, runs
from the verification schedule in `verification_job` runs, which do not hold the root's run slot
(orchestration/verification.py). Each schedule is turned off by its environment variable (``off``): it is
then defined stopped and skips if started anyway, so the UI still shows it and why it does not run.
"""

from collections.abc import Callable

from dagster import (
    DefaultScheduleStatus,
    JobDefinition,
    PartitionsDefinition,
    RunRequest,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    schedule,
)
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from statekeeper.orchestration.config import (
    DEFAULT_EXPIRY_CRON,
    DEFAULT_ORPHAN_CRON,
    DEFAULT_VERIFY_CRON,
    ENV_EXPIRY_SCHEDULE,
    ENV_ORPHAN_SCHEDULE,
    ENV_VERIFY_SCHEDULE,
    OrchestrationConfig,
)
from statekeeper.orchestration.fleet import fleet_expiry_request
from statekeeper.orchestration.jobs import expiry_request
from statekeeper.orchestration.verification import verification_job, verification_request

EXPIRY_SCHEDULE = "expiry_schedule"
ORPHAN_SCHEDULE = "orphan_cleanup_schedule"
VERIFY_SCHEDULE = "verification_schedule"
TRIGGER_TAG = "statekeeper/trigger"

RequestFor = Callable[[str, str, dict[str, str]], RunRequest]
"""(root, run key, tags) -> the schedule's run request for that root (`partition_request`, the expiry
schedule's `expiry_request`, the verification schedule's `verification_request`)."""


def partition_request(root: str, run_key: str, tags: dict[str, str]) -> RunRequest:
    """A run of the schedule's job (with all its checks) on the root's partition."""
    return RunRequest(run_key=run_key, partition_key=root, tags=tags)


def build_schedule(
    name: str,
    job: UnresolvedAssetJobDefinition | JobDefinition,
    partitions: PartitionsDefinition,
    cron: str | None,
    default_cron: str,
    env_name: str,
    timezone: str,
    what: str,
    request: RequestFor = partition_request,
    fleet: bool = False,
) -> ScheduleDefinition:
    """`fleet`: one `fleet_expiry_request` run for every root (`job` is then the fleet job), else a run per root."""
    enabled = cron is not None

    @schedule(
        name=name,
        job=job,
        cron_schedule=cron or default_cron,
        execution_timezone=timezone,
        default_status=DefaultScheduleStatus.RUNNING if enabled else DefaultScheduleStatus.STOPPED,
        description=f"{what} of every checkpoint root ({env_name}="
        + (f"{cron!r})." if enabled else "off: turned off)."),
    )
    def _schedule(context: ScheduleEvaluationContext) -> list[RunRequest] | SkipReason:
        if not enabled:
            return SkipReason(f"turned off by {env_name}=off")
        when = context.scheduled_execution_time
        stamp = when.isoformat() if when is not None else "now"
        roots = partitions.get_partition_keys()
        if fleet:
            return [fleet_expiry_request(roots, f"{name}:{len(roots)}-roots:{stamp}", {TRIGGER_TAG: name})]
        return [request(root, f"{name}:{root}:{stamp}", {TRIGGER_TAG: name}) for root in roots]

    return _schedule


def build_schedules(
    config: OrchestrationConfig,
    partitions: PartitionsDefinition,
    expiry_job: UnresolvedAssetJobDefinition,
    orphan_job: UnresolvedAssetJobDefinition,
    fleet_job: JobDefinition,
) -> list[ScheduleDefinition]:
    fleet = 0 < config.sensor_fleet_roots <= len(config.roots)
    return [
        build_schedule(
            EXPIRY_SCHEDULE,
            fleet_job if fleet else expiry_job,
            partitions,
            config.expiry_cron,
            DEFAULT_EXPIRY_CRON,
            ENV_EXPIRY_SCHEDULE,
            config.timezone,
            "Expiry, in one fleet run," if fleet else "Expiry",
            expiry_request,
            fleet=fleet,
        ),
        build_schedule(
            VERIFY_SCHEDULE,
            verification_job,
            partitions,
            config.verify_cron,
            DEFAULT_VERIFY_CRON,
            ENV_VERIFY_SCHEDULE,
            config.timezone,
            "Verification (the retained_versions_loadable check)",
            verification_request,
        ),
        build_schedule(
            ORPHAN_SCHEDULE,
            orphan_job,
            partitions,
            config.orphan_cron,
            DEFAULT_ORPHAN_CRON,
            ENV_ORPHAN_SCHEDULE,
            config.timezone,
            "Orphan cleanup",
        ),
    ]


__all__ = ["EXPIRY_SCHEDULE", "ORPHAN_SCHEDULE", "VERIFY_SCHEDULE", "build_schedule", "build_schedules"]
