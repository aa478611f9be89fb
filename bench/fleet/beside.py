"""What rate does one maintainer keep up with, beside writers committing in real time, as each deployment runs it?

S stores (one operator with S partitions in one checkpoint root, as one streaming query with S state
partitions; or spread over `roots` roots, a fleet of queries, each with its own driver's commit records)
hold `keys` keys each (16-byte keys, 64-byte values) and commit `updates` random updates per version on a
steady cadence (`interval` seconds), driven by `writers` writer processes on the store API (no Spark); a
driver writes the commit record of every version once every partition committed, as Spark's driver does.
Beside them, one maintainer process, exactly as deployed, in one of these modes:

- ``cli``: a loop running ``statekeeper snapshot``, ``expire`` and ``clean-orphans`` (each a new process,
  with the default SQLite catalog and a ``--work-dir`` for warm replicas) every `cycle` seconds, as cron
  or a shell loop would;
- ``maintain``: ``statekeeper maintain --every <cycle>``, one long-running process doing the same;
- ``dagster``: the checkpoint sensor ticked every `cycle` seconds, each snapshot run it requests executed
  (in process, with its asset checks), all in one process;
- ``daemon``: Dagster as deployed: ``dagster-daemon run -w workspace.yaml`` with orchestration/dagster.yaml
  (`bench.fleet.dagster_runs.run_daemon`), its code server and a process per run, the sensor's interval set
  to `cycle` (the daemon ticks a sensor every 5 s at most).

Dagster's schedules (expiry, verification, orphan cleanup) keep their default crons (hourly, hourly,
daily), as deployed, or run every `schedule` seconds (the daemon: every minute, the finest a cron fires)
to measure their runs.

Sampled every `sample_every` seconds from the bench process: chain length p50/p99/max across stores,
snapshot lag, files and bytes in the root, live state bytes (the newest snapshot of every store) and the
target bound (live state + the retained changelogs + 20%). At the end: the maintainer's CPU seconds
(its own and its children's) per store-commit, and what that gives for 1,000 store-commits per second.

Where a maintainer's CPU goes (`statekeeper maintain` cycles, 16 stores x 10k keys, 1k updates per
commit, 2 commits per store per cycle, threshold 10; CPU of the maintainer only, cProfile with a
thread-time clock, on the shared development machine): listing and classifying the root was ~40% while
each of the three operations listed it (now once per cycle, `statekeeper.maintenance.loop`); replaying a
1k-update changelog into a replica cost ~2 ms, nearly all of it RocksDB's skip-list memtable inserts
(now a vector memtable, sorted once at flush: ~1 ms less); with the default SQLite catalog, catalog work
(leases per store and operation, marking deleted files, the incremental sync after snapshots, run
records) is about half of what is left. Measured per store-commit: 5.4-5.6 -> 4.2 ms without a catalog,
8.6-9.3 -> 7.9 ms with it, then ~5 ms once a cycle took one lease per store and (since) all of them in
one transaction. Beyond 32 stores each snapshot also reopened its replica's DB (~3 ms of CPU: the
process kept only 32 open); with a copy of every store open, 3.8 -> 1.7 ms per store-commit (`maintain`,
fitted over 16-128 stores), i.e. 1,000 store-commits/s in 2 cores. What is left is mostly the snapshot:
the flush of what was replayed (a sort of the vector memtable, ~6 ms per 10k updates), the replay itself,
the snapshot's hashing and upload. The Dagster path cost ~0.7 ms more per store-commit (2.58 against
1.88 ms, fitted over 16-128 stores, 746c1f3); 1.79 against 1.65 ms since (de3a834) once its runs took all
their stores' leases in one transaction and listed each store once under them, its sensor's ticks read
commit records and listed every store's directories only every STATEKEEPER_SENSOR_LISTING_SECONDS, and
expiry marked the files of all its stores in one catalog statement. What it still does beyond the loop:
Dagster's own work per tick and run (resources built per sensor evaluation, the run's event log), and a
listing per run instead of one per cycle.

As deployed (``daemon``, 16 stores), a run cost ~1.8 s of CPU: Dagster's default multiprocess executor
started one more process per step (the operation and each asset check), each importing Dagster and
statekeeper again (~0.9 s). With the in-process executor (`orchestration/definitions.py`) a run is one
process: 51.6 -> 24.9 ms per store-commit at 16 stores. The queued-run coordinator also polled every 5 s
after the sensor's 5 s tick; at its default the chains reached 22 (threshold 10), at 1 s
(orchestration/dagster.yaml) 17. And the daemon launched the sensor's expiry runs with every asset check,
the loadability check (every retained version verified) included: a request with an empty check
selection and no asset selection is not a subset for it. With the expiry asset named in the request:
4.99 -> 4.15 ms per store-commit at 128 stores (schedules off). Left per run as deployed (py-spy over the
daemon's process tree, 128 stores): ~1.7 s of imports, mostly Dagster's, and ~0.8 s of Dagster's run and
daemon machinery; the snapshots themselves cost what they cost in the loop, plus ~4 ms per store to
reopen its replica in a fresh process. ``--fanout N`` compares stores snapshotted per second on a
Spark standalone cluster.

    python -m bench fleet                                   # the sweep in FULL (the lead's machine)
    python -m bench.fleet beside --stores 64 --seconds 120 --mode cli    # one run, printed
    python -m bench.fleet beside --stores 64 --seconds 120 --mode daemon --threshold 6
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from bench.baselines import KEY_BYTES, VALUE_BYTES
from bench.fleet.fanout import FanoutParams, fanout_table, run_fanout
from bench.fleet.floor import rocksdict_floor
from bench.fleet.landing import chains_at_snapshots, landing_summary
from bench.fleet.maintainers import MODES, FleetParams, maintain
from bench.fleet.sampling import Sample, sample
from bench.fleet.writers import FleetWriters
from bench.report import ROOT, Table

log = logging.getLogger("bench.fleet")

PLOT = ROOT / "docs" / "fleet.png"


FULL = [
    *(FleetParams(stores=s, seconds=90, mode=m) for s in (16, 64, 128) for m in ("maintain", "dagster", "daemon")),
    FleetParams(stores=128, seconds=90, mode="daemon", schedule=60),
    *(FleetParams(stores=128, roots=8, seconds=90, mode=m) for m in ("maintain", "daemon")),
]
"""The deployed paths (the `statekeeper maintain` loop, Dagster's runs in process, Dagster as deployed, its
schedules on their default crons) at 16, 64 and 128 stores (past the 100 stores whose health the Dagster UI
plots one by one, a cost that stops growing there), and Dagster as deployed with every schedule every minute
at 128 stores: what the schedules' runs (an expiry, a verification of every retained version outside the
root's run slot, an orphan cleanup) cost and do to the chains under load; and the same 128 stores as 8
queries of 16 partitions, each in its own root (Dagster: one fleet run for the roots a tick found work
in). The cron-style `cli` mode (a new process per command) runs with `--mode cli`."""
QUICK = [
    FleetParams(stores=s, keys=1_000, updates=100, seconds=10, sample_every=3, cycle=1, schedule=4, mode=m)
    for s in (2, 4)
    for m in ("cli", "maintain", "dagster")  # the daemon needs half a minute to tick and launch a run
]
FANOUT_QUICK = FanoutParams(stores=4, keys=500, updates=50, versions=3)


@dataclass
class FleetResult:
    params: FleetParams
    versions: int = 0
    store_commits: int = 0
    seconds: float = 0.0
    behind_ticks: int = 0
    """Versions the writers could not start on time (the cadence did not hold)."""
    maintainer_cpu: float = 0.0
    cycles: int = 0
    samples: list[Sample] = field(default_factory=list)
    landings: list[int] = field(default_factory=list)
    """The chain each snapshot ended (`bench.fleet.landing`, from the maintainer's catalog)."""

    @property
    def commit_rate(self) -> float:
        return self.store_commits / self.seconds if self.seconds else 0.0

    @property
    def cpu_per_commit(self) -> float:
        return self.maintainer_cpu / self.store_commits if self.store_commits else math.nan


# -- one run ------------------------------------------------------------------------------------------


def run_fleet(p: FleetParams, base: str) -> FleetResult:
    roots = [Path(base, f"ckpt{r:03d}") for r in range(p.roots)]
    for root_dir in roots:
        root_dir.mkdir()
    uris = [root_dir.as_uri() for root_dir in roots]
    with FleetWriters(uris, p.stores, p.writers, p.keys, p.updates, base) as writers:
        return _run_beside(p, base, uris, writers)


def _await_ready(ready: Path, maintainer: subprocess.Popen[bytes], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if maintainer.poll() is not None:
            raise RuntimeError(f"the maintainer exited ({maintainer.returncode}) before it was ready")
        if time.monotonic() > deadline:
            maintainer.kill()
            raise RuntimeError(f"the maintainer was not ready within {timeout:.0f} s")
        time.sleep(0.05)


def _run_beside(p: FleetParams, base: str, uris: list[str], writers: FleetWriters) -> FleetResult:
    """Commit every store every `interval` seconds for `seconds` beside the maintainer, sampling the roots."""
    result = FleetResult(p)
    stop, out = Path(base, "stop"), Path(base, "maintainer.json")
    writers.commit_next()  # the bulk load of every store, before the clock starts
    maintainer = subprocess.Popen(
        [sys.executable, "-m", "bench.fleet", "beside", "--maintainer", json.dumps(asdict(p)), ",".join(uris), base],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
    )
    _await_ready(Path(base, "ready"), maintainer)  # the clock runs while the maintainer can act, not while it imports
    samples: list[Sample] = []
    done = threading.Event()
    t_start = time.monotonic()

    def sampler() -> None:
        while not done.wait(p.sample_every):
            try:
                samples.append(sample(uris, p, time.monotonic() - t_start))
            except Exception as e:  # a file deleted under the listing: the next sample will do
                log.info("sample skipped: %s", e)

    thread = threading.Thread(target=sampler, name="fleet-sampler", daemon=True)
    thread.start()
    next_tick = time.monotonic()
    try:
        while time.monotonic() - t_start < p.seconds:
            writers.commit_next()
            result.store_commits += p.stores
            next_tick += p.interval
            delay = next_tick - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                result.behind_ticks += 1
                next_tick = time.monotonic()
        result.seconds = time.monotonic() - t_start
    finally:
        done.set()
        stop.touch()
        maintainer.wait(timeout=600)
        thread.join(timeout=120)
    stats = json.loads(out.read_text())
    result.maintainer_cpu = stats["cpu_seconds"]
    result.cycles = stats["cycles"]
    result.versions = writers.version
    result.samples = samples
    result.landings = chains_at_snapshots(base)
    return result


# -- reporting ----------------------------------------------------------------------------------------


def _max(values: list[float]) -> float:
    return max(values, default=math.nan)


def cost_model(runs: list[FleetResult]) -> tuple[float, float] | None:
    """Least squares of maintainer CPU = a x cycles + b x store-commits over runs of different sizes:
    (a: CPU s per cycle, whatever the number of stores; b: CPU s per store-commit). None with < 2 sizes."""
    if len({r.params.stores for r in runs}) < 2:
        return None
    sxx = sum(r.cycles * r.cycles for r in runs)
    sxy = sum(r.cycles * r.store_commits for r in runs)
    syy = sum(r.store_commits * r.store_commits for r in runs)
    sxc = sum(r.cycles * r.maintainer_cpu for r in runs)
    syc = sum(r.store_commits * r.maintainer_cpu for r in runs)
    det = sxx * syy - sxy * sxy
    if det == 0:
        return None
    return (sxc * syy - syc * sxy) / det, (syc * sxx - sxc * sxy) / det


def tables(results: list[FleetResult], floor: float | None = None) -> list[Table]:
    """The run's tables; `floor`: the raw RocksDB work per store-commit (`bench.fleet.floor`), same run."""
    p0 = results[0].params if results else FleetParams()
    model = Table(
        "Fleet: the maintainer's cost model, and 1,000 store-commits per second",
        [
            "maintainer",
            "CPU s per cycle (fixed)",
            "CPU ms per store-commit (marginal)",
            "cycle (s)",
            "cores for 1,000 store-commits/s",
            "fits 2 cores",
            "marginal / rocksdict floor",
        ],
        [],
        notes=[
            "Fitted over the runs of different sizes in the table above: CPU = a x cycles + b x store-commits. "
            "At 1,000 store-commits/s with one cycle every `cycle` seconds the maintainer needs "
            "a / cycle + 1,000 x b cores; cycle = the run's seconds over its cycles (sensor ticks for "
            "`dagster` and `daemon`).",
            "An extrapolation from these runs' shape (threshold 10, the catalog, the writers on the same 2 "
            "cores, 128 stores at most). Whether one process keeps up with 1,000 store-commits a second is "
            "measured directly, the versions arriving at that rate, by `python -m bench sustain` (thresholds 30 "
            "and 20, the catalog, the writers elsewhere; sustain below).",
        ],
    )
    for label in sorted({r.params.label for r in results}):
        runs = [r for r in results if r.params.label == label]
        fit = cost_model(runs)
        if fit is None:
            continue
        a, b = fit
        cycle = sum(r.seconds for r in runs) / sum(r.cycles for r in runs)  # as measured: the daemon's >= 5 s
        cores = a / cycle + 1000 * b
        model.rows.append(
            [
                label,
                round(a, 3),
                round(b * 1000, 3),
                round(cycle, 1),
                round(cores, 2),
                "yes" if cores <= 2 else "no",
                round(b / floor, 2) if floor else "",
            ]
        )
    if floor:
        model.notes.append(
            f"rocksdict floor = {floor * 1000:.3f} ms of CPU per store-commit, measured in this run before the "
            "fleets (`bench.fleet.floor`): the RocksDB work maintenance cannot avoid, on raw rocksdict with the "
            "replicas' options (each commit's updates written as one batch; every threshold commits a flush, a "
            "checkpoint, the SHA-256 and a copy of each new SST), no statekeeper code. It moves with the "
            "machine's speed as the maintainers do: compare runs by this ratio."
        )
    summary = Table(
        "Fleet: one maintainer beside S stores committing 1/s",
        [
            "maintainer",
            "stores",
            "store-commits/s",
            "cadence held",
            "maintainer CPU s / store-commit",
            "cores for 1,000 store-commits/s",
            "chain p50 / p99 / max",
            "snapshot lag max (s)",
            "checkpoint / live state (max)",
            "checkpoint / target (max)",
            "samples over target",
            "files in root (max)",
            "chain at each snapshot p50 / p90 / max",
        ],
        [],
        notes=[
            f"Each store: {p0.keys:,} keys ({KEY_BYTES} B keys, {VALUE_BYTES} B values), {p0.updates:,} random "
            f"updates per commit every {p0.interval:g} s, {p0.seconds:g} s per run, {p0.writers} writer "
            f"processes; threshold {p0.threshold}, retain {p0.retain}, load grace {p0.load_grace:g} s, orphan "
            f"grace {p0.orphan_grace:g} s; `cli`: the three commands every {p0.cycle:g} s; `dagster`: the "
            f"sensor every {p0.cycle:g} s and the runs it requests in process (snapshots with their chain checks, "
            "expiry when a commit moved a base, both in one run when a tick finds both; no loadability check); "
            "`daemon`: Dagster as deployed, "
            "`dagster-daemon run -w workspace.yaml` with orchestration/dagster.yaml (its code server, a process "
            "per run), the sensor's interval set to the same cycle (the daemon ticks a sensor every 5 s at "
            "most). The schedules (expiry, verification, orphan cleanup) on their default crons (hourly, hourly, "
            "daily: none fires within a run; the sensor's expiry runs keep the checkpoint bounded), or, where the "
            "row says so, every minute (the verification runs read every retained version of every store).",
            "A commit moves a store's base; what that made unneeded (the old base and the threshold's worth of "
            "changelogs after it, for every store at once: they commit in lock step) goes at the maintainer's "
            "next cycle or the sensor's next tick. Samples over target fall in that window.",
            "target = 1.2 x what the retained versions need (the snapshot each store's oldest retained version "
            "loads from and every newer one, with their SSTs, the changelogs after it, the commit records "
            "from the floor on), i.e. live state + retained changelogs + 20%; live state = the newest "
            "snapshot of every store; "
            f"chains and bytes are sampled every {p0.sample_every:g} s from the bench process; CPU is the maintainer "
            "process's and its children's (user + system).",
            "cores for 1,000 store-commits/s = CPU s per store-commit x 1,000 (the cost per store-commit "
            "falls as S grows: listings, process starts and catalog round trips are per cycle, not per store); "
            "`daemon` CPU is every process the daemon started (the bench process is their subreaper).",
            "chain at each snapshot: for every snapshot the maintainer wrote, the newest version its store had "
            "committed when the snapshot's manifest was written, less the store's previous snapshot, from the "
            "maintainer's catalog after the run (`bench.fleet.landing`); a chain peaks there, between the samples; "
            "(n of N over) counts those over 2 x threshold, the bound the `chains_within_twice_threshold` check "
            "holds.",
            "`N roots`: the same stores as N streaming queries of S / N partitions, each in its own checkpoint root "
            "with its own commit records, one maintainer given every root (`statekeeper maintain` cycles through "
            "them; Dagster's sensor requests one fleet run for the roots a tick found work in, one at a time); "
            "chains, files and bytes are over every root.",
            "![fleet over time](fleet.png)",
        ],
    )
    over_time = Table(
        "Fleet over time (the largest S of each maintainer)",
        ["maintainer", "stores", "t (s)", "version", "chain p50", "chain p99", "chain max", "files", "MB", "target MB"],
        [],
    )
    for label in sorted({r.params.label for r in results}):
        runs = [r for r in results if r.params.label == label]
        for r in runs:
            s = r.samples
            ratio = [x.bytes / x.live_bytes for x in s if x.live_bytes]
            target = [x.bytes / x.bound_bytes for x in s if x.bound_bytes]
            summary.rows.append(
                [
                    label,
                    r.params.stores,
                    round(r.commit_rate, 1),
                    "yes" if r.behind_ticks <= max(1, r.versions // 20) else f"no ({r.behind_ticks} late)",
                    r.cpu_per_commit,
                    round(r.cpu_per_commit * 1000, 2),
                    f"{_max([x.chain_p50 for x in s]):.0f} / {_max([x.chain_p99 for x in s]):.0f} / "
                    f"{_max([x.chain_max for x in s]):.0f}",
                    _max([x.lag_max for x in s]),
                    round(_max(ratio), 2),
                    round(_max(target), 2),
                    f"{sum(t > 1 for t in target)} / {len(target)}",
                    int(_max([x.files for x in s])) if s else 0,
                    landing_summary(r.landings, r.params.threshold),
                ]
            )
        largest = max(runs, key=lambda r: r.params.stores)
        step = max(1, len(largest.samples) // 8)
        for x in largest.samples[::step]:
            over_time.rows.append(
                [
                    label,
                    largest.params.stores,
                    x.t,
                    x.version,
                    x.chain_p50,
                    x.chain_p99,
                    x.chain_max,
                    x.files,
                    round(x.bytes / 2**20, 1),
                    round(x.bound_bytes / 2**20, 1),
                ]
            )
    return [summary, model, over_time] if model.rows else [summary, over_time]


def plot(results: list[FleetResult], path: Path) -> Path | None:
    """Chain max and checkpoint/target over time per run, as a PNG (None without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: no plot (pip install -e '.[dev]')")
        return None
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for r in results:
        label = f"{r.params.label}, {r.params.stores} stores"
        t = [x.t for x in r.samples]
        ax1.plot(t, [x.chain_max for x in r.samples], label=label)
        ax2.plot(t, [x.bytes / x.bound_bytes if x.bound_bytes else math.nan for x in r.samples], label=label)
    threshold = results[0].params.threshold if results else 10
    ax1.axhline(2 * threshold, color="red", linestyle="--", label="2 x threshold")
    ax1.set_ylabel("longest chain (changelogs)")
    ax2.axhline(1.0, color="red", linestyle="--", label="target")
    ax2.set_ylabel("checkpoint bytes / target")
    ax2.set_xlabel("seconds")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def run(
    quick: bool = False,
    params: list[FleetParams] | None = None,
    plot_to: Path | None = None,
    fanout: FanoutParams | None = None,
) -> list[Table]:
    """The suite `python -m bench fleet` runs: every configuration of FULL (QUICK with `quick`), then the
    fan-out comparison (`bench.fleet.fanout`; with `params`, only when `fanout` is given)."""
    if params is None:
        fanout = FANOUT_QUICK if quick else FanoutParams()
    runs = params or (QUICK if quick else FULL)
    floor = rocksdict_floor(runs[0]) if runs else None  # alone on the machine, before the fleets
    results = []
    for p in runs:
        base = tempfile.mkdtemp(prefix="statekeeper-fleet-")
        try:
            log.info("fleet: %s", p)
            results.append(run_fleet(p, base))
        finally:
            shutil.rmtree(base, ignore_errors=True)
    if not quick or plot_to is not None:
        plot(results, plot_to or PLOT)
    out = tables(results, floor) if results else []
    if fanout is not None:
        out.append(fanout_table(fanout, run_fanout(fanout)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet beside", description=__doc__.split("\n\n")[0])
    parser.add_argument("--maintainer", help=argparse.SUPPRESS)
    parser.add_argument("--stores", type=int, nargs="+", default=[16])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--mode", choices=MODES, nargs="+", default=list(MODES))
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--updates", type=int, default=1_000)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--roots", type=int, default=1, help="checkpoint roots the stores are spread over")
    parser.add_argument("--threshold", type=int, default=FleetParams.threshold, help="snapshot threshold")
    parser.add_argument(
        "--schedule",
        type=float,
        default=0.0,
        help="seconds between the Dagster schedules' runs (daemon: any value > 0 means every minute); "
        "0: their default crons",
    )
    parser.add_argument("--plot", type=Path, help="write the plot here")
    parser.add_argument("--fanout", type=int, default=0, help="stores for the fan-out comparison (0: none)")
    parser.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.maintainer:
        p = FleetParams(**json.loads(args.maintainer))
        roots, base = args.args
        work = os.path.join(base, "maintainer")
        maintain(p, roots, work, Path(base, "stop"), Path(base, "maintainer.json"), Path(base, "ready"))
        return 0
    base = FleetParams()
    params = [
        replace(
            base,
            stores=s,
            mode=m,
            seconds=args.seconds,
            keys=args.keys,
            updates=args.updates,
            writers=args.writers,
            roots=args.roots,
            threshold=args.threshold,
            schedule=args.schedule,
        )
        for s in args.stores
        for m in args.mode
    ]
    fanout = FanoutParams(stores=args.fanout, keys=args.keys, updates=args.updates) if args.fanout else None
    plot_to = args.plot or Path(tempfile.gettempdir(), "fleet.png")
    for t in run(params=params, plot_to=plot_to, fanout=fanout):
        print(t.markdown())
    return 0
