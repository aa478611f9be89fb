"""Which rate one maintenance process keeps up with, measured with the versions arriving at that rate.

`bench.fleet_sustain` writes every version of a fleet first (off the clock), then publishes them into the root at
the rate asked while one ``statekeeper maintain`` loop keeps it: the maintainer has the machine to itself, as
beside writers on other hosts. Rows: 128 stores at 1,000 store-commits a second with snapshot thresholds 40 and 20,
each with `snapshot_spread` 0.5 and without, and at 800 a second (threshold 20, spread 0.5); a cycle every second,
2 build processes.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.report import Table, run_figures

CONFIGS = [  # stores, store-commits a second, seconds measured, cycle every (s), snapshot_spread, threshold
    (128, 1000, 20, 1.0, 0.5, 40),
    (128, 1000, 20, 1.0, 0.0, 40),
    (128, 1000, 20, 1.0, 0.5, 20),
    (128, 1000, 20, 1.0, 0.0, 20),
    (128, 800, 20, 1.0, 0.5, 20),
]
"""Per fleet, the row needing the most versions first: its versions are written once, for it, and read by the
others."""

QUICK = [(8, 16, 6, 0.5, 0.5, 4), (8, 16, 6, 0.5, 0.0, 4)]
QUICK_ARGS = ["--keys", "500", "--updates", "50", "--sample-every", "2"]


def run(quick: bool) -> list[Table]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="statekeeper-sustain-") as scratch:
        for stores, rate, seconds, every, spread, threshold in QUICK if quick else CONFIGS:
            args = ["--stores", str(stores), "--rate", str(rate), "--seconds", str(seconds), "--every", str(every)]
            args += ["--snapshot-spread", str(spread), "--build-processes", "2", "--threshold", str(threshold)]
            args += ["--versions-dir", str(Path(scratch, str(stores)))]
            f = run_figures("bench.fleet_sustain", [*args, *(QUICK_ARGS if quick else [])])
            rows.append(
                [
                    stores,
                    rate,
                    every,
                    spread,
                    threshold,
                    round(f["store_commits_per_second"]),
                    f["cpu_ms_per_store_commit"],
                    f["of_which_build_processes_ms"],
                    f["cores_used"],
                    int(f["rounds"]),
                    int(f["longest_chain"]),
                    int(f["chain_max_sampled"]),
                    f["bytes_over_bound_max"],
                    int(f["files_max"]),
                    "yes" if f["kept_up"] else "no",
                ]
            )
    return [
        Table(
            "Fleet: the rate one maintenance process keeps up with (2 build processes)",
            [
                "stores",
                "store-commits/s asked",
                "cycle every (s)",
                "snapshot_spread",
                "snapshot threshold",
                "store-commits/s in the window",
                "CPU ms / store-commit",
                "of which build processes",
                "cores used",
                "periods",
                "longest chain",
                "longest chain sampled",
                "checkpoint bytes / bound",
                "files in the root",
                "kept up",
            ],
            rows,
            [
                "`python -m bench.fleet_sustain --stores S --rate R --seconds N --every E --snapshot-spread F "
                "--build-processes 2 --threshold T`, each in a fresh process, one run each. Each store: 10,000 keys, "
                "1,000 updates a commit, the commit record per version as the driver writes it; retain max(20, T); "
                "local root, no catalog.",
                "The versions are written first, off the clock, then published into the root (a hard link per file, "
                "in the maintainer's process and counted) at the rate asked, after a warm-up in which every store's "
                "first snapshot (a cold build) is written. Measured: whole periods (every store snapshotted once "
                "more), from the start of the cycle of the first round after the warm-up to the start of the cycle "
                "of the last round that ended before the versions ran out; store-commits/s in the window: what "
                "the cycles of the window were given. Periods 0: no round ended twice after the warm-up (it fell "
                "behind); the window is then all of it after the warm-up.",
                "CPU = the loop's process and its build processes, every thread; cores used = that CPU over the "
                "window. Longest chain: the versions published by the end of a cycle less the newest snapshot a "
                "store had when the cycle started (the wait of the last store its round built); sampled: the "
                "longest chain in the root as a cycle left it, every 10 s. Bound: 1.2 x what the retained versions "
                "need (`bench.fleet_sampling`), sampled as a cycle left the root.",
                "Kept up: every chain within 2x the snapshot threshold and the checkpoint within its bound. A "
                "maintainer that falls behind runs longer rounds, which leave longer chains: the "
                "chains grow without bound.",
            ],
        )
    ]
