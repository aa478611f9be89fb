"""The example `make run` runs, and maintenance on its checkpoint: every operation, no problem reported.

The example (examples/session_count.py) runs briefly from batch 0, as a user would run it; then every
maintenance operation runs on its checkpoint through the `statekeeper` command line and through Dagster
(the jobs and their asset checks materialised in process for that root). Each succeeds and reports
neither an error nor a warning (nothing of ours is "foreign"); after expiry and orphan cleanup with no
grace the root holds only what the retained versions need; the job then resumes from it where it
stopped and its exactly-once check (over both runs) still passes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dagster import DagsterInstance

from statekeeper.maintenance.file_kinds import BATCH, CHANGELOG, HEARTBEAT
from statekeeper.maintenance.inventory import Inventory, clear_caches
from statekeeper.maintenance.plan import plan_root
from statekeeper.maintenance.replica_pool import close_replicas
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.orchestration.assets import LINEAGE, ORPHANS, RETAINED, SNAPSHOTS
from statekeeper.orchestration.config import OrchestrationConfig, parse_roots
from statekeeper.orchestration.definitions import build_definitions
from statekeeper.orchestration.jobs import JOB_NAMES
from statekeeper.store.files import open_file_manager
from tests.cli_support import run_cli
from tests.orchestration.conftest import make_resources
from tests.spark.example_runner import run_example

RETAIN = 1
THRESHOLD = 1
OPS = ["--retain", str(RETAIN), "--threshold", str(THRESHOLD), "--grace", "0", "--load-grace", "0"]


def _cli(home: Path, *args: str) -> dict[str, Any]:
    proc = run_cli(*args, "--json", home=home)
    doc = json.loads(proc.stdout)
    if not isinstance(doc, dict):
        return {"rows": doc}
    for key in ("errors", "problems", "warnings"):
        assert not doc.get(key), f"statekeeper {' '.join(args)} reported {key}: {doc[key]}"
    assert "WARNING" not in proc.stderr and "ERROR" not in proc.stderr, proc.stderr
    return dict(doc)


def _dagster(root: str, tmp_path: Path) -> None:
    config = OrchestrationConfig(roots=parse_roots(root))
    resources = make_resources(
        config,
        f"sqlite:///{tmp_path / 'dagster-catalog.db'}",
        snapshot_threshold=THRESHOLD,
        min_versions_to_retain=RETAIN,
        work_dir=str(tmp_path / "dagster-work"),
    )
    defs = build_definitions(config, resources)
    instance = DagsterInstance.ephemeral()
    try:
        for asset in (LINEAGE, SNAPSHOTS, RETAINED, ORPHANS):
            job = defs.resolve_job_def(JOB_NAMES[asset])
            result = job.execute_in_process(partition_key=config.roots[0], instance=instance)
            assert result.success, asset
            for mat in result.get_asset_materialization_events():
                md = {k: v.value for k, v in mat.materialization.metadata.items()}
                assert md.get("errors", 0) == 0 and md.get("warnings", 0) == 0, (asset, md)
            for check in result.get_asset_check_evaluations():
                assert check.passed, (asset, check.check_name, check.metadata)
    finally:
        instance.dispose()


def _only_what_retained_versions_need(root: str) -> None:
    clear_caches()
    inv = Inventory.scan(open_file_manager(root))
    settings = MaintenanceSettings(
        snapshot_threshold=THRESHOLD, min_versions_to_retain=RETAIN, orphan_grace_seconds=0, load_grace_seconds=0
    )
    plan = plan_root(inv, settings)
    assert not plan.problems and not plan.warnings and not plan.foreign, (plan.problems, plan.warnings)
    assert not plan.expired_commits and not plan.expired_batches and not plan.orphans
    # the root's in-flight files and each store's (a changelog of the batch the stop interrupted)
    in_flight = plan.in_flight + [f for p in plan.stores.values() for f in p.in_flight]
    kept_in_flight = {e.path for e, _ in in_flight}
    for e, why in in_flight:  # only a batch the stop interrupted (Spark re-runs it on restart)
        assert e.kind == HEARTBEAT or (e.version == inv.latest + 1 and e.kind in (BATCH, CHANGELOG)), (e.path, why)
    needed = {e.path for p in plan.stores.values() for e in p.needed}
    for p in plan.stores.values():
        assert not p.expired and not p.orphans and not p.problems, (p.store, p.expired, p.orphans, p.problems)
        assert p.latest == inv.latest and p.base is not None
        changelogs = [e for e in p.needed if e.kind == CHANGELOG]
        assert len(changelogs) == p.latest - p.base[0] <= RETAIN - 1 + THRESHOLD
    root_files = {e.path for e in inv.commit_files.values()} | {e.path for e in inv.batch_files}
    assert min(inv.commit_files) == plan.floor
    assert {e.version for e in inv.batch_files} <= set(range(plan.floor, inv.latest + 2))
    everything = {e.path for e in inv.all_entries()}
    assert everything == needed | root_files | kept_in_flight, everything - needed - root_files - kept_in_flight


def test_maintenance_on_the_example_job_reports_nothing_and_keeps_it_bounded(tmp_path: Path) -> None:
    work = tmp_path / "sessions"
    out, first = run_example(work, 20)
    assert "Exception" not in out, out[-3000:]
    for _ in range(2):  # a loaded machine starts Spark slowly: resume until two batches are committed
        if len(first) >= 2:
            break
        first += run_example(work, 12)[1]
    assert len(first) >= 2 and first[0] == 0, first
    root = (work / "state").as_uri()
    home = tmp_path / "home"
    try:
        inspect = _cli(home, "inspect", root, *OPS)
        assert inspect["files"].get("batch", 0) >= len(first) and "foreign" not in inspect["files"]
        for dry in (["expire", root, "--dry-run"], ["clean-orphans", root, "--dry-run"]):
            _cli(home, *dry, *OPS)
        assert _cli(home, "snapshot", root, *OPS, "--work-dir", str(tmp_path / "cli-work"))["snapshots"] > 0
        _cli(home, "verify", root, *OPS, "--rebuild")
        _cli(home, "catalog", "sync", root, "--full")
        _cli(home, "catalog", "chains", root)
        expired = _cli(home, "expire", root, *OPS)
        assert expired["changelogs"] > 0 and expired["batch_files"] > 0 and expired["commit_records"] > 0
        _cli(home, "clean-orphans", root, *OPS)
        _cli(home, "verify", root, *OPS)
        _dagster(root, tmp_path)
        _only_what_retained_versions_need(root)
    finally:
        close_replicas()
    out, second = run_example(work, 8)  # resumes from the maintained checkpoint; exactly-once still holds
    # the next batch; or the one after, if the stop came after a commit record but before Spark's own
    # commit (then the resumed run re-delivers that batch to the sink as a [replay] first)
    assert second and first[-1] < second[0] <= first[-1] + 2, f"resumed at batch {second[:1]} after {first[-1]}"
    assert "Exception" not in out, out[-3000:]
