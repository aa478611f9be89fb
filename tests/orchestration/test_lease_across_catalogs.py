"""The lease lives with the store (DESIGN invariant 15) between the command line and Dagster: a `statekeeper`
command holding a store's lease with another catalog (or none) makes a Dagster run refuse that store."""

from __future__ import annotations

from pathlib import Path

from statekeeper.maintenance.leasing import store_lease
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.orchestration.assets import SNAPSHOTS
from statekeeper.orchestration.jobs import JOB_NAMES
from statekeeper.sql import Catalog
from statekeeper.store.files import open_file_manager
from statekeeper.store.layout import StoreId
from tests.orchestration.conftest import THRESHOLD, Orch


def test_a_snapshot_run_refuses_a_store_a_command_holds_with_another_catalog(orch: Orch, tmp_path: Path) -> None:
    """The command's catalog is not Dagster's (its own SQLite file): only the root's lease can tell the run that
    the store is busy. The run snapshots the free store, refuses the held one by its holder's name, and leaves
    the files the holder just wrote (an SST of the snapshot it is building, no manifest yet) where they are."""
    orch.writer.commit(THRESHOLD + 1)
    fm = open_file_manager(orch.root)
    held, free = StoreId("agg", 1), StoreId("agg", 0)
    settings = MaintenanceSettings(lease_ttl_seconds=60.0, work_dir=str(tmp_path / "cli"))
    fresh = held.sst("000009-fresh-from-the-command.sst")
    with (
        Catalog.open(f"sqlite:///{tmp_path / 'the-commands-catalog.db'}", upgrade=True) as theirs,
        store_lease(fm, held, settings, theirs),
    ):
        with fm.create(fresh) as out:
            out.write(b"an SST the command's snapshot is uploading")
        before = {i.path: i.size for i in fm.list(held.prefix + "/")}
        job = orch.defs.resolve_job_def(JOB_NAMES[SNAPSHOTS])
        result = job.execute_in_process(partition_key=orch.root, instance=orch.instance, raise_on_error=False)
        after = {i.path: i.size for i in fm.list(held.prefix + "/")}
        assert orch.catalog.leases(orch.root) == [], "Dagster's catalog never saw the command's lease"
    assert after == before, "the held store is untouched: no snapshot, its fresh SST kept"
    assert fm.exists(fresh)
    assert not result.success, "the refusal is an error of the run, named"
    said = " ".join(str(e.step_failure_data.error) for e in result.all_events if e.is_step_failure)
    assert "store agg/1" in said and "holds its lease" in said, said
    assert any(i.path.endswith(".manifest") for i in fm.list(free.snapshot_dir())), "the free store is snapshotted"
