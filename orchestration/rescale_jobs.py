"""Dagster jobs for planned layout changes: ``rescale_job`` and ``rollback_job``.

Launched by hand (the UI's launchpad or ``dagster job launch``) with the same settings as
``statekeeper rescale`` / ``statekeeper rollback``, while the query is stopped; they run
`statekeeper.maintenance.offline_rescale` and report what moved as output metadata (numbers the UI plots).
"""

from typing import Any, Optional

from dagster import Config, JobDefinition, MetadataValue, OpExecutionContext, job, op

from statekeeper.maintenance.fanout import check_engine
from statekeeper.maintenance.offline_rescale import DEFAULT_IDLE_SECONDS, RescaleOptions, rescale, rollback
from statekeeper.store.files import open_file_manager
from statekeeper.store.rescale import RescaleResult

KIND_TAG = "statekeeper/kind"


class RescaleJobsConfig(Config):
    """The settings `rescale_job` and `rollback_job` share (as
    `statekeeper.maintenance.offline_rescale.RescaleOptions`)."""

    root: str
    operator: str
    dry_run: bool = False
    idle_seconds: float = DEFAULT_IDLE_SECONDS
    workers: int = 4
    engine: str = "local"
    """``spark``: build the new partitions as one Spark job (on ``master``) instead of in threads here."""
    master: Optional[str] = None  # noqa: UP045 - Dagster config resolves typing.Optional

    def options(self) -> RescaleOptions:
        return RescaleOptions(
            dry_run=self.dry_run,
            idle_seconds=self.idle_seconds,
            workers=self.workers,
            engine=check_engine(self.engine, self.master),
        )


class RescaleConfig(RescaleJobsConfig):
    partitions: int
    max_key_groups: Optional[int] = None  # noqa: UP045 - Dagster config resolves typing.Optional


class RollbackConfig(RescaleJobsConfig):
    to_version: int


def _report(context: OpExecutionContext, result: RescaleResult) -> dict[str, Any]:
    """The result as the op's output, with what moved as metadata the UI plots."""
    context.add_output_metadata(
        {
            "plan": MetadataValue.text(result.plan.describe()),
            "records": MetadataValue.int(result.records),
            "deleted": MetadataValue.int(result.deleted),
            "bytes_read": MetadataValue.int(result.bytes_read),
            "bytes_written": MetadataValue.int(result.bytes_written),
            "seconds": MetadataValue.float(result.seconds),
            "slowest_build_seconds": MetadataValue.float(result.slowest_build_seconds),
            "moved_key_groups": MetadataValue.int(result.plan.moved_groups()),
            "relayed_partitions": MetadataValue.int(result.relayed),
        }
    )
    return result.to_json()


@op(description="Re-lay out an operator's head over a new partition count (the query stopped).")
def rescale_op(context: OpExecutionContext, config: RescaleConfig) -> dict[str, Any]:
    fm, kwargs = open_file_manager(config.root), config.options()
    result = rescale(fm, config.operator, config.partitions, max_key_groups=config.max_key_groups, **kwargs)
    return _report(context, result)


@op(description="Make a retained version of an operator the head again (the query stopped).")
def rollback_op(context: OpExecutionContext, config: RollbackConfig) -> dict[str, Any]:
    fm = open_file_manager(config.root)
    return _report(context, rollback(fm, config.operator, config.to_version, **config.options()))


@job(tags={KIND_TAG: "rescale"}, description="statekeeper rescale ROOT --operator NAME --partitions N")
def rescale_job() -> None:
    rescale_op()


@job(tags={KIND_TAG: "rollback"}, description="statekeeper rollback ROOT --operator NAME --to-version V")
def rollback_job() -> None:
    rollback_op()


def rescale_jobs() -> list[JobDefinition]:
    return [rescale_job, rollback_job]


__all__ = ["RescaleConfig", "RescaleJobsConfig", "RollbackConfig", "rescale_job", "rescale_jobs", "rollback_job"]
