"""Soak (DESIGN invariants 3, 4, 8): writers, the maintenance loop, readers and injected S3 faults
together on one S3 root for a minute (default) or ten (`slow`).

* a writer thread commits a batch on every partition (the store API, `scenarios.BatchWriter`) and the
  commit record, at most `WRITE_HZ` versions a second, every fifth with a losing attempt (an orphan);
* the maintenance loop (`statekeeper.maintenance.loop.maintain`, what `statekeeper maintain --every`
  runs) snapshots, expires and cleans orphans every `EVERY` seconds, with a SQLite catalog;
* reader threads load one of the newest committed versions of a random partition and compare it
  with the model (`scenarios.expected_state`); a load slowed by S3 faults (retries with backoff) may
  outlast the version's retention (`RETAIN` versions at `WRITE_HZ`: 3 s), and then fails as
  `VersionExpiredError` (docs/maintenance.md): counted, and accepted only for a version no longer retained;
* S3 fails `FAULT_RATE` of all requests the way S3 does (503 SlowDown, 500 before or after the request
  took effect, connection resets before or after, truncated bodies), injected by the fault proxy of
  `testkit/s3.py` between the store and the S3 server, over real sockets.

The S3 server (moto) runs in a child process, so that this process's RSS is the store's (and the
stateless proxy's) alone.
At every sample (each `SAMPLE_SECONDS`) the files and bytes under the root stay under a bound
derived from retention and the snapshot threshold (`file_bound`); at the end every retained version
of every partition loads to exactly the model's state and `verify_root` is clean; and the RSS outside
the shared block cache in the last third of the samples is not above the first third's (beyond
`RSS_TOLERANCE`), while the cache stays within its capacity (`MemoryLimits.total_bytes`).

The block cache is left out because it fills by design: every load that rebuilds a store opens a new
RocksDB whose SSTs' index and filter blocks are cached, and when that DB closes they stay, unpinned,
until the LRU needs their room (a few hundred bytes a load: ~0.7 MiB a minute for the readers here, up
to the capacity, 256 MiB by default). With a 16 MiB limit the same readers' RSS is flat.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import threading
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from statekeeper.maintenance.inventory import check_root
from statekeeper.maintenance.loop import CycleResult, maintain
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.sql import Catalog
from statekeeper.store import CommitLog, StateStore, VersionExpiredError, faults
from statekeeper.store.errors import ConfigurationError
from statekeeper.store.files import open_file_manager
from statekeeper.store.rocks import shared_memory
from testkit.s3 import ALL_FAULTS, TIMEOUT
from tests.model_steps import INJECTED, SOAK
from tests.reliability.conftest import SoakS3
from tests.reliability.scenarios import (
    OPERATOR,
    SCENARIOS,
    BatchWriter,
    check,
    expected_state,
    store_config,
)

PARTITIONS = 4
WRITE_HZ = 2.0  # versions a second, at most
EVERY = 2.0  # seconds between maintenance cycles
RETAIN = 6
THRESHOLD = 4
ORPHAN_GRACE = 4.0
LOAD_GRACE = 1.0
CYCLE_ALLOWANCE = 20.0
"""The longest a maintenance cycle may take on a loaded 2-core machine (S3 on moto, faults retried)."""
FAULT_RATE = 0.03
FAULT_KINDS = tuple(k for k in ALL_FAULTS if k != TIMEOUT)  # a hung response costs a read timeout: rarer
READERS = 2
SAMPLE_SECONDS = 2.0
RSS_TOLERANCE = (1.10, 24 * 2**20)  # last third <= first third x 1.10 + 24 MiB
CATALOG_HISTORY = 30.0
"""The catalog keeps half a minute of history: its rows stay in proportion to the root, as the RSS must."""
MAX_FILE_BYTES = 64 * 2**10
"""No file of this history is larger: 40 keys of at most ~400 bytes (a snapshot SST holds the whole state)."""


def maintenance_settings(work: Path) -> MaintenanceSettings:
    return MaintenanceSettings(
        snapshot_threshold=THRESHOLD,
        min_versions_to_retain=RETAIN,
        orphan_grace_seconds=ORPHAN_GRACE,
        load_grace_seconds=LOAD_GRACE,
        parallelism=2,
        lease_ttl_seconds=30.0,
        work_dir=str(work / "maintenance"),
        catalog_history_seconds=CATALOG_HISTORY,
    )


def file_bound() -> int:
    """The most files the root may hold at any instant.

    A version stays until maintenance has seen it leave retention: RETAIN retained, up to THRESHOLD
    more since the base snapshot of the oldest retained one, and those written while maintenance
    waits for its next cycle, for a new snapshot's load grace and for an orphan's grace (WRITE_HZ x
    (EVERY + LOAD_GRACE + ORPHAN_GRACE + CYCLE_ALLOWANCE)). Each version is a changelog per partition,
    a commit record and at most one orphan; each partition has a snapshot (manifest + SST) per
    THRESHOLD versions of that window, plus the one being written.
    """
    window = RETAIN + THRESHOLD + int(WRITE_HZ * (EVERY + LOAD_GRACE + ORPHAN_GRACE + CYCLE_ALLOWANCE)) + 1
    per_version = PARTITIONS + 1 + 1
    snapshots = PARTITIONS * (window // THRESHOLD + 2) * 2
    return window * per_version + snapshots


@dataclass
class Soak:
    root: str
    work: Path
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)
    loads: int = 0
    outrun: int = 0
    """Loads that failed because their version left retention while they ran (see the module's docstring)."""
    slowest_load: float = 0.0
    commits: int = 0
    cycles: int = 0
    cycle_errors: list[str] = field(default_factory=list)
    """Kept instead of the cycles' reports, whose rows (a file each) would grow this process's RSS."""
    faults: int = 0

    def run(self, name: str, fn: Any) -> threading.Thread:
        def guarded() -> None:
            try:
                fn()
            except BaseException as e:
                self.errors.append(f"{name}: {type(e).__name__}: {e}")
                self.stop.set()

        t = threading.Thread(target=guarded, name=f"soak-{name}", daemon=True)
        t.start()
        return t

    def write(self) -> None:
        with closing(BatchWriter(self.root, str(self.work / "writer"), partitions=PARTITIONS)) as writer:
            while not self.stop.is_set():
                t0 = time.monotonic()
                self.commits = writer.commit(1, losing=self.commits % 5 == 0)
                self.stop.wait(max(0.0, 1 / WRITE_HZ - (time.monotonic() - t0)))

    def maintain(self) -> None:
        url = f"sqlite:///{self.work / 'catalog.db'}"
        with closing(Catalog.open(url, upgrade=True)) as catalog:
            maintain(
                open_file_manager(self.root),
                maintenance_settings(self.work),
                every=EVERY,
                catalog=catalog,
                stop=self.stop,
                on_cycle=self.cycled,
            )

    def cycled(self, result: CycleResult) -> None:
        self.cycles += 1
        self.cycle_errors.extend(e for r in result.reports for e in r.errors)

    def read(self, seed: int) -> None:
        rng = random.Random(seed)
        fm = open_file_manager(self.root)
        log = CommitLog(fm)
        local = self.work / f"reader-{seed}"
        store: StateStore | None = None
        partition = -1
        try:
            while not self.stop.is_set():
                latest = log.latest()
                if latest < 1:
                    self.stop.wait(0.2)
                    continue
                p = rng.randrange(PARTITIONS)
                if p != partition:
                    if store is not None:
                        store.close()
                    store = StateStore(fm, OPERATOR, p, config=store_config(str(local), f"p{p}"))
                    partition = p
                assert store is not None
                version = max(1, latest - rng.randrange(2))  # the newest two; a load can outlast them (below)
                t0 = time.monotonic()
                try:
                    store.load(version)
                except VersionExpiredError:
                    if (now := log.latest()) - version < RETAIN:
                        raise AssertionError(f"version {version} expired with {now} the newest") from None
                    self.outrun += 1
                    continue
                finally:
                    self.slowest_load = max(self.slowest_load, time.monotonic() - t0)
                got = tuple(store.items())
                store.abort()
                if got != expected_state(p, version):
                    raise AssertionError(f"partition {p} version {version} read differs from the model")
                self.loads += 1
                self.stop.wait(0.05)
        finally:
            if store is not None:
                store.close()


@dataclass
class Sample:
    at: float
    files: int
    bytes: int
    rss: int
    cache: int
    """The shared block cache's usage (bounded by its capacity; memtables are charged to it too)."""

    @property
    def outside_cache(self) -> int:
        return self.rss - self.cache


def _usage(root: str) -> tuple[int, int]:
    infos = list(open_file_manager(root).list(""))
    return len(infos), sum(i.size for i in infos)


def soak(s3: SoakS3, work: Path, seconds: float) -> dict[str, Any]:
    root = s3.root
    s3.proxy.set_faults(FAULT_RATE, FAULT_KINDS)
    s = Soak(root, work)
    proc = psutil.Process()
    samples: list[Sample] = []
    bound = file_bound()
    cache, capacity = shared_memory().cache, shared_memory().limits.total_bytes
    try:
        threads = [s.run("writer", s.write), s.run("maintainer", s.maintain)]
        threads += [s.run(f"reader-{i}", lambda i=i: s.read(i)) for i in range(READERS)]
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds and not s.stop.is_set():
            time.sleep(SAMPLE_SECONDS)
            files, size = _usage(root)
            samples.append(Sample(time.monotonic() - t0, files, size, proc.memory_info().rss, cache.get_usage()))
            assert samples[-1].cache <= capacity, f"block cache {samples[-1].cache:,} bytes > capacity {capacity:,}"
            assert files <= bound, f"{files} files under the root at {samples[-1].at:.0f}s > bound {bound}"
            assert size <= bound * MAX_FILE_BYTES, f"{size:,} bytes under the root > {bound * MAX_FILE_BYTES:,}"
    finally:
        s.stop.set()
        for t in threads:
            t.join(120)
        s3.proxy.set_faults(0.0)
    injected = sum(s3.proxy.injected.values())
    assert s.errors == [], s.errors
    assert s.cycle_errors == [], s.cycle_errors[:10]
    latest = CommitLog(open_file_manager(root)).latest()
    assert latest == s.commits
    problems = check(root, str(work / "check"), SCENARIOS["expiry"], latest, partitions=PARTITIONS)
    assert problems == []
    third = max(1, len(samples) // 3)
    first = statistics.median(x.outside_cache for x in samples[:third])
    last = statistics.median(x.outside_cache for x in samples[-third:])
    factor, slack = RSS_TOLERANCE
    trajectory = ", ".join(
        f"{x.at:.0f}s {x.rss / 2**20:.0f} - {x.cache / 2**20:.0f}" for x in samples[:: max(1, len(samples) // 12)]
    )
    assert last <= first * factor + slack, (
        f"RSS outside the block cache grew from {first / 2**20:.0f} MiB to {last / 2**20:.0f} MiB "
        f"(RSS - cache in MiB over time: {trajectory})"
    )
    assert s.loads > 0 and s.cycles >= 2 and injected > 0
    figures = {
        "seconds": round(seconds),
        "versions": latest,
        "partitions": PARTITIONS,
        "loads": s.loads,
        "loads outrun by expiry": s.outrun,
        "slowest load ms": round(s.slowest_load * 1000),
        "cycles": s.cycles,
        "s3 faults": injected,
        "max files": max(x.files for x in samples),
        "file bound": bound,
        "max bytes": max(x.bytes for x in samples),
        "rss outside the block cache, first third MiB": round(first / 2**20),
        "rss outside the block cache, last third MiB": round(last / 2**20),
        "rss last MiB": round(samples[-1].rss / 2**20),
        "block cache last MiB": round(samples[-1].cache / 2**20),
    }
    for kind, n in s3.proxy.injected.items():
        INJECTED[f"S3 {kind} (soak)"] += n
    SOAK[f"{round(seconds / 60)} min"] = figures
    shutil.rmtree(work / "check", ignore_errors=True)
    return figures


def test_soak_one_minute(soak_s3: SoakS3, tmp_path: Path) -> None:
    figures = soak(soak_s3, tmp_path, seconds=float(os.environ.get("STATEKEEPER_SOAK_SECONDS", "60")))
    print(figures)
    assert figures["versions"] >= 20


@pytest.mark.slow
@pytest.mark.timeout(1200)  # ten minutes of soak, then the final check
def test_soak_ten_minutes(soak_s3: SoakS3, tmp_path: Path) -> None:
    figures = soak(soak_s3, tmp_path, seconds=600.0)
    print(figures)
    assert figures["versions"] >= 150  # ~350 on a loaded 2-core machine


def test_a_job_starting_while_maintenance_checks_the_root_is_not_refused(tmp_path: Path) -> None:
    """Found by the soak: `check_root` looked at commits/, state/ and spark/ (all empty), the job then
    wrote its first changelog, and the last listing saw that file and refused the root as "not a
    checkpoint root". The job's first file is injected at exactly that instant (the fault seam's
    "local.list" point, before the listing of the whole root)."""
    root = tmp_path / "root"
    root.mkdir()
    first = root / "state" / OPERATOR / "00000" / "changelogs" / "00000000000000000001_x.changelog"

    def job_starts(point: str, prefix: str) -> None:
        if point == "local.list" and prefix == "" and not first.exists():
            first.parent.mkdir(parents=True)
            first.write_bytes(b"")

    previous = faults.arm(job_starts)
    try:
        check_root(open_file_manager(str(root)))  # no ConfigurationError
    finally:
        faults.arm(previous)
    (root / "notes.txt").write_text("a stray file")
    shutil.rmtree(root / "state")
    with pytest.raises(ConfigurationError, match="does not look like a statekeeper checkpoint root"):
        check_root(open_file_manager(str(root)))
