"""What does the maintainer's loop cost per store-commit, its writers in lock step (profiled, for tuning)?

The maintainer's CPU per store-commit, measured and profiled in one process, for tuning the loop.

`bench.fleet.beside` measures a maintainer beside real-time writers; on a shared machine that is slow and
noisy. This drives the same writers (`bench.fleet.writers.FleetWriters`, child processes) in lock step
instead: `per_cycle` commits of every store, then one `statekeeper maintain` cycle here, whose CPU time
(this process, all threads) alone is counted, after `warmup` cycles. With ``--profile FILE`` the
measured cycles run under cProfile with a thread-CPU clock (use ``--parallelism 1`` to see the snapshot
builds, which otherwise run on pool threads)::

    python -m bench.fleet lockstep --stores 16 --cycles 20 [--catalog] [--s3] [--profile /tmp/cycle.prof]

With ``--roots R`` the stores are spread over R checkpoint roots (a query each; R writer processes),
all kept by the one loop (`statekeeper maintain ROOT ...`).

With ``--dagster`` a cycle is instead one tick of the checkpoint sensor and the runs it requests
(`bench.fleet.dagster_runs`), with the SQLite catalog; the schedules' runs are not part of it.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import math
import os
import pstats
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack, closing
from pathlib import Path
from typing import TYPE_CHECKING

from bench.fleet.writers import FleetWriters

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from statekeeper.maintenance.loop import CycleResult
    from statekeeper.maintenance.settings import MaintenanceSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet lockstep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", type=int, default=16, help="stores in all (spread over the roots)")
    parser.add_argument("--roots", type=int, default=1, help="checkpoint roots, one query (writer) each")
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument(
        "--warmup", type=int, help="cycles not measured (default: 10, or more so that every store was snapshotted once)"
    )
    parser.add_argument("--per-cycle", type=int, default=2, help="commits of every store between two cycles")
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--updates", type=int, default=1_000)
    parser.add_argument("--parallelism", type=int, default=4)
    parser.add_argument("--threshold", type=int, default=10, help="snapshot threshold (changelogs per snapshot)")
    parser.add_argument("--build-processes", type=int, default=0, help="snapshot build worker processes (0: threads)")
    parser.add_argument("--catalog", action="store_true", help="with a SQLite catalog, as `maintain` by default")
    parser.add_argument("--profile", type=Path, help="write the measured cycles' profile here")
    parser.add_argument("--s3", action="store_true", help="the root on S3: moto's server on 127.0.0.1")
    parser.add_argument("--dagster", action="store_true", help="the sensor and the runs it requests, not `maintain`")
    args = parser.parse_args(argv)
    if args.warmup is None:  # a store's first snapshot is a cold build, not what a long run measures: by cycle
        # n every store has 1 + n * per_cycle changelogs, so its chain reached the threshold by this one
        args.warmup = max(10, math.ceil(args.threshold / args.per_cycle))
    base = tempfile.mkdtemp(prefix="statekeeper-fleet-profile-")
    try:
        if args.roots < 1 or args.stores % args.roots:
            parser.error("--stores must be a multiple of --roots")
        if not args.s3:
            roots = [Path(base, f"ckpt{i}") for i in range(args.roots)]
            for root in roots:
                root.mkdir()
            return _run(args, [root.as_uri() for root in roots], base)
        from testkit.s3 import emulator_env, moto_server, s3_client

        with moto_server() as endpoint, emulator_env(endpoint):  # the writer processes inherit the environment
            s3_client(endpoint).create_bucket(Bucket="fleet")
            return _run(args, [f"s3://fleet/ckpt{i}" for i in range(args.roots)], base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _run(args: argparse.Namespace, uris: list[str], base: str) -> int:
    from statekeeper.maintenance.loop import maintain
    from statekeeper.sql.catalog import Catalog
    from statekeeper.store.files import open_file_manager

    settings = loop_settings(args, os.path.join(base, "replicas"))
    profiler = cProfile.Profile(time.thread_time) if args.profile else None
    cpu = wall = builds_cpu = 0.0
    started_builds = 0.0
    measured = 0
    started = started_wall = 0.0
    errors: list[str] = []

    def between_cycles(result: CycleResult) -> None:
        """After each cycle: count its CPU if measured, then commit the next round of every store."""
        nonlocal cpu, wall, measured, started, started_wall, builds_cpu, started_builds
        if profiler is not None:
            profiler.disable()
        errors.extend(e for r in result.reports for e in r.errors)  # a failed operation does less work
        if result.cycle > args.warmup:
            cpu += maintainer_cpu() - started
            builds_cpu += build_processes_cpu() - started_builds
            wall += time.perf_counter() - started_wall
            measured += args.per_cycle * args.stores
        for _ in range(args.per_cycle):
            writers.commit_next()
        started, started_wall, started_builds = maintainer_cpu(), time.perf_counter(), build_processes_cpu()
        if profiler is not None and result.cycle >= args.warmup:
            profiler.enable()

    with ExitStack() as stack:
        writers = stack.enter_context(FleetWriters(uris, args.stores, len(uris), args.keys, args.updates, base))
        catalog = (
            stack.enter_context(closing(Catalog.open(f"sqlite:///{base}/catalog.db", upgrade=True)))
            if args.catalog
            else None
        )
        for _ in range(1 + args.per_cycle):  # the bulk load, then the first round
            writers.commit_next()
        started, started_wall = maintainer_cpu(), time.perf_counter()
        cycles = args.warmup + args.cycles
        if args.dagster:
            _dagster_cycles(",".join(uris), base, settings, cycles, between_cycles)
        else:
            # One loop, as `statekeeper maintain` runs: what it keeps across cycles (leases taken before the
            # listing, warm replicas, parsed records) counts; the writers commit between its cycles.
            fms = [open_file_manager(u) for u in uris]
            maintain(fms, settings, every=0, cycles=cycles, catalog=catalog, on_cycle=between_cycles)
    figures = {
        "stores": args.stores,
        "roots": len(uris),
        "store_commits": measured,
        "cpu_ms_per_store_commit": 1000 * cpu / measured,
        "of_which_build_processes_ms": 1000 * builds_cpu / measured,
        # The writers wait while a cycle runs: these are the maintainer's own ceiling, as many cores as it
        # can keep busy (Python's GIL holds most of a cycle to one) and the store-commits it keeps up with.
        "cores_used": cpu / wall,
        "store_commits_per_second_max": measured / wall,
    }
    print(json.dumps({**figures, "errors": len(errors)}))
    for text in errors[:10]:
        log.error("maintenance cycle error: %s", text)
    if profiler is not None:
        profiler.dump_stats(args.profile)
        pstats.Stats(str(args.profile)).sort_stats("cumulative").print_stats(40)
    return 1 if errors else 0  # the figure of cycles that failed part of their work is not the maintainer's cost


def loop_settings(args: argparse.Namespace, work_dir: str) -> MaintenanceSettings:
    """The maintainer's settings in the fleet's benchmarks: retain max(20, threshold), orphans kept a minute,
    no load grace; `args` gives the threshold, spread, schedule and round bound (if any), parallelism and build
    processes."""
    from statekeeper.maintenance.settings import MaintenanceSettings, SnapshotSchedule

    return MaintenanceSettings(
        snapshot_threshold=args.threshold,
        snapshot_spread=getattr(args, "snapshot_spread", 0.0),
        snapshot_schedule=SnapshotSchedule(getattr(args, "snapshot_schedule", "threshold")),
        snapshot_round_seconds=getattr(args, "round_seconds", 0.0),
        min_versions_to_retain=max(20, args.threshold),
        orphan_grace_seconds=60.0,
        load_grace_seconds=0.0,
        parallelism=args.parallelism,
        build_processes=args.build_processes,
        work_dir=work_dir,
    )


def maintainer_cpu() -> float:
    """CPU seconds of this process (all threads) and of its snapshot build processes, if any."""
    return time.process_time() + build_processes_cpu()


def build_processes_cpu() -> float:
    import psutil

    from statekeeper.maintenance.build_processes import running_build_processes

    total = 0.0
    for pid in running_build_processes():
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _dagster_cycles(
    roots: str, base: str, settings: MaintenanceSettings, cycles: int, between: Callable[[CycleResult], None]
) -> None:
    from bench.fleet.dagster_runs import DagsterMaintainer
    from statekeeper.maintenance.loop import CycleResult

    dagster = DagsterMaintainer(roots, settings, f"sqlite:///{base}/catalog.db")
    try:
        for n in range(1, cycles + 1):
            dagster.tick()
            between(CycleResult(n, 0.0))
    finally:
        dagster.close()
    print(json.dumps({"dagster_runs": dagster.runs}))
