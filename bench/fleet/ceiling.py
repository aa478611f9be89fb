"""What rate does one maintainer keep up with at most, its writers in lock step, on threads or build processes?

One maintenance process's ceiling: the store-commits a second it keeps up with, on threads or build processes.

`bench.fleet lockstep` drives 128 stores in lock step with one `statekeeper maintain` loop (the writers wait
while a cycle runs): its CPU per store-commit (the loop's process and its build processes, every thread) and
the cores it keeps busy over the cycles' wall time give the most store-commits a second it sustains. Each
configuration runs in a fresh process; the raw RocksDB floor (`bench.fleet.floor`) is measured in the same run.
Rows: builds on the loop's threads (``--parallelism 4``, the default) or in 4 build processes
(``--build-processes 4``), at snapshot threshold 10 and 20.
"""

from __future__ import annotations

from statistics import median

from bench.fleet.floor import rocksdict_floor
from bench.fleet.maintainers import FleetParams
from bench.report import Table, run_figures

CONFIGS = [("threads", 10, 0), ("4 build processes", 10, 4), ("threads", 20, 0), ("4 build processes", 20, 4)]


QUICK = ["--warmup", "2", "--per-cycle", "5", "--keys", "500", "--updates", "50"]
"""--quick: a smoke run (tiny stores, two warm-up cycles, a snapshot of every store in the measured ones)."""


def _profile(stores: int, cycles: int, threshold: int, build_processes: int, quick: bool) -> dict[str, float]:
    args = ["lockstep", "--stores", str(stores), "--cycles", str(cycles), "--threshold", str(threshold)]
    return run_figures("bench.fleet", [*args, "--build-processes", str(build_processes), *(QUICK if quick else [])])


def run(quick: bool) -> list[Table]:
    stores, cycles = (4, 4) if quick else (128, 20)
    repeats = 1 if quick else 3
    floors = {
        t: median(rocksdict_floor(FleetParams(threshold=t), commits=40 if quick else 300) for _ in range(repeats))
        for t in (10, 20)
    }
    runs: dict[int, list[dict[str, float]]] = {i: [] for i in range(len(CONFIGS))}
    for _ in range(repeats):  # round robin: a slow spell of the machine touches every configuration alike
        for i, (_, threshold, processes) in enumerate(CONFIGS):
            runs[i].append(_profile(stores, cycles, threshold, processes, quick))
    rows = []
    for i, (name, threshold, _) in enumerate(CONFIGS):

        def mid(key: str, i: int = i) -> float:
            return median(f[key] for f in runs[i])

        rates = sorted(round(f["store_commits_per_second_max"]) for f in runs[i])
        floor_ms = 1000 * floors[threshold]
        rows.append(
            [
                name,
                threshold,
                mid("cpu_ms_per_store_commit"),
                mid("of_which_build_processes_ms"),
                mid("cores_used"),
                round(mid("store_commits_per_second_max")),
                f"{rates[0]:,}-{rates[-1]:,}",
                floor_ms,
                mid("cpu_ms_per_store_commit") / floor_ms,
            ]
        )
    return [
        Table(
            f"Fleet: one maintenance process's ceiling ({stores} stores in lock step with `maintain`)",
            [
                "snapshot builds",
                "threshold",
                "CPU ms / store-commit",
                "of which build processes",
                "cores used",
                "store-commits/s at most",
                "range",
                "rocksdict floor (ms)",
                "CPU / floor",
            ],
            rows,
            [
                f"`python -m bench.fleet lockstep --stores {stores} --cycles {cycles} --threshold T "
                "[--build-processes 4]`, each in a fresh process: the writers (child processes, not counted) commit "
                "2 batches of every store, then one maintain cycle (expire, snapshot, clean orphans) runs; 10 warm-up "
                "cycles. Each store: 10,000 keys, 1,000 updates a commit; retain max(20, threshold); local root, no "
                "catalog.",
                f"Median of {repeats} runs of each configuration, taken in turn (range: of store-commits/s); this "
                "machine's speed varies by 10-30% from one run to the next.",
                "CPU = the loop's process and its build processes, every thread; cores used = that CPU over the "
                "measured cycles' wall time; store-commits/s at most = store-commits over that wall time (the "
                "writers wait while a cycle runs, so this is what the maintainer alone sustains).",
                "rocksdict floor: the RocksDB work per store-commit no maintainer can avoid (`bench.fleet.floor`, "
                "same threshold), in this run. 1,000 store-commits/s on 2 cores needs CPU under 2 ms a store-commit "
                "and both cores busy.",
            ],
        )
    ]
