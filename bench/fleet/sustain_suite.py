"""What rate does one maintainer keep up with, the versions published at that rate?

Which rate one maintenance process keeps up with, measured with the versions arriving at that rate.

`bench.fleet.sustain` writes every version of a fleet first (off the clock), then publishes them into the root at
the rate asked, all along, while one ``statekeeper maintain`` loop keeps it: the maintainer has the machine to
itself, as beside writers on other hosts. Rows: 128 stores at 1,000 store-commits a second with snapshot thresholds
40 and 20, each with `snapshot_spread` 0.5, without, and on the phase schedule, and at 800 a second (threshold 20,
spread 0.5); a cycle every second, 2 build processes. Then 1,000 stores committing once a second (thresholds 30
and 20, each on the phase schedule and with spread 0.5; a cycle every 5 s, `snapshot_round_seconds` 4; at 30 on the
phase schedule also kept by Dagster's checkpoint sensor and its runs, in one process and as the daemon deploys
them) with the root in memory (``/dev/shm``, where it has room): their changelogs alone are ~85 MB a second to
read, more than this kind of machine's disk serves, and the figure asked for is the maintainer's. With the spread
such a fleet is at the edge of 2 cores, its rounds lumping after the fleet's first; the phase schedule at 30 is
the setting that keeps it (docs/maintenance.md).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import NamedTuple

from bench.fleet.sustain import versions_needed
from bench.report import Table, run_figures

MEMORY = Path("/dev/shm")
"""A tmpfs on Linux: the root of the rows marked "memory" lives there."""


class Shape(NamedTuple):
    """One row: the fleet, the rate and the loop's cadence."""

    stores: int
    rate: int
    seconds: int
    every: float
    spread: float
    threshold: int
    memory: bool = False
    """The root on the tmpfs `MEMORY`, not on disk."""
    round_seconds: float | None = None
    """`snapshot_round_seconds` (None: rounds unbounded)."""
    catalog: bool = True
    """With the SQLite catalog (on disk), as `statekeeper maintain` runs by default."""
    maintainer: str = "maintain"
    """`bench.fleet sustain --maintainer`: the loop, or the code location's checkpoint sensor and its runs."""
    schedule: str = "threshold"
    """`snapshot_schedule`: due at the threshold (less the spread), or at each store's phase."""


CONFIGS = [
    Shape(128, 1000, 20, 1.0, 0.5, 40),
    Shape(128, 1000, 20, 1.0, 0.0, 40),
    Shape(128, 1000, 20, 1.0, 0.5, 20),
    Shape(128, 1000, 20, 1.0, 0.0, 20),
    Shape(128, 800, 20, 1.0, 0.5, 20),
    Shape(128, 1000, 20, 1.0, 0.0, 40, schedule="phase"),
    Shape(128, 1000, 20, 1.0, 0.0, 20, schedule="phase"),
    Shape(1000, 1000, 60, 5.0, 0.0, 30, memory=True, round_seconds=4.0, schedule="phase"),
    Shape(1000, 1000, 60, 5.0, 0.5, 30, memory=True, round_seconds=4.0),
    Shape(1000, 1000, 60, 5.0, 0.0, 30, memory=True, round_seconds=4.0, maintainer="dagster", schedule="phase"),
    Shape(1000, 1000, 60, 5.0, 0.0, 30, memory=True, round_seconds=4.0, maintainer="daemon", schedule="phase"),
    Shape(1000, 1000, 60, 5.0, 0.0, 20, memory=True, round_seconds=4.0, schedule="phase"),
    Shape(1000, 1000, 60, 5.0, 0.5, 20, memory=True, round_seconds=4.0),
]
"""Per fleet and storage, the row needing the most versions first: its versions are written once, for it, and read
by the others."""

QUICK = [
    Shape(8, 16, 6, 0.5, 0.5, 4),
    Shape(8, 16, 6, 0.5, 0.0, 4, catalog=False),
    Shape(8, 16, 6, 0.5, 0.5, 4, maintainer="dagster"),
    Shape(8, 16, 6, 0.5, 0.0, 4, memory=True, round_seconds=0.2, schedule="phase"),
]
QUICK_UPDATES = 50
QUICK_ARGS = ["--keys", "500", "--updates", str(QUICK_UPDATES), "--sample-every", "2"]
BYTES_PER_UPDATE = 90
"""What a store-commit's changelog takes per update (16 B keys, 64 B values, framing): for the room a row needs."""


def memory_room(stores: int, versions: int, updates: int) -> bool:
    """Whether `MEMORY` holds a row's versions, snapshots and replicas (about 1.5x the versions)."""
    if not MEMORY.is_dir():
        return False
    return shutil.disk_usage(MEMORY).free > 1.5 * stores * versions * updates * BYTES_PER_UPDATE


def run(quick: bool) -> list[Table]:
    rows = []
    skipped = []
    with contextlib.ExitStack() as stack:
        scratch = {False: stack.enter_context(tempfile.TemporaryDirectory(prefix="statekeeper-sustain-"))}
        for stores, rate, seconds, every, spread, threshold, memory, round_seconds, catalog, maintainer, schedule in (
            QUICK if quick else CONFIGS
        ):
            if memory and memory not in scratch:
                versions = versions_needed(threshold, rate / stores, seconds)
                if not memory_room(stores, versions, QUICK_UPDATES if quick else 1000):
                    skipped.append(f"{stores} stores in memory: {MEMORY} is missing or has too little room")
                    continue
                scratch[memory] = stack.enter_context(
                    tempfile.TemporaryDirectory(prefix="statekeeper-sustain-", dir=MEMORY)
                )
            args = ["--stores", str(stores), "--rate", str(rate), "--seconds", str(seconds), "--every", str(every)]
            args += ["--snapshot-spread", str(spread), "--snapshot-schedule", schedule]
            args += ["--build-processes", "2", "--threshold", str(threshold)]
            args += [] if round_seconds is None else ["--round-seconds", str(round_seconds)]
            args += ["--maintainer", maintainer] + (["--catalog"] if catalog else [])
            args += ["--versions-dir", str(Path(scratch[memory], str(stores))), "--scratch", scratch[memory]]
            f = run_figures("bench.fleet", ["sustain", *args, *(QUICK_ARGS if quick else [])])
            rows.append(
                [
                    stores,
                    maintainer,
                    "memory" if memory else "disk",
                    "yes" if catalog else "no",
                    rate,
                    every,
                    "" if round_seconds is None else round_seconds,
                    spread,
                    schedule,
                    threshold,
                    round(f["store_commits_per_second"]),
                    f["cpu_ms_per_store_commit"],
                    "" if maintainer == "daemon" else f["of_which_build_processes_ms"],
                    f["cores_used"],
                    int(f["rounds"]),
                    int(f["longest_chain"]),
                    int(f["longest_chain_at_cycle_end"]),
                    int(f["chain_max_sampled"]),
                    f["bytes_over_bound_max"],
                    f["bytes_over_bound_first_base_move"],
                    int(f["files_max"]),
                    "yes" if f["kept_up"] else "no",
                ]
            )
    return [
        Table(
            "Fleet: the rate one maintenance process keeps up with (2 build processes)",
            [
                "stores",
                "maintainer",
                "root",
                "catalog",
                "store-commits/s asked",
                "cycle every (s)",
                "round (s)",
                "snapshot_spread",
                "snapshot_schedule",
                "snapshot threshold",
                "store-commits/s in the window",
                "CPU ms / store-commit",
                "of which build processes",
                "cores used",
                "periods",
                "longest chain",
                "if landed at cycle end",
                "longest chain sampled",
                "checkpoint bytes / bound",
                "at the first base move",
                "files in the root",
                "kept up",
            ],
            rows,
            [
                "`python -m bench.fleet sustain --stores S --rate R --seconds N --every E [--round-seconds R] "
                "--snapshot-spread F --snapshot-schedule threshold|phase --build-processes 2 --threshold T "
                "[--catalog]`, each in a fresh process, one run each; schedule: `snapshot_schedule` (threshold: due "
                "at the threshold less the spread's draw; phase: at each store's own phase of the versions); "
                "round: `snapshot_round_seconds` (a round starts builds of stores still under the threshold, due "
                "early by the spread, for that long; later ones wait for the next cycle). Each store: 10,000 keys, "
                "1,000 updates a commit, the commit record per version as the driver writes it; retain max(20, T); "
                "local root; catalog: the SQLite catalog, in the temp dir on disk, as `statekeeper maintain` keeps "
                "one by default (`--catalog`); root disk: in the temp dir; memory: on the tmpfs /dev/shm (`--scratch "
                "/dev/shm`: the root, the versions and the replicas), where there is room.",
                "Maintainer: `maintain`, one `statekeeper maintain` loop, a cycle every E s; `dagster`: "
                "the code location's checkpoint sensor ticked every E s (start to start) and the runs it requests "
                "(snapshots of the stores whose chains reached their points, with the expiry when a commit moved a "
                "base, in one run), executed in the maintainer's process as the daemon would launch them but without "
                "a process per run, so the build processes and their replicas stay; the schedules on their "
                "default crons (none fires within a run); `daemon`: `dagster-daemon run` as deployed (`make run`'s "
                "instance settings: its code server, a process per run started by the default run launcher, one run "
                "of a root at a time), the sensor every E s, its CPU every process it started (its build processes are "
                "its runs' own: not shown apart); its instance and the catalog on disk as with `--catalog`; it works "
                "on while a sample is taken off the clock, which the others do not.",
                *(f"Not run: {why}." for why in skipped),
                "The versions are written first, off the clock, then published into the root at the rate asked, "
                "all along while the loop runs (a hard link per file, the commit record last, by a process of its "
                "own, as writers on other hosts: not the maintainer's CPU), after a warm-up in which every store's "
                "first snapshot (a cold build) is written. Measured: whole periods (every store snapshotted once "
                "more), from the start of the cycle of the first round after the warm-up to the start of the cycle "
                "of the last round that ended before the versions ran out; store-commits/s in the window: what "
                "the cycles of the window were given. Periods 0: no round ended twice after the warm-up (it fell "
                "behind); the window is then all of it after the warm-up.",
                "CPU = the loop's process and its build processes, every thread; cores used = that CPU over the "
                "window. Longest chain: the versions of a store due (at the rate asked) when its new snapshot "
                "landed less its snapshot before, the longest a load could replay with the writers committing all "
                "along; and every store's chain at the end of each cycle. A cycle builds the longest chains "
                "first. If landed at cycle end: as if each snapshot landed at the end of its cycle (the versions "
                "published by then less the newest snapshot a store had when the cycle started); sampled: the "
                "longest chain in the root as a cycle left it, every 10 s. Bound: 1.2 x what the retained versions "
                "need (`bench.fleet.sampling`), sampled as a cycle left the root (what the commits during the cycle "
                "made unneeded is still there: the peak), from the cycle that expired every store's bulk load on; "
                "at the first base move: the samples before it. On the threshold schedule the fleet's stores took "
                "their first snapshots within one warm-up, so their bases move off the bulk load (10x a changelog) "
                "within a cycle or two of each other, the one burst of a fleet started at once; on the phase "
                "schedule the first snapshots, and so the base moves, are spread over the warm-up.",
                "Kept up: every chain within 2x the snapshot threshold and the checkpoint within its bound from "
                "the first base move on. A "
                "maintainer that falls behind runs longer rounds, which leave longer chains: the "
                "chains grow without bound.",
            ],
        )
    ]
