"""Snapshot builds in worker processes (``build_processes``): the same snapshots as the threads build, on every
backend; a worker killed mid-build fails that build only, and its store's next build is warm again; a lost
lease stops the write; the workers end with their maintainer, even one killed with SIGKILL."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from statekeeper.maintenance import replica_pool
from statekeeper.maintenance.build_processes import (
    BuildProcessError,
    BuildProcesses,
    BuildRequest,
    close_build_processes,
    running_build_processes,
)
from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.loop import CycleResult, maintain
from statekeeper.maintenance.plan import plan_store
from statekeeper.maintenance.reports import SnapshotReport
from statekeeper.maintenance.root_leases import MaintenanceBusyError
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_builds import build_request, create_snapshots
from statekeeper.maintenance.verify import verify_root
from statekeeper.store.files import open_file_manager
from statekeeper.store.layout import StoreId
from tests.maintenance.helpers import History, all_files


@pytest.fixture(autouse=True)
def _stop_build_processes() -> Iterator[None]:
    replica_pool.close_replicas()  # what an earlier suite of this process left open is not this test's
    yield
    close_build_processes()


def test_build_processes_write_the_snapshots_the_threads_would(
    make_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    h = make_history(operators={"agg": 3, "other": 1})
    by_processes = settings.with_(build_processes=2)
    snapshots: list[int] = []

    def after(result: CycleResult) -> None:
        assert result.ok, [e for r in result.reports for e in r.errors]
        snapshots.extend(r.snapshots for r in result.reports if isinstance(r, SnapshotReport))
        h.batches(settings.snapshot_threshold)

    h.batches(settings.snapshot_threshold)
    maintain(h.fm, by_processes, every=0, cycles=4, on_cycle=after)
    assert snapshots == [len(h.stores)] * 4
    assert len(running_build_processes()) == 2  # the stores spread over both
    assert not any(s.replica for s in replica_pool._slots.values()), "a replica was opened in the maintainer"
    manifests = [p for p in all_files(h.root) if p.endswith(".manifest")]
    assert len(manifests) >= len(h.stores)
    assert verify_root(h.fm, settings).ok
    h.check_loadable(h.retained(settings))
    # new workers without their copies build cold, from the snapshots they read (only then) from the root
    close_build_processes()
    shutil.rmtree(replica_pool.work_root(settings))
    (result,) = maintain(h.fm, by_processes, every=0, cycles=1)
    (report,) = [r for r in result.reports if isinstance(r, SnapshotReport)]
    assert result.ok and report.cold_builds == len(h.stores), report
    assert all(row["base_version"] for row in report.items), report.items
    h.check_loadable([h.latest])


def _request(h: History, store: StoreId, settings: MaintenanceSettings) -> BuildRequest:
    inv = Inventory.scan(h.fm)
    return build_request(h.fm, inv, plan_store(inv, store, settings), settings)


def test_a_build_process_killed_mid_build_fails_that_build_only(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    """SIGKILL between the build and the write (the worker holds a built copy, nothing written): the build
    fails naming the store, nothing half-written is left, and the next build starts a new worker, which
    finds the copy warm in its directory."""
    h = make_local_history()
    h.batches(6)
    store = h.stores[0]
    pool = BuildProcesses(1)
    try:

        def kill_the_worker() -> None:
            (pid,) = pool.pids()
            os.kill(pid, signal.SIGKILL)
            psutil.Process(pid).wait(10)

        with pytest.raises(BuildProcessError, match=f"store {store}.*ended"):
            pool.build(h.fm, _request(h, store, settings), kill_the_worker)
        assert not any(p.endswith(".manifest") for p in all_files(h.root))
        h.batches(2)
        stats, result = pool.build(h.fm, _request(h, store, settings), lambda: None)
        assert stats.warm and stats.changelogs == 2, stats  # the copy the killed worker built, advanced
        assert result.manifest.version == h.latest
    finally:
        pool.close()
    h.check_loadable([h.latest], [store])


def test_a_lost_lease_stops_the_write(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    h = make_local_history()
    h.batches(5)
    store = h.stores[0]
    pool = BuildProcesses(1)
    try:

        def lost() -> None:
            raise MaintenanceBusyError(f"the lease of store {store} was lost")

        with pytest.raises(MaintenanceBusyError):
            pool.build(h.fm, _request(h, store, settings), lost)
        assert not any(p.endswith(".manifest") for p in all_files(h.root))
        _, result = pool.build(h.fm, _request(h, store, settings), lambda: None)  # the same worker goes on
        assert result.manifest.version == h.latest
    finally:
        pool.close()


def test_a_lost_lease_stops_the_write_of_a_build_on_a_thread(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    """The same question on the thread path (`BuildRequest.build_and_write`, what `create_snapshots` runs without
    build processes, with the store lease's `check`): a lost lease between build and write writes nothing."""
    h = make_local_history()
    h.batches(5)
    store = h.stores[0]

    def lost() -> None:
        raise MaintenanceBusyError(f"the lease of store {store} was lost")

    with pytest.raises(MaintenanceBusyError):
        _request(h, store, settings).build_and_write(h.fm, lost)
    assert not any(p.endswith(".manifest") for p in all_files(h.root))
    _, result = _request(h, store, settings).build_and_write(h.fm, lambda: None)
    assert result.manifest.version == h.latest


def _snapshots_in_a_run_process(root: str, settings: dict[str, Any], out: Any) -> None:
    """A maintenance run in a process of its own, as Dagster's code server starts each run (multiprocessing)."""
    report = create_snapshots(open_file_manager(root), MaintenanceSettings(**settings))
    out.put((report.snapshots, report.warm_builds, report.errors, running_build_processes()))


def test_a_run_process_started_by_multiprocessing_exits_and_leaves_its_replicas_to_the_next(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    """multiprocessing ends a process it started by terminating its daemonic children (the build processes ignore
    SIGTERM) and joining them: unless the workers are told to stop first, the run's process never exits and its
    workers keep every replica locked, so the next run's workers build each store in a temporary copy, cold."""
    h = make_local_history(operators={"agg": 3})
    ctx = multiprocessing.get_context("spawn")
    warm_builds = []
    for _ in range(2):
        h.batches(settings.snapshot_threshold)
        out = ctx.Queue()
        run = ctx.Process(
            target=_snapshots_in_a_run_process, args=(h.root, settings.with_(build_processes=2).to_json(), out)
        )
        run.start()
        try:
            snapshots, warm, errors, pids = out.get(timeout=120)
            run.join(30)
            workers = [psutil.Process(pid) for pid in pids if psutil.pid_exists(pid)]
            _, alive = psutil.wait_procs(workers, timeout=30)
        finally:
            if run.is_alive():
                for child in psutil.Process(run.pid).children(recursive=True):
                    child.kill()
                run.kill()
                run.join(30)
        assert run.exitcode == 0, "the run's process exited"
        assert not alive, f"build processes outlived their run: {alive}"
        assert (snapshots, errors) == (len(h.stores), [])
        warm_builds.append(warm)
    assert warm_builds == [0, len(h.stores)], "the second run's workers took over the first run's replicas"


def test_build_processes_end_with_a_maintainer_killed_with_sigkill(
    make_local_history: Callable[..., History], tmp_path: Path
) -> None:
    h = make_local_history()
    h.batches(9)
    env = {**os.environ, "STATEKEEPER_HOME": str(tmp_path / "home")}
    env.pop("STATEKEEPER_DB_URL", None)
    cmd = [sys.executable, "-m", "statekeeper.maintenance", "maintain", h.root, "--every", "0.2", "--threshold", "2"]
    proc = subprocess.Popen([*cmd, "--build-processes", "2"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("cycle ")  # its first cycle built snapshots in the workers
        workers = [c for c in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(c.cmdline())]
        assert len(workers) == 2, workers  # its two stores, one in each
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        _, alive = psutil.wait_procs(workers, timeout=30)
        assert not alive, f"build processes outlived their maintainer: {alive}"
    finally:
        proc.kill()
        proc.wait(30)


def test_sigterm_to_the_whole_group_stops_the_maintainer_cleanly(
    make_local_history: Callable[..., History], tmp_path: Path
) -> None:
    """A service manager stops a unit by signalling every process in it: the workers let the maintainer
    finish its root's cycle (their builds included), then end with it; nothing fails."""
    h = make_local_history(operators={"agg": 4})
    h.batches(9)
    env = {**os.environ, "STATEKEEPER_HOME": str(tmp_path / "home")}
    env.pop("STATEKEEPER_DB_URL", None)
    cmd = [sys.executable, "-m", "statekeeper.maintenance", "maintain", h.root, "--every", "0", "--threshold", "1"]
    proc = subprocess.Popen(
        [*cmd, "--build-processes", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("cycle ")
        workers = [c for c in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(c.cmdline())]
        assert len(workers) == 2, workers
        h.batches(2)  # the next cycles have snapshots to build when the signal lands
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        _, alive = psutil.wait_procs(workers, timeout=30)
    finally:
        proc.kill()
        proc.wait(30)
    assert proc.returncode == 0, err
    assert "SIGTERM: stopping after the current root's cycle" in err
    assert not alive, f"build processes outlived their maintainer: {alive}"
