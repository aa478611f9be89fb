"""Does one maintenance process keep up with a fleet committing R store-commits a second? Measured, not inferred.

On a 2-core machine the writers of 1,000 store-commits a second would take the cores the maintainer needs, so
they write every version first, off the clock (`bench.fleet.writers.FleetWriters`, the commit record per version
as the driver writes it), and each version's files are set aside. Then one ``statekeeper maintain`` loop
(`statekeeper.maintenance.loop.maintain`, a cycle every ``--every`` seconds) keeps the root while a process of its
own (`Publisher`) publishes the versions into it at the rate asked, all along as writers commit: each version is
hard-linked in when its time comes, its changelogs first and its commit record last. The writers are on other
hosts: the publishing is not the maintainer's CPU, nor does it hold the maintainer's interpreter lock (as a thread
of the maintainer's process it took a third of the process's samples at 1,000 store-commits a second, while the
process coordinating the builds was the one at 100% of a core).

Reported, over whole periods after the warm-up (see `between` in `_run`): the store-commits the window's cycles
were given a second, the maintainer's CPU a store-commit (its process, every thread, and its build processes), the
cores it used, the longest chain (a store's versions due when its snapshot landed, as if its writers committed all
along, less its snapshot before; and every store's at the end of each cycle), and samples of the root
(`bench.fleet.sampling`). It kept up when every chain stays within 2x the snapshot threshold and the checkpoint
within its bound::

    python -m bench.fleet sustain --stores 128 --rate 1000 --seconds 19 --every 1 --build-processes 2 \\
        --snapshot-spread 0.5
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from bench.fleet.lockstep import build_processes_cpu, loop_settings, maintainer_cpu
from bench.fleet.maintainers import FleetParams, catalog_url
from bench.fleet.publisher import Publisher, move_tree, publish_up_to, write_versions
from bench.fleet.sampling import Sample, sample
from bench.fleet.writers import OPERATOR
from statekeeper.maintenance.health import chain_bound
from statekeeper.maintenance.settings import MaintenanceSettings, SnapshotSchedule

if TYPE_CHECKING:
    from statekeeper.maintenance.loop import CycleResult

log = logging.getLogger(__name__)
MAINTAINERS = ("maintain", "dagster", "daemon", "maintain+daemon")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet sustain", description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", type=int, default=128)
    parser.add_argument("--rate", type=float, default=1000.0, help="store-commits a second to publish")
    parser.add_argument("--seconds", type=float, default=19.0, help="seconds of versions after the warm-up's")
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--updates", type=int, default=1_000)
    parser.add_argument("--threshold", type=int, default=20, help="snapshot threshold (changelogs per snapshot)")
    parser.add_argument("--snapshot-spread", type=float, default=0.0, help="the maintainer's snapshot_spread")
    parser.add_argument(
        "--snapshot-schedule",
        choices=[s.value for s in SnapshotSchedule],
        default=SnapshotSchedule.THRESHOLD.value,
        help="the maintainer's snapshot_schedule",
    )
    parser.add_argument("--parallelism", type=int, default=4)
    parser.add_argument("--build-processes", type=int, default=0, help="snapshot build worker processes (0: threads)")
    parser.add_argument("--sample-every", type=float, default=10.0, help="seconds between samples of the root")
    parser.add_argument("--every", type=float, default=1.0, help="seconds from one cycle's start to the next's")
    parser.add_argument(
        "--sensor-every",
        type=float,
        help="maintain+daemon: seconds between the daemon's sensor ticks (default: --every)",
    )
    parser.add_argument(
        "--round-seconds",
        type=float,
        default=0.0,
        help="snapshot_round_seconds (0: no bound): builds due early then wait",
    )
    parser.add_argument(
        "--versions-dir", type=Path, help="keep the written versions here and reuse them in later runs (same fleet)"
    )
    parser.add_argument("--write-only", action="store_true", help="only write the versions (into --versions-dir)")
    parser.add_argument(
        "--work-dir", type=Path, help="the maintainer's work_dir (its replicas; default: beside the root)"
    )
    parser.add_argument(
        "--scratch",
        type=Path,
        help="where the root lives, and the versions and replicas unless placed elsewhere (default: the temp "
        "dir); /dev/shm keeps them in memory, so the run measures the maintainer, not this machine's disk",
    )
    parser.add_argument(
        "--catalog",
        action="store_true",
        help="with a SQLite catalog, as `maintain` runs by default; in the temp dir (on disk, as deployed), not in "
        "--scratch",
    )
    parser.add_argument(
        "--maintainer",
        choices=MAINTAINERS,
        default="maintain",
        help="maintain: one `statekeeper maintain` loop, a cycle every --every seconds; dagster: the code location's "
        "checkpoint sensor ticked every --every seconds and the runs it requests, executed in this process; daemon: "
        "`dagster-daemon` as deployed (its code server, a process per run), the sensor every --every seconds; "
        "maintain+daemon: the loop keeps the root and `dagster-daemon` runs beside it with the checkpoint sensor off, "
        "its external-maintenance sensor reporting the loop's runs every --every seconds (the deployment for a fleet "
        "this size on 2 cores). The Dagster ones keep their catalog and instance in the temp dir, as --catalog's",
    )
    parser.add_argument("--verbose", action="store_true", help="log every cycle (its seconds and reports)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(message)s")
    per_store = args.rate / args.stores  # versions a second of every store
    versions = versions_needed(args.threshold, per_store, args.seconds)
    base = Path(tempfile.mkdtemp(prefix="statekeeper-fleet-sustain-", dir=args.scratch))
    work = Path(tempfile.mkdtemp(prefix="statekeeper-fleet-work-", dir=args.work_dir)) if args.work_dir else base
    try:
        root = base / "ckpt"
        root.mkdir()
        held = write_versions(args.stores, args.keys, args.updates, args.versions_dir or base / "held", versions, base)
        if args.write_only:
            return 0
        if held[0].stat().st_dev != root.stat().st_dev:  # published by hard links
            parser.error(f"--versions-dir {held[0].parent} is not on the filesystem of the root ({base})")
        return _run(args, root, held, per_store, work / "replicas")
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def versions_needed(threshold: int, per_store: float, seconds: float) -> int:
    """The versions of every store a run writes: the warm-up's, then those of the measured seconds."""
    return 2 * threshold + math.ceil(per_store * seconds) + 1


def _run(args: argparse.Namespace, root: Path, held: list[Path], per_store: float, work: Path) -> int:
    from statekeeper.maintenance.loop import maintain
    from statekeeper.sql.catalog import Catalog
    from statekeeper.store.files import open_file_manager

    settings = loop_settings(args, str(work))
    move_tree(held[0], root, link=True)  # the bulk load (version 1): there before the maintainer starts
    shared = Publisher.shared()  # the versions published, the clock's start and the time taken off it
    snapshot_of: dict[str, int] = {}
    names = [f"{OPERATOR}/{p}" for p in range(args.stores)]
    rounds: Counter[str] = Counter()  # snapshots written, per store
    longest = longest_at_cycle_end = 0
    epoch = time.time() - time.perf_counter()  # a snapshot row's "written_at" less this: its perf_counter time
    errors: list[str] = []
    last_call: dict[str, float] = {"rounds": 0}  # the state after the previous cycle's callback
    warm: dict[str, float] = {}  # the state when the warm-up ended
    boundaries: list[dict[str, float]] = []  # the states at the starts of the rounds' cycles
    samples: list[Sample] = []
    settled: list[bool] = []  # per sample: taken after every store's first base move (off the bulk load)
    fleet = FleetParams(threshold=args.threshold, retain=settings.min_versions_to_retain, orphan_grace=60.0)
    off_cpu = 0.0

    def state(rounds_done: int) -> dict[str, float]:
        """What the window's ends are measured from: the time, the CPU (all of it, and the build processes'),
        the versions published, the rounds every store finished, and the time and CPU taken off the clock."""
        return {
            "t": time.perf_counter(),
            "cpu": tree_cpu(exclude=publisher.pid) if "daemon" in args.maintainer else maintainer_cpu(),
            "builds": build_processes_cpu(),
            "version": shared.published.value,
            "rounds": rounds_done,
            "off_cpu": off_cpu,
            "off_wall": shared.off_wall.value,
        }

    def take_sample() -> None:
        """The root's chains, files and bytes against the bound (`bench.fleet.sampling`), off the clock: the
        loop waits for this callback and the publisher for the sample, so its time and CPU are taken out of the
        window and the versions' clock stops."""
        nonlocal off_cpu
        with shared.pause:
            cpu0, wall0 = time.process_time(), time.perf_counter()
            samples.append(sample([root.as_uri()], fleet, wall0 - warm["t"]))
            off_cpu += time.process_time() - cpu0
            shared.off_wall.value += time.perf_counter() - wall0

    def due_by(t: float) -> int:
        return shared.due_by(t, per_store)

    def between(landed: list[Landed], cycle_errors: list[str]) -> None:
        """Take the figures after a cycle, given the snapshots it wrote (the warm-up: publish a quarter threshold of
        versions).

        The window runs over whole periods of the lock-step fleet: from the start of the cycle of the first round
        after the warm-up's (every store's first snapshot, a cold build) to the start of the cycle of the last
        round every store finished before the versions ran out. A period's round snapshots what the period
        before it published."""
        nonlocal longest, longest_at_cycle_end
        errors.extend(cycle_errors)
        before = min((snapshot_of.get(name, 0) for name in names), default=0)
        for store, version, written_at in landed:
            if shared.t0.value:  # the chain the store had when its snapshot landed, its writers committing all along
                longest = max(longest, due_by(written_at - epoch) - snapshot_of.get(store, 0))
            snapshot_of[store] = max(snapshot_of.get(store, 0), version)
            rounds[store] += 1
        now = time.perf_counter()
        done = min((rounds[name] for name in names), default=0)
        if not done:  # warm-up: a quarter threshold a cycle until every store's first snapshot is written
            publish_up_to(held, root, shared, min(len(held), shared.published.value + max(1, args.threshold // 4)))
            return
        if publisher.ran_out.is_set():  # this cycle ran past the versions: not in the window
            return
        if not shared.t0.value:
            shared.t0.value = now - (shared.published.value - 1) / per_store  # from here on, at the rate asked
            warm.update(state(done))
            publisher.start(stop)
        elif done > last_call["rounds"]:  # the previous cycle ended a round: its start bounds a period
            boundaries.append(dict(last_call))
        if now - warm["t"] >= args.sample_every * len(samples):
            take_sample()  # as the cycle left the root
            # this cycle started once every store's oldest retained version loaded from its first snapshot (written
            # by the warm-up's last version): its expiry deleted the bulk load and the changelogs up to that snapshot,
            # every store's at about the same time (the fleet's one burst; the steady state is from here on)
            settled.append(last_call.get("version", 0) >= warm["version"] + settings.min_versions_to_retain)
        # the chains now (of stores still waiting), and as if all of this cycle's snapshots had landed at its end
        at_end = shared.published.value
        longest = max(longest, at_end - min(snapshot_of.get(name, 0) for name in names))
        longest_at_cycle_end = max(longest_at_cycle_end, at_end - before)
        last_call.update(state(done))

    stop = threading.Event()
    publisher = Publisher(held, root, per_store, shared)
    dagster = args.maintainer in ("dagster", "daemon")  # Dagster's runs keep the root; else the loop
    with_daemon = "daemon" in args.maintainer
    use_db = args.catalog or dagster or with_daemon
    db_dir = Path(tempfile.mkdtemp(prefix="statekeeper-fleet-catalog-")) if use_db else None
    catalog = Catalog.open(catalog_url(db_dir), upgrade=True) if db_dir and not dagster else None
    beside = None
    if db_dir and with_daemon and not dagster:
        sensor_every = args.sensor_every or args.every
        beside = DaemonThread(root.as_uri(), settings, db_dir, sensor_every, stop, checkpoint_sensor=False)
    try:
        if dagster and db_dir is not None:
            cycles = _daemon_cycles if args.maintainer == "daemon" else _dagster_cycles
            cycles(root.as_uri(), settings, db_dir, args.every, stop, between)
        else:
            if beside is not None:
                beside.start()
            maintain(
                open_file_manager(root.as_uri()),
                settings,
                every=args.every,
                stop=stop,
                catalog=catalog,
                on_cycle=lambda result: between(_landed(result), [e for r in result.reports for e in r.errors]),
            )
    finally:
        if beside is not None:
            beside.stop()
        stop.set()
        if catalog is not None:
            catalog.close()
        if db_dir is not None:
            shutil.rmtree(db_dir, ignore_errors=True)
        publisher.stop()
    # without two round ends, it fell behind (or ran too short): the window is then all of it after the warm-up
    first, last = (boundaries[0], boundaries[-1]) if len(boundaries) > 1 else (warm, last_call)
    cpu = last["cpu"] - first["cpu"] - (last["off_cpu"] - first["off_cpu"])
    commits = int(last["version"] - first["version"]) * args.stores
    wall = last["t"] - first["t"] - (last["off_wall"] - first["off_wall"])
    # checkpoint bytes over the bound at each sample: before the bulk load expired, and after (the steady state)
    ratios = [(x.bytes / x.bound_bytes, ok) for x, ok in zip(samples, settled, strict=True)]
    steady, first_move = [r for r, ok in ratios if ok], [r for r, ok in ratios if not ok]
    figures = {
        "stores": args.stores,
        "rate_asked": args.rate,
        "store_commits_per_second": commits / wall,
        "cpu_ms_per_store_commit": 1000 * cpu / commits,
        "of_which_build_processes_ms": 1000 * (last["builds"] - first["builds"]) / commits,
        "cores_used": cpu / wall,
        "rounds": max(0, len(boundaries) - 1),
        "longest_chain": longest,
        "longest_chain_at_cycle_end": longest_at_cycle_end,
        "threshold": args.threshold,
        "catalog": db_dir is not None,
        "maintainer": args.maintainer,
        "chain_max_sampled": max(x.chain_max for x in samples),
        "bytes_over_bound_max": max(steady, default=0.0),
        "bytes_over_bound_first_base_move": max(first_move, default=0.0),
        "files_max": max(x.files for x in samples),
        "samples": len(samples),
        "kept_up": len(boundaries) > 1 and longest <= chain_bound(args.threshold) and bool(steady) and max(steady) <= 1,
        "errors": len(errors),
    }
    if beside is not None:  # what Dagster shows of the loop's work: the external-maintenance sensor's events
        recorded = beside.outcome.get("recorded")
        figures["dagster_materializations"] = getattr(recorded, "materializations", {})
    for x, ok in zip(samples, settled, strict=True):
        log.info(
            "sample at %.1fs: version %d, chain max %d, %d files, bytes / bound %.3f%s",
            x.t,
            x.version,
            x.chain_max,
            x.files,
            x.bytes / x.bound_bytes,
            "" if ok else " (before the first base move)",
        )
    print(json.dumps(figures))
    return 1 if errors else 0


Landed = tuple[str, int, float]
"""A snapshot a cycle wrote: its store (operator/partition), its version and when it was written (epoch seconds)."""


def _landed(result: CycleResult) -> list[Landed]:
    """The snapshots a cycle of the loop wrote, from its reports."""
    return [
        (row["store"], row["version"], row["written_at"])
        for r in result.reports
        for row in getattr(r, "items", [])
        if row.get("action") == "snapshot"
    ]


def _dagster_cycles(
    root: str,
    settings: MaintenanceSettings,
    db_dir: Path,
    every: float,
    stop: threading.Event,
    on_cycle: Callable[[list[Landed], list[str]], None],
) -> None:
    """Until `stop`: a tick of the checkpoint sensor every `every` seconds (start to start) and the runs it
    requests, in this process (`bench.fleet.dagster_runs`, the catalog in `db_dir`); after each, `on_cycle` with the
    snapshots the runs wrote and the failed runs' errors."""
    from bench.fleet.dagster_runs import DagsterMaintainer

    dagster = DagsterMaintainer(root, settings, catalog_url(db_dir))
    landed = _snapshots_landed(catalog_url(db_dir))
    try:
        while not stop.is_set():
            started = time.perf_counter()
            errors = dagster.tick()
            on_cycle(landed(), errors)
            stop.wait(max(0.0, every - (time.perf_counter() - started)))
    finally:
        dagster.close()
    log.warning("dagster runs: %s", dagster.runs)


def _daemon_cycles(
    root: str,
    settings: MaintenanceSettings,
    db_dir: Path,
    every: float,
    stop: threading.Event,
    on_cycle: Callable[[list[Landed], list[str]], None],
) -> None:
    """`dagster-daemon` as deployed (`DaemonThread`, the checkpoint sensor every `every` seconds) until `stop`; every
    `every` seconds, `on_cycle` with the snapshots its runs wrote (the failed runs are logged at the end)."""
    daemon = DaemonThread(root, settings, db_dir, every, stop, checkpoint_sensor=True)
    landed = _snapshots_landed(catalog_url(db_dir))
    daemon.start()
    try:
        while not stop.wait(every):
            on_cycle(landed(), [])
    finally:
        daemon.stop()


class DaemonThread:
    """`dagster-daemon` as deployed (`bench.fleet.dagster_runs.run_daemon`: its instance and the catalog in
    `db_dir`, the sensors every `every` seconds), run from a thread; without `checkpoint_sensor`, that sensor off
    (the loop keeps the root, the external-maintenance sensor reports its runs). A daemon that fails sets `stop`."""

    def __init__(
        self,
        root: str,
        settings: MaintenanceSettings,
        db_dir: Path,
        every: float,
        stop: threading.Event,
        *,
        checkpoint_sensor: bool,
    ) -> None:
        from bench.fleet.dagster_runs import run_daemon

        self._stop_file = db_dir / "stop"
        self.outcome: dict[str, object] = {}
        env = {} if checkpoint_sensor else {"STATEKEEPER_CHECKPOINT_SENSOR": "off"}

        def daemon() -> None:
            try:
                self.outcome["recorded"] = run_daemon(
                    root, str(db_dir), self._stop_file, settings, catalog_url(db_dir), cycle=every, env=env
                )
            except Exception as e:
                self.outcome["error"] = e
                stop.set()

        self._thread = threading.Thread(target=daemon, name="dagster-daemon")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop_file.touch()
        self._thread.join()
        if "error" in self.outcome:
            raise RuntimeError(f"dagster-daemon: {self.outcome['error']}")
        log.warning("dagster-daemon: %s", self.outcome.get("recorded"))


def _snapshots_landed(url: str) -> Callable[[], list[Landed]]:
    """A function that returns the snapshots the catalog learned of since its last call (the catalog's rows, with
    the times their manifests were written), the catalog migrated first so that it is there to read."""
    from sqlalchemy import select

    from statekeeper.sql.catalog import Catalog
    from statekeeper.sql.models import Snapshot, Store

    catalog = Catalog.open(url, upgrade=True)
    seen = 0

    def landed() -> list[Landed]:
        nonlocal seen
        with catalog.engine.connect() as conn:
            rows = conn.execute(
                select(Snapshot.id, Store.operator, Store.partition, Snapshot.version, Snapshot.created_at)
                .join(Store, Store.id == Snapshot.store_id)
                .where(Snapshot.id > seen)
                .order_by(Snapshot.id)
            ).all()
        seen = max([seen, *(row[0] for row in rows)])
        return [(f"{op}/{part}", version, at.timestamp()) for _, op, part, version, at in rows]

    return landed


def tree_cpu(exclude: int | None = None) -> float:
    """CPU seconds of this process and of every process it started but `exclude`, running or gone (those a process
    waited for count in its ``children_*`` times; this process is the subreaper of the others, see `run_daemon`)."""
    import psutil

    total = 0.0
    for proc in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        if proc.pid == exclude:
            continue
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total
