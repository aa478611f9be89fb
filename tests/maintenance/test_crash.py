"""kill -9 of snapshot, expiry and orphan runs (the CLI in a subprocess) at many points, then rerun:
no retained version is lost, every run converges, and the catalog equals a rebuild after a sync."""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from statekeeper.maintenance.catalog_sync import rebuild_catalog
from statekeeper.sql import Catalog
from tests.catalog_export import catalog_export
from tests.cli_support import run_module
from tests.maintenance.helpers import History, leftovers

OPS = {
    "snapshot": ["--threshold", "3"],
    "expire": ["--retain", "3", "--grace", "0", "--load-grace", "0"],
    "clean-orphans": ["--retain", "3", "--grace", "0", "--load-grace", "0"],
}


def run(args: list[str], env: dict[str, str], kill_at: int | None = None, mid: bool = False) -> int:
    """The CLI (or, with `kill_at`, `tests.maintenance.crash_runner`) in a fresh process forked from the CLI zygote."""
    if kill_at is None:
        proc = run_module("statekeeper.maintenance", *args, env=env)
    else:
        proc = run_module(
            "tests.maintenance.crash_runner", str(kill_at), *(["--mid"] if mid else []), "--", *args, env=env
        )
    assert proc.returncode in (0, -signal.SIGKILL), f"{args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.returncode


def crash_loop(h: History, tmp: Path, rounds: int, seed: int, max_kills: int = 2) -> int:
    """Rounds of new batches, then each operation killed at random points (at most `max_kills`
    times) and run again until it completes."""
    rng = random.Random(seed)
    db = f"sqlite:///{tmp / 'catalog.db'}"
    env = {
        **os.environ,
        "STATEKEEPER_DB_URL": db,
        "STATEKEEPER_WORK_DIR": str(tmp / "work"),
        "STATEKEEPER_LEASE_TTL_SECONDS": "1",  # a killed maintainer's lease expires quickly ...
        "STATEKEEPER_LEASE_TIMEOUT_SECONDS": "15",  # ... and the rerun waits for it
        "STATEKEEPER_DELETE_BATCH_SIZE": "3",  # many delete batches: many points to die between
        "STATEKEEPER_PARALLELISM": "2",
    }
    run(["db", "upgrade"], env)
    kills = 0
    for _ in range(rounds):
        h.batches(rng.randint(2, 4), losing=rng.randint(0, 1))
        for op, extra in OPS.items():
            for attempt in range(max_kills + 1):
                kill_at = rng.randint(1, 6) if attempt < max_kills else None
                code = run([op, h.root, *extra], env, kill_at=kill_at, mid=rng.random() < 0.5)
                if code == 0:
                    break
                kills += 1
                h.check_loadable(range(max(1, h.latest - 2), h.latest + 1))  # no retained version lost
    for op, extra in OPS.items():  # reruns without crashes converge
        run([op, h.root, *extra], env)
    h.check_loadable(range(max(1, h.latest - 2), h.latest + 1))
    from statekeeper.maintenance.settings import MaintenanceSettings

    assert (
        leftovers(h.root, MaintenanceSettings(min_versions_to_retain=3, orphan_grace_seconds=0, load_grace_seconds=0))
        == []
    )
    # The catalog, after a full sync, is what a rebuild from the checkpoint location alone gives.
    run(["catalog", "sync", h.root, "--full"], env)
    synced = Catalog.open(db)
    fresh = Catalog.open(f"sqlite:///{tmp / 'fresh.db'}", upgrade=True)
    try:
        rebuild_catalog(fresh, h.fm)
        assert _normalised(catalog_export(synced, h.fm.root_uri)) == _normalised(catalog_export(fresh, h.fm.root_uri))
    finally:
        synced.close()
        fresh.close()
    return kills


def _normalised(export: dict[str, list[tuple[Any, ...]]]) -> dict[str, list[tuple[Any, ...]]]:
    """The parent id of a store's oldest remaining version is history (its changelog and the commit
    record of its parent are expired): a catalog that saw them keeps it, a rebuild cannot know it."""
    versions = {(r[0], r[1], r[2]) for r in export["versions"]}
    fixed = [(*r[:4], r[4] if (r[0], r[1], r[2] - 1) in versions else None, *r[5:]) for r in export["versions"]]
    return {**export, "versions": fixed}


def test_killed_maintenance_runs_lose_nothing_and_converge(
    make_history: Callable[..., History], tmp_path: Path
) -> None:
    h = make_history()
    h.batches(4, losing=1)
    kills = crash_loop(h, tmp_path, rounds=1 if h.root.startswith("s3:") else 2, seed=1)
    assert kills >= 3


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_killed_maintenance_runs_at_many_more_points(
    make_history: Callable[..., History], tmp_path: Path, seed: int
) -> None:
    h = make_history(operators={"agg": 2, "dedup": 1})
    h.batches(4, losing=1)
    kills = crash_loop(h, tmp_path, rounds=6, seed=100 + seed, max_kills=6)
    # that the runs were killed often (the assertions are crash_loop's); how often varies with the timing: a kill
    # point beyond a run's last write lets it finish, and what a run writes depends on the files' ages (grace 0)
    assert kills >= 15, kills
