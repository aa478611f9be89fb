"""Schedules: expiry (hourly by default) and orphan cleanup (daily by default), one run per root.

Each is turned off by its environment variable (``off``): it is then defined stopped and skips if
started anyway, so the UI still shows it and why it does not run.
"""

from dagster import (
    DefaultScheduleStatus,
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
    ENV_EXPIRY_SCHEDULE,
    ENV_ORPHAN_SCHEDULE,
    OrchestrationConfig,
)

EXPIRY_SCHEDULE = "expiry_schedule"
ORPHAN_SCHEDULE = "orphan_cleanup_schedule"
TRIGGER_TAG = "statekeeper/trigger"


def build_schedule(
    name: str,
    job: UnresolvedAssetJobDefinition,
    partitions: PartitionsDefinition,
    cron: str | None,
    default_cron: str,
    env_name: str,
    timezone: str,
    what: str,
) -> ScheduleDefinition:
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
        return [
            RunRequest(run_key=f"{name}:{root}:{stamp}", partition_key=root, tags={TRIGGER_TAG: name})
            for root in partitions.get_partition_keys()
        ]

    return _schedule


def build_schedules(
    config: OrchestrationConfig,
    partitions: PartitionsDefinition,
    expiry_job: UnresolvedAssetJobDefinition,
    orphan_job: UnresolvedAssetJobDefinition,
) -> list[ScheduleDefinition]:
    return [
        build_schedule(
            EXPIRY_SCHEDULE,
            expiry_job,
            partitions,
            config.expiry_cron,
            DEFAULT_EXPIRY_CRON,
            ENV_EXPIRY_SCHEDULE,
            config.timezone,
            "Expiry",
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


__all__ = ["EXPIRY_SCHEDULE", "ORPHAN_SCHEDULE", "build_schedule", "build_schedules"]
