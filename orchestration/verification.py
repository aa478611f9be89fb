"""``verification_job``: the loadability check of one root, in a run that does not take the root's run slot.

``retained_versions_loadable`` verifies every retained version of every store of a root: it reads every
retained changelog and checks every SST of their bases, about 12 ms per store on 2 cores (12 s for 1,000
stores). As a step of the root's expiry run it held the root's one maintenance run slot
(orchestration/dagster.yaml) all that time, and the sensor's snapshot runs of the root waited behind it:
the chain of a store committing every second grew by one changelog per second of it.

Verification only reads and takes no lease; a store it finds broken on a listing that went stale meanwhile
(expired files, a replaced base) it verifies again on a fresh one (`verify_root`). So it needs no slot:
`verification_job` is not partitioned, takes its root as config and carries it as the ``statekeeper/root``
tag, and reports its result as an evaluation of ``retained_versions_loadable`` on the root's partition,
where the UI shows the check's history. The verification schedule runs it for every root; the check can
still be run from the asset's Checks tab (then in the slot, as a step of a partitioned run).
"""

from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    AssetKey,
    Config,
    OpExecutionContext,
    RunRequest,
    job,
    op,
)
from pydantic import Field

from statekeeper.orchestration.assets import KIND_TAG, RETAINED, ROOT_TAG
from statekeeper.orchestration.checks import LOADABLE, loadability
from statekeeper.orchestration.config import normalize_root
from statekeeper.orchestration.jobs import MAINTENANCE_TAG
from statekeeper.orchestration.resources import CatalogDatabase, CheckpointStorage, MaintenanceConfig

VERIFICATION_JOB = "verification_job"
VERIFY_OP = "verify_retained_versions"
VERIFY_KIND = "verify"


class VerificationConfig(Config):
    root: str = Field(description="The checkpoint root to verify (one of the configured roots' URIs).")


@op(name=VERIFY_OP, description="Verify every retained version of every store of the root (read-only).")
def verify_retained_versions(
    context: OpExecutionContext,
    config: VerificationConfig,
    storage: CheckpointStorage,
    catalog: CatalogDatabase,
    maintenance: MaintenanceConfig,
) -> None:
    root = storage.root_uri(config.root)
    passed, md = loadability(storage, catalog, maintenance, root)
    # `log_event` records an AssetCheckEvaluation in the run's event log (its annotation omits the type)
    context.log_event(
        AssetCheckEvaluation(  # type: ignore[arg-type]
            asset_key=AssetKey(RETAINED),
            check_name=LOADABLE,
            passed=passed,
            metadata=md,
            severity=AssetCheckSeverity.ERROR,
            partition=root,
        )
    )
    context.log.info("%s of %s: %s", LOADABLE, root, "passed" if passed else "failed")


@job(
    name=VERIFICATION_JOB,
    description="The retained_versions_loadable check of one root (config `root`), outside the root's run slot.",
    tags={KIND_TAG: VERIFY_KIND, MAINTENANCE_TAG: "true"},
)
def verification_job() -> None:
    verify_retained_versions()


def verification_request(root: str, run_key: str, tags: dict[str, str]) -> RunRequest:
    """A `verification_job` run of `root`: its config and ``statekeeper/root`` tag, no partition."""
    root = normalize_root(root, "the root to verify")
    return RunRequest(
        run_key=run_key,
        job_name=VERIFICATION_JOB,
        run_config={"ops": {VERIFY_OP: {"config": {"root": root}}}},
        tags={**tags, ROOT_TAG: root},
    )


__all__ = [
    "VERIFICATION_JOB",
    "VERIFY_KIND",
    "VERIFY_OP",
    "VerificationConfig",
    "verification_job",
    "verification_request",
]
