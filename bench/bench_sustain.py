"""One maintenance process at 1,000 store-commits a second, measured with the versions arriving at that rate.

`bench.fleet_sustain` writes every version of 1,000 stores first (off the clock), then publishes them into the
root at 1,000 store-commits a second (each store once a second) while one ``statekeeper maintain`` loop keeps it:
the maintainer has the machine to itself, as beside writers on other hosts. Rows: a cycle every 5 seconds with the
builds in 2 build processes and on the loop's threads, and every 10 seconds (``maintain``'s default).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

from bench.report import Table

CONFIGS = [("2 build processes", 5.0, 2), ("threads", 5.0, 0), ("2 build processes", 10.0, 2)]
THRESHOLD = 20

QUICK = ["--keys", "500", "--updates", "50", "--sample-every", "2"]
"""--quick: a smoke run (8 tiny stores)."""


def _sustain(args: list[str], versions_dir: str) -> dict[str, float]:
    cmd = [sys.executable, "-m", "bench.fleet_sustain", *args, "--versions-dir", versions_dir]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    figures: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    if figures["errors"]:
        raise RuntimeError(f"{' '.join(cmd)}: {figures['errors']} maintenance error(s)")
    return figures


def run(quick: bool) -> list[Table]:
    stores, rate, seconds, threshold = (8, 16, 6, 4) if quick else (1000, 1000, 50, THRESHOLD)
    rows = []
    with tempfile.TemporaryDirectory(prefix="statekeeper-sustain-") as versions_dir:  # written once, read by each
        for name, every_s, processes in CONFIGS:
            every = every_s / 5 if quick else every_s
            args = ["--stores", str(stores), "--rate", str(rate), "--seconds", str(seconds)]
            args += ["--threshold", str(threshold), "--every", str(every)]
            args += ["--build-processes", str(processes), *(QUICK if quick else [])]
            f = _sustain(args, versions_dir)
            rows.append(
                [
                    name,
                    every,
                    round(f["store_commits_per_second"]),
                    f["cpu_ms_per_store_commit"],
                    f["of_which_build_processes_ms"],
                    f["cores_used"],
                    int(f["rounds"]),
                    f"{f['longest_chain']} ({f['chain_max_sampled']})",
                    f["bytes_over_bound_max"],
                    f["files_max"],
                    "yes" if f["kept_up"] else "no",
                ]
            )
    return [
        Table(
            f"Fleet: one maintenance process at {rate:,} store-commits/s ({stores:,} stores, each once a second)",
            [
                "snapshot builds",
                "cycle every (s)",
                "store-commits/s",
                "CPU ms / store-commit",
                "of which build processes",
                "cores used",
                "rounds",
                f"longest chain (sampled), bound {2 * threshold}",
                "checkpoint bytes / bound",
                "files in the root",
                "kept up",
            ],
            rows,
            [
                f"`python -m bench.fleet_sustain --stores {stores} --rate {rate} --seconds {seconds} --threshold "
                f"{threshold} --every E [--build-processes 2]`, each in a fresh process, one run each. Each store: "
                "10,000 keys, 1,000 updates a commit, the commit record per version as the driver writes it; retain "
                f"{max(20, threshold)}; local root, no catalog.",
                "The versions are written first, off the clock; then they are published into the root (a hard link "
                "per file, in the maintainer's process and counted) at the rate asked, after a warm-up in which "
                "every store's first snapshot (a cold build) is written. Measured: from the end of that round to "
                "the end of the last round every store finished before the versions ran out (whole periods of the "
                "lock-step rounds; rounds: how many).",
                "CPU = the loop's process and its build processes, every thread; cores used = that CPU over the "
                "window. Longest chain: a version published minus the newest snapshot its store had (from the "
                "snapshot reports, an upper bound); sampled: the longest chain in the root as a cycle left it, "
                "every 10 s. Bound: 1.2 x what the retained versions need (`bench.fleet_sampling`), sampled as a "
                "cycle left the root (until the next cycle, the root also holds what that cycle will expire).",
                "Kept up: every chain within 2x the snapshot threshold and the checkpoint within its bound.",
            ],
        )
    ]
