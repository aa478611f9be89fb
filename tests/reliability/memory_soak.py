"""Long soaks of one part at a time, each in its own process: does its memory level off? (issue 63, point 5)

`python -m tests.reliability.memory_soak --minutes 60 --out DIR` runs two soaks at the same time, each over a
fleet of roots (`ROOTS` roots of `PARTITIONS` stores) that a writer process commits to on S3 (moto in a child
process; `--local`: local roots):

* ``maintain``: the writer process and a `statekeeper maintain` loop (`maintenance.loop.maintain`) process;
  both are sampled, so this soak gives the writer's series (``writer``) and the loop's (``maintain``);
* ``dagster``: the writer process and a process running the code location's checkpoint sensor on a short
  interval and executing the runs it requests in process (as `bench.fleet.dagster_runs.DagsterMaintainer` does,
  with a SQLite instance, not an in-memory one): what a process keeps across runs is kept.

Each measured process samples, every `SAMPLE_SECONDS`, its RSS, the RSS of its children (build processes), the
Python heap (`tracemalloc`'s traced bytes with ``--trace``, else `sys.getallocatedblocks`) and the shared RocksDB
block cache's usage, and with ``--trace`` compares tracemalloc snapshots (a third of the way in and at the end:
the allocation sites that grew). So RSS growth splits into Python objects (the heap grows with it) and native
(it does not). Writes ``DIR/<part>.json`` per process and ``DIR/memory_soak.png``. `make soak-hour` runs it for
an hour; docs/reliability.md shows what was measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import psutil

log = logging.getLogger("memory_soak")

ROOTS = 3
PARTITIONS = 4
WRITE_HZ = 1.0  # versions a second per root, at most
EVERY = 2.0  # seconds between maintenance cycles / sensor ticks
SAMPLE_SECONDS = 5.0
SOAKS = {"maintain": ("writer", "maintain"), "dagster": ("writer", "dagster")}
"""Soak -> the processes it runs (each sampled; the writer's series is kept from the ``maintain`` soak)."""


def _settings(work: Path) -> Any:
    from statekeeper.maintenance.settings import MaintenanceSettings

    return MaintenanceSettings(
        snapshot_threshold=4,
        min_versions_to_retain=6,
        orphan_grace_seconds=4.0,
        load_grace_seconds=1.0,
        parallelism=2,
        lease_ttl_seconds=30.0,
        work_dir=str(work / "maintenance"),
        catalog_history_seconds=30.0,
    )


# -- the measured processes ----------------------------------------------------------------------------


class Sampler:
    """This process's memory every `SAMPLE_SECONDS` on a thread, and tracemalloc snapshots with ``trace``."""

    def __init__(self, part: str, trace: bool) -> None:
        self.part, self.trace = part, trace
        self.samples: list[dict[str, float]] = []
        self.stop = threading.Event()
        self._snapshots: list[tracemalloc.Snapshot] = []
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._t0 = time.monotonic()

    def start(self, seconds: float) -> None:
        self._seconds = seconds
        self._thread.start()

    def _run(self) -> None:
        from statekeeper.store.rocks import shared_memory

        proc, cache = psutil.Process(), shared_memory().cache
        while not self.stop.wait(SAMPLE_SECONDS):
            at = time.monotonic() - self._t0
            children = 0
            for c in proc.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    children += c.memory_info().rss
            heap = tracemalloc.get_traced_memory()[0] if self.trace else sys.getallocatedblocks() * 64
            self.samples.append(
                {
                    "at": round(at, 1),
                    "rss": proc.memory_info().rss,
                    "children": children,
                    "heap": heap,
                    "cache": cache.get_usage(),
                }
            )
            if self.trace and not self._snapshots and at >= self._seconds / 3:
                self._snapshots.append(tracemalloc.take_snapshot())

    def result(self) -> dict[str, Any]:
        self.stop.set()
        self._thread.join()
        grew: list[str] = []
        if self.trace and self._snapshots:
            diff = tracemalloc.take_snapshot().compare_to(self._snapshots[0], "traceback")
            for stat in diff[:15]:
                grew.append(
                    f"{stat.size_diff / 1024:+.0f} KiB {stat.count_diff:+d} blocks: "
                    + " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in stat.traceback)
                )
        return {
            "part": self.part,
            "samples": self.samples,
            "grew": grew,
            "heap": "tracemalloc" if self.trace else "allocated blocks x 64",
        }


def _writer(roots: list[str], work: Path, stop: threading.Event) -> dict[str, int]:
    from tests.reliability.scenarios import BatchWriter

    writers = [BatchWriter(r, str(work / f"writer-{i}"), partitions=PARTITIONS) for i, r in enumerate(roots)]
    commits = version = 0
    try:
        while not stop.is_set():
            t0 = time.monotonic()
            for w in writers:
                version = w.commit(1, losing=commits % 5 == 0)
            commits += 1
            stop.wait(max(0.0, 1 / WRITE_HZ - (time.monotonic() - t0)))
        return {"versions": version}
    finally:
        for w in writers:
            w.close()


def _maintain(roots: list[str], work: Path, stop: threading.Event) -> dict[str, int]:
    from statekeeper.maintenance.loop import CycleResult, maintain
    from statekeeper.sql import Catalog
    from statekeeper.store.files import open_file_manager

    errors: list[str] = []
    cycles = 0

    def cycled(result: CycleResult) -> None:
        nonlocal cycles
        cycles += 1
        errors.extend(e for r in result.reports for e in r.errors)
        del errors[20:]

    _wait_for_commits(roots, stop)
    with closing(Catalog.open(f"sqlite:///{work / 'catalog.db'}", upgrade=True)) as catalog:
        maintain(
            [open_file_manager(r) for r in roots],
            _settings(work),
            every=EVERY,
            catalog=catalog,
            stop=stop,
            on_cycle=cycled,
        )
    return {"cycles": cycles, "errors": len(errors), "first errors": errors[:5]}  # type: ignore[dict-item]


def _dagster(roots: list[str], work: Path, stop: threading.Event) -> dict[str, int]:
    """The checkpoint sensor every `EVERY` s and the runs it requests, in this process (as
    `bench.fleet.dagster_runs` does, which tests may not import), with a SQLite instance as deployed."""
    from dagster import DagsterInstance, SensorResult, build_sensor_context

    from statekeeper.orchestration.config import OrchestrationConfig, parse_roots
    from statekeeper.orchestration.definitions import build_definitions
    from statekeeper.orchestration.jobs import requested_job
    from statekeeper.orchestration.resources import CatalogDatabase, CheckpointStorage, MaintenanceConfig
    from statekeeper.orchestration.sensors import SENSOR_NAME

    _wait_for_commits(roots, stop)
    config = OrchestrationConfig(roots=parse_roots(",".join(roots)))
    resources: dict[str, Any] = {
        "storage": CheckpointStorage(roots=list(config.roots)),
        "catalog": CatalogDatabase(url=f"sqlite:///{work / 'catalog.db'}"),
        "maintenance": MaintenanceConfig.from_settings(_settings(work)),
    }
    defs = build_definitions(config, resources)
    sensor = defs.get_repository_def().get_sensor_def(SENSOR_NAME)
    (work / "dagster-home").mkdir(parents=True, exist_ok=True)
    instance = DagsterInstance.local_temp(str(work / "dagster-home"))
    cursor: str | None = None
    ticks = runs = failed = 0
    try:
        while not stop.is_set():
            t0 = time.monotonic()
            result = sensor(build_sensor_context(cursor=cursor, resources=resources, instance=instance))
            ticks += 1
            if isinstance(result, SensorResult):
                cursor = result.cursor
                for request in result.run_requests or []:
                    job = requested_job(defs, request)
                    out = job.execute_in_process(
                        run_config=request.run_config,
                        partition_key=request.partition_key,
                        tags=request.tags,
                        instance=instance,
                        raise_on_error=False,
                    )
                    runs, failed = runs + 1, failed + (not out.success)
            stop.wait(max(0.0, EVERY - (time.monotonic() - t0)))
    finally:
        instance.dispose()
    return {"ticks": ticks, "runs": runs, "failed runs": failed}


def _wait_for_commits(roots: list[str], stop: threading.Event) -> None:
    from statekeeper.store import CommitLog
    from statekeeper.store.files import open_file_manager

    logs = [CommitLog(open_file_manager(r)) for r in roots]
    while not stop.is_set() and any(c.latest() < 1 for c in logs):
        stop.wait(0.5)


PARTS: dict[str, Callable[[list[str], Path, threading.Event], dict[str, int]]] = {
    "writer": _writer,
    "maintain": _maintain,
    "dagster": _dagster,
}


def run_part(part: str, roots: list[str], work: Path, seconds: float, out: Path, trace: bool) -> None:
    """One measured process: `part` for `seconds`, its samples written to `out`."""
    if trace:
        tracemalloc.start(6)
    sampler = Sampler(part, trace)
    stop = threading.Event()
    threading.Timer(seconds, stop.set).start()
    sampler.start(seconds)
    figures = PARTS[part](roots, work, stop)
    out.write_text(
        json.dumps(
            {
                **sampler.result(),
                "figures": figures,
                "seconds": seconds,
                "malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX"),
                "memory_limit_bytes": _limit(),
            },
            indent=1,
        )
    )


def _limit() -> int:
    from statekeeper.store.rocks import shared_memory

    return shared_memory().limits.total_bytes


# -- the driver ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def _s3_roots(local: bool, work: Path) -> Iterator[tuple[list[str], dict[str, str]]]:
    if local:
        yield [str(work / f"root-{i}") for i in range(ROOTS)], {}
        return
    from testkit.s3 import emulator_env, moto_server, new_bucket_name, s3_client

    with moto_server() as url, emulator_env(url):
        bucket = new_bucket_name()
        s3_client(url).create_bucket(Bucket=bucket)
        env = {
            "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        yield [f"s3://{bucket}/root-{i}" for i in range(ROOTS)], env


def soak(
    stack: contextlib.ExitStack, name: str, minutes: float, out: Path, *, local: bool, trace: bool
) -> list[subprocess.Popen[bytes]]:
    """Start soak `name` (`SOAKS`): its processes, each to be measured for `minutes`; its roots live until `stack`
    closes."""
    import tempfile

    tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"memsoak-{name}-"))
    roots, extra = stack.enter_context(_s3_roots(local, Path(tmp)))
    env = {**os.environ, **extra}  # with emulator_env's credentials and endpoint
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        env.pop(k, None)
    procs = []
    for part in SOAKS[name]:
        target = out / (f"{part}.json" if part != "writer" or name == "maintain" else f"writer-{name}.json")
        work = Path(tmp) / part
        work.mkdir()
        # the writer outlives the maintainer by a little, so the maintainer never sees the writes stop
        seconds = minutes * 60 + (15 if part == "writer" else 0)
        cmd = [
            sys.executable,
            "-m",
            "tests.reliability.memory_soak",
            "--child",
            part,
            "--roots",
            ",".join(roots),
            "--work",
            str(work),
            "--seconds",
            str(seconds),
            "--out",
            str(target),
        ]
        procs.append(subprocess.Popen([*cmd, *(["--trace"] if trace else [])], env=env))
    return procs


def plot(out: Path, png: Path) -> Path:
    """One panel per measured process: RSS, RSS outside the block cache and the Python heap, in MiB."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.stem in PARTS]
    fig, axes = plt.subplots(1, len(series), figsize=(5 * len(series), 3.6), squeeze=False)
    for ax, s in zip(axes[0], series, strict=True):
        at = [x["at"] / 60 for x in s["samples"]]
        mib = 2**20
        ax.plot(at, [x["rss"] / mib for x in s["samples"]], label="RSS")
        ax.plot(at, [(x["rss"] - x["cache"]) / mib for x in s["samples"]], label="RSS - block cache")
        ax.plot(at, [x["heap"] / mib for x in s["samples"]], label=f"Python heap ({s['heap']})")
        if any(x["children"] for x in s["samples"]):
            ax.plot(at, [x["children"] / mib for x in s["samples"]], label="children's RSS")
        ax.axhline(s["memory_limit_bytes"] / mib, color="grey", linestyle=":", label="memory limit")
        ax.set_title(s["part"])
        ax.set_xlabel("minutes")
        ax.set_ylabel("MiB")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    return png


BEGIN, END = "<!-- memory-soak -->", "<!-- /memory-soak -->"
"""The section of docs/reliability.md this driver writes (`python -m bench reliability` keeps it)."""


FINDINGS = [
    "measured here (2026-12-03 03:47-04:47, `make soak-hour`, 60 minutes on the 2-core machine, commit "
    "90b8d8a): 3,585 versions written, 1,770 maintenance cycles and 1,034 Dagster runs, no error and no failed "
    "run. Every process stayed under its 256 MiB memory limit (RSS max 168, 172 and 222 MiB). RSS outside the "
    "block cache, median of each 10-minute window: writer 86, 86, 88, 89, 89, 89 (level from the half hour); "
    "maintainer 114, 118, 121, 124, 125, 127 (+1 to 2 MiB per 10 minutes at the end: levelling off); Dagster "
    "process 176, 181, 185, 187, 189, 189 (level in the last window). The Python heap is flat in all three (33, "
    "40 and 64 MiB); the rest of the RSS growth is the shared block cache filling, by design, up to its share of "
    "the limit. The run before the Dagster fix below (2026-12-02, commit 9bab7f9) had the Dagster process at "
    "180, 190, 198, 202, 208, 212, still rising",
    "the whole RSS levels off once the cache stops growing: with a 48 MiB limit (2026-12-03 06:38-07:18, "
    "`STATEKEEPER_MEMORY_MB=48 python -m tests.reliability.memory_soak --minutes 40 --out OUT`, commit 233c311; "
    "2,412 versions, 1,198 cycles, 1,030 Dagster runs, none failed) the block cache settled at 16-23 MiB within "
    "15 minutes, and RSS, median of each 5-minute window, went writer 94, 102, 107, 112, 117, 118, 119, 120; "
    "maintainer 113, 121, 125, 131, 136, 140, 142, 143; Dagster process 175, 182, 186, 190, 195, 200, 202, 204 "
    "MiB. A process's RSS is bounded by what it holds outside RocksDB (levelling off at 90-190 MiB here) plus "
    "`STATEKEEPER_MEMORY_MB`, which caps the cache and memtables only",
    "the growth is not Python objects: tracemalloc (`--trace`, 15 minutes) finds the Python heap of the "
    "maintainer flat from a third of the way in to the end (the largest growing site +34 KiB, the parsed-manifest "
    "cache, which holds what the roots hold) and the writer's growth is the test model's bounded `lru_cache`; "
    "the parsed, known-SST, commit-record and inventory caches stay bounded",
    "it is not glibc arena fragmentation either: with `MALLOC_ARENA_MAX=2` (10 minutes, a quieter machine: "
    "370 versions, 122 cycles) the writer's RSS outside the block cache grew 75 -> 86 MiB and the maintainer's "
    "104 -> 116 MiB, the same per version as without (the writer ~30 KiB a version of 12 stores, ~2.5 KiB a store "
    "commit; the maintainer already calls `malloc_trim` every cycle). It scales with versions committed, not "
    "with time: native memory held per commit (RocksDB, or the S3 client's native buffers) is the open lead",
    "the Dagster process's growth outside the cache was mostly freed heap that glibc kept: its sensor ticks and "
    "in-process runs never called `malloc_trim`, which the maintain loop calls after every cycle. Each tick and "
    "each maintenance operation of a run now ends with it (`store.rocks.release_free_heap`; test "
    "`tests/orchestration/test_sensors.py::test_each_tick_and_each_run_hands_the_freed_heap_back`). Measured side "
    "by side (2026-12-03, `python -m tests.reliability.memory_soak --minutes 20 --soaks dagster` of the commit "
    "before and of the commit after, at the same time on the 2-core machine, 491 and 494 runs): RSS outside the "
    "block cache, median of each 4-minute window, before 175, 181, 184, 188, 190 MiB (+2.7 in the last window, "
    "still rising); after 173, 177, 180, 182, 183 (+1.1: levelling off). In a deployment each run is a process of "
    "its own (Dagster's default run launcher) and the long-lived code server runs only the ticks",
]
"""What the runs showed, for the doc (written by hand after a run: the numbers are that run's)."""


def _mib(samples: list[dict[str, float]], key: str, part: slice) -> float:
    chosen = samples[part] or samples
    values = sorted(x["rss"] - x["cache"] if key == "outside" else x[key] for x in chosen)
    return values[len(values) // 2] / 2**20


def section(out: Path, png: Path, doc: Path) -> str:
    """The doc's section: what ran, for how long, and each process's RSS at the start, the middle and the end."""
    rows = []
    for p in sorted(out.glob("*.json")):
        s = json.loads(p.read_text())
        if p.stem not in PARTS or not s["samples"]:
            continue
        x, q = s["samples"], max(1, len(s["samples"]) // 4)
        rows.append(
            f"| {s['part']} | {x[-1]['at'] / 60:.0f} | {_mib(x, 'rss', slice(q, 2 * q)):.0f} / "
            f"{_mib(x, 'rss', slice(-q, None)):.0f} | {max(v['rss'] for v in x) / 2**20:.0f} | "
            f"{_mib(x, 'outside', slice(q, 2 * q)):.0f} / {_mib(x, 'outside', slice(-q, None)):.0f} | "
            f"{_mib(x, 'heap', slice(q, 2 * q)):.0f} / {_mib(x, 'heap', slice(-q, None)):.0f} | "
            f"{s['memory_limit_bytes'] / 2**20:.0f} |"
        )
    return "\n".join(
        [
            BEGIN,
            "### Memory over long runs",
            "",
            f"[`tests/reliability/memory_soak.py`](../tests/reliability/memory_soak.py) (`make soak-hour`: an hour; "
            "`SOAK_MINUTES=N` for N minutes): a writer process commits a version a second to each of "
            f"{ROOTS} S3 roots (moto, in a child process) of {PARTITIONS} stores, every fifth with a losing attempt; "
            f"beside it a `statekeeper maintain` loop process (a cycle every {EVERY:.0f} s, SQLite catalog), and "
            "separately a process running the Dagster code location's checkpoint sensor every "
            f"{EVERY:.0f} s and every run it requests in process (SQLite instance). Each process samples its own "
            f"RSS every {SAMPLE_SECONDS:.0f} s (MiB below: median of the second quarter / of the last quarter; "
            "the first quarter is warm-up), the shared RocksDB block cache and the Python heap.",
            "",
            "| process | minutes | RSS | RSS max | RSS outside the block cache | Python heap | memory limit |",
            "|---|---|---|---|---|---|---|",
            *rows,
            "",
            *[f"- {f}" for f in FINDINGS],
            "",
            f"![RSS over time]({os.path.relpath(png, doc.parent)})",
            "",
            END,
        ]
    )


def write_section(doc: Path, text: str) -> None:
    """Replace the marked section of `doc`, or append it."""
    current = doc.read_text() if doc.exists() else ""
    if BEGIN in current and END in current:
        head, rest = current.split(BEGIN, 1)
        current = head + text + rest.split(END, 1)[1]
    else:
        current = current.rstrip("\n") + "\n\n" + text + "\n"
    doc.write_text(current)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--out", type=Path, default=Path("bench/results/memory_soak"))
    p.add_argument("--soaks", default=",".join(SOAKS), help="which soaks, comma-separated (run at the same time)")
    p.add_argument("--png", type=Path, help="where the plot goes (default: OUT/memory_soak.png)")
    p.add_argument("--doc", type=Path, help="write the section of this page (docs/reliability.md)")
    p.add_argument("--replot", action="store_true", help="only plot (and --doc) the series already in OUT")
    p.add_argument("--local", action="store_true", help="local roots instead of S3 (moto)")
    p.add_argument("--trace", action="store_true", help="tracemalloc in the measured processes (slower)")
    p.add_argument("--child", choices=sorted(PARTS), help=argparse.SUPPRESS)
    p.add_argument("--roots", help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(processName)s %(name)s %(message)s")
    if a.child:
        run_part(a.child, a.roots.split(","), a.work, a.seconds, a.out, a.trace)
        return
    a.out.mkdir(parents=True, exist_ok=True)
    if not a.replot:
        with contextlib.ExitStack() as stack:
            procs = [
                p for n in a.soaks.split(",") for p in soak(stack, n, a.minutes, a.out, local=a.local, trace=a.trace)
            ]
            failed = [p.args for p in procs if p.wait() != 0]
        if failed:
            raise SystemExit(f"soak processes failed: {failed!r}")
    png = plot(a.out, a.png or a.out / "memory_soak.png")
    if a.doc is not None:
        write_section(a.doc, section(a.out, png, a.doc))
    print(png)


if __name__ == "__main__":
    main()
