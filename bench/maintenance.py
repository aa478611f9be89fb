"""How fast is maintenance: recovery against chain length, snapshot creation, expiry?

Maintenance: recovery time vs chain length, snapshot creation, expiry throughput.

1. Recovery: a store with 1M keys (16-byte keys, 64-byte values), bulk-loaded in 4 changelogs, then
   micro-batches of 10k random updates. After some batches a fresh process loads the latest version
   (a `StateStore` in an empty local directory: what a restarted Spark task does). Baseline: the same
   history without maintenance (every changelog since version 1 is replayed). statekeeper: the same
   history with `create_snapshots` run after every batch at `snapshot_threshold=10`, as a scheduled
   maintainer would, so the chain a load replays stays below the threshold.
2. Snapshot creation: the first snapshot of the 1M-key store (cold: replay from version 1, every SST
   uploaded) and the next one 10 batches later (local replica: only the 10 new changelogs
   replayed; only SSTs that changed uploaded). Baseline: uploading the whole snapshot again.
3. Expiry: a root of 50 stores x 200 committed versions; `expire_versions` keeps 5 versions per store
   and deletes the rest (~9,750 changelogs and ~190 commit records) in batched, parallel deletes, on
   local disk and on a moto S3 server on 127.0.0.1. Baseline: one delete request per file, sequential.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

from bench.baselines import KEY_BYTES, VALUE_BYTES
from bench.report import Table
from statekeeper.maintenance.expiry import expire_versions
from statekeeper.maintenance.inventory import clear_caches
from statekeeper.maintenance.replica_pool import close_replicas
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_builds import create_snapshots
from statekeeper.store.commit_log import CommitLog
from statekeeper.store.files import CheckpointFileManager, open_file_manager
from statekeeper.store.formats.commit import CommitRecord
from statekeeper.store.formats.snapshot import SnapshotManifest
from statekeeper.store.layout import StoreId, commit_path
from statekeeper.store.state_store import StateStore, StoreConfig

log = logging.getLogger("bench.maintenance")

OPERATOR = "bench"
THRESHOLD = 10
LOAD_TARGET_S = 2.0


@dataclass(frozen=True)
class Sizes:
    keys: int
    load_chunks: int
    updates: int
    checkpoints: tuple[int, ...]  # batches after the bulk load at which recovery is measured
    expiry_stores: int
    expiry_versions: int
    baseline_deletes: int


# Checkpoints at 9, 29, 59: the chain since the last snapshot is 9, the longest within the threshold.
FULL = Sizes(1_000_000, 4, 10_000, (1, 9, 29, 59), 50, 200, 1000)
QUICK = Sizes(20_000, 2, 500, (1, 9, 19), 6, 30, 50)


def _keys(n: int, seed: int) -> list[bytes]:
    r = random.Random(seed)
    raw = r.randbytes(KEY_BYTES * n)
    return [raw[i : i + KEY_BYTES] for i in range(0, len(raw), KEY_BYTES)]


def _values(n: int, r: random.Random) -> list[bytes]:
    raw = r.randbytes(VALUE_BYTES * n)
    return [raw[i : i + VALUE_BYTES] for i in range(0, len(raw), VALUE_BYTES)]


class _Job:
    """One partition of a streaming query writing to `root`, and its driver."""

    def __init__(self, root: str, work: str, sizes: Sizes) -> None:
        self.sizes = sizes
        self.store = StateStore(root, OPERATOR, 0, config=StoreConfig(local_dir=os.path.join(work, "job")))
        self.commits = CommitLog(self.store.fm)
        self.keys = _keys(sizes.keys, 1)
        self.rng = random.Random(2)
        self.version = 0

    def _commit(self, keys: list[bytes]) -> None:
        s = self.store.load(self.version)
        cf = s.column_family("default")
        for i in range(0, len(keys), 100_000):
            chunk = keys[i : i + 100_000]
            cf.put_batch(chunk, _values(len(chunk), self.rng))
        result = s.commit()
        self.version = result.version
        self.commits.commit(self.version, {OPERATOR: [result.checkpoint_id]})

    def bulk_load(self) -> None:
        per = -(-len(self.keys) // self.sizes.load_chunks)
        for i in range(0, len(self.keys), per):
            self._commit(self.keys[i : i + per])

    def batch(self, hot: bool = False) -> None:
        """Random updates over every key, or (`hot`) over one contiguous 5% of the key space."""
        if hot:
            ordered = sorted(self.keys)
            start = len(ordered) // 2
            pool = ordered[start : start + len(ordered) // 20]
            self._commit(self.rng.sample(pool, min(self.sizes.updates, len(pool))))
        else:
            self._commit(self.rng.sample(self.keys, self.sizes.updates))

    def close(self) -> None:
        self.store.close()


def _recover(root: str, work: str, version: int) -> tuple[float, int]:
    """(seconds, changelogs replayed) of a load of `version` in a fresh, empty local directory."""
    local = tempfile.mkdtemp(dir=work, prefix="recover-")
    probe = StateStore(root, OPERATOR, 0, config=StoreConfig(local_dir=local))
    try:
        t0 = time.perf_counter()
        probe.load(version)
        seconds = time.perf_counter() - t0
        assert probe.last_load is not None
        return seconds, probe.last_load.replayed_changelogs
    finally:
        probe.close()
        shutil.rmtree(local, ignore_errors=True)


def recovery_and_snapshots(sizes: Sizes, base: str) -> list[Table]:
    settings = MaintenanceSettings(
        snapshot_threshold=THRESHOLD,
        orphan_grace_seconds=0,
        load_grace_seconds=0,
        work_dir=os.path.join(base, "maint-work"),
    )
    plain_root, maint_root = os.path.join(base, "plain"), os.path.join(base, "maintained")
    plain, maintained = (
        _Job(plain_root, os.path.join(base, "w1"), sizes),
        _Job(maint_root, os.path.join(base, "w2"), sizes),
    )
    snapshot_rows: list[list[object]] = []
    rows: list[list[object]] = []
    maint_fm = open_file_manager(maint_root)
    try:
        plain.bulk_load()
        maintained.bulk_load()
        first = create_snapshots(maint_fm, settings.with_(snapshot_threshold=1))
        snapshot_rows.append(_snapshot_row("first snapshot (cold: replay from version 1)", first))
        for i in range(1, max(sizes.checkpoints) + 1):
            plain.batch()
            maintained.batch()
            report = create_snapshots(maint_fm, settings)
            if report.snapshots and len(snapshot_rows) < 2:
                label = f"next, {THRESHOLD} batches of updates spread over all keys later (replica)"
                snapshot_rows.append(_snapshot_row(label, report))
            if i in sizes.checkpoints:
                p_s, p_n = _recover(plain_root, base, plain.version)
                m_s, m_n = _recover(maint_root, base, maintained.version)
                rows.append([i, p_n, round(p_s, 3), m_n, round(m_s, 3), round(p_s / m_s, 1)])
                log.info("recovery after %d batches: %.2fs (%d changelogs) vs %.2fs (%d)", i, p_s, p_n, m_s, m_n)
        create_snapshots(maint_fm, settings.with_(snapshot_threshold=1))
        for _ in range(THRESHOLD):
            maintained.batch(hot=True)
        report = create_snapshots(maint_fm, settings)
        label = f"next, {THRESHOLD} batches of updates to one contiguous 5% of the keys later (replica)"
        snapshot_rows.append(_snapshot_row(label, report))
    finally:
        plain.close()
        maintained.close()
        close_replicas()
    within = [r for r in rows if int(str(r[3])) < THRESHOLD]
    worst = max((float(str(r[4])) for r in within), default=float("nan"))
    recovery = Table(
        f"Recovery time of a {sizes.keys:,}-key store vs chain length",
        [
            "batches after bulk load",
            "changelogs replayed, no maintenance",
            "load s, no maintenance",
            f"changelogs replayed, snapshots at threshold {THRESHOLD}",
            "load s, with maintenance",
            "speedup",
        ],
        rows,
        [
            f"{sizes.updates:,} random updates per batch; bulk load in {sizes.load_chunks} changelogs; local disk.",
            "A load is a fresh StateStore in an empty directory (a restarted task): snapshot restore + replay.",
            f"Target: <= {LOAD_TARGET_S:.0f} s while the chain is within the threshold; worst measured "
            f"{worst:.2f} s ({'met' if worst <= LOAD_TARGET_S else 'NOT met'}).",
        ],
    )
    snaps = Table(
        "Snapshot creation: time and bytes uploaded",
        [
            "snapshot",
            "s",
            "changelogs replayed",
            "SSTs uploaded",
            "SSTs reused",
            "MiB uploaded",
            "MiB of the whole snapshot (baseline: upload all)",
        ],
        snapshot_rows,
        [
            "The manifest is written last; SSTs are content-named, so an SST already in the checkpoint location "
            "is never uploaded again.",
            "Updates spread over the whole key space make RocksDB's compactions rewrite every SST, so a snapshot "
            "shares little with the previous one; updates that touch part of the key space leave the other "
            "SSTs as they were, and those are not uploaded again.",
        ],
    )
    return [recovery, snaps]


def _snapshot_row(label: str, report: object) -> list[object]:
    from statekeeper.maintenance.reports import SnapshotReport

    assert isinstance(report, SnapshotReport) and report.snapshots == 1, report
    (row,) = [r for r in report.rows() if r["action"] == "snapshot"]
    fm = open_file_manager(report.root)
    from statekeeper.store.formats.snapshot import SnapshotManifest

    total = SnapshotManifest.from_bytes(fm.read_bytes(row["manifest"]), row["manifest"]).total_sst_bytes
    return [
        label,
        round(row["seconds"], 2),
        row["changelogs_replayed"],
        row["ssts_uploaded"],
        row["ssts_reused"],
        round(row["bytes_uploaded"] / 2**20, 2),
        round(total / 2**20, 2),
    ]


# -- expiry -------------------------------------------------------------------------------------------


def _write_expiry_root(fm: CheckpointFileManager, sizes: Sizes, put: object) -> int:
    """Commit records, tiny changelogs (expiry never reads them) and an empty snapshot per store at
    version `versions - 5`; returns the number of files written."""
    from collections.abc import Callable

    assert callable(put)
    write: Callable[[str, bytes], None] = put
    stores = [StoreId(OPERATOR, p) for p in range(sizes.expiry_stores)]
    ids = {
        (s, v): f"{(hash((s.partition, v)) & (2**128 - 1)):032x}"
        for s in stores
        for v in range(1, sizes.expiry_versions + 1)
    }
    jobs: list[tuple[str, bytes]] = []
    for v in range(1, sizes.expiry_versions + 1):
        record = CommitRecord(v, {OPERATOR: tuple(ids[(s, v)] for s in stores)})
        jobs.append((commit_path(v), record.to_bytes()))
        for s in stores:
            jobs.append((s.changelog(v, ids[(s, v)]), b"x" * 64))
    base = sizes.expiry_versions - 5
    for s in stores:
        m = SnapshotManifest(OPERATOR, s.partition, base, ids[(s, base)], (), {}, ("default",), 0)
        jobs.append((s.manifest(base, ids[(s, base)]), m.to_bytes()))
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda j: write(*j), jobs))
    return len(jobs)


def _proven_by_an_earlier_run(fm: CheckpointFileManager, sizes: Sizes) -> None:
    """The synthetic root's empty snapshots stand for bases a maintenance run proved (invariant 14: it opened them
    and checked what they hold); this suite measures the deletion, so the proofs are given, not repeated."""
    from statekeeper.maintenance.parsed_cache import PROVEN_SNAPSHOTS

    base = sizes.expiry_versions - 5
    for info in fm.list("state/"):
        if info.path.endswith(".manifest") and f"/{base:020d}_" in info.path:
            store = StoreId(OPERATOR, int(info.path.split("/")[2]))
            PROVEN_SNAPSHOTS.add(fm.root_uri, store, [info.path])


@contextmanager
def _moto() -> Iterator[str]:
    from testkit.s3 import MotoServer, emulator_env, s3_client

    server = MotoServer().start()
    try:
        with emulator_env(server.endpoint_url):
            s3_client(server.endpoint_url).create_bucket(Bucket="bench")
            yield "s3://bench/expiry"
    finally:
        server.stop()


def expiry(sizes: Sizes, base: str) -> Table:
    rows: list[list[object]] = []
    settings = MaintenanceSettings(
        min_versions_to_retain=5,
        orphan_grace_seconds=0,
        load_grace_seconds=0,
        parallelism=8,
        work_dir=os.path.join(base, "expiry-work"),
    )
    for backend in ("local disk", "S3 (moto on 127.0.0.1)"):
        with _moto() if backend.startswith("S3") else _local(base) as root:
            for label, baseline in (("statekeeper expire_versions", False), ("baseline: 1 delete per file", True)):
                fm = open_file_manager(f"{root}/{'baseline' if baseline else 'expire'}")

                def put(path: str, data: bytes, fm: CheckpointFileManager = fm) -> None:
                    with fm.create(path) as out:
                        out.write(data)

                written = _write_expiry_root(fm, sizes, put)
                clear_caches()
                _proven_by_an_earlier_run(fm, sizes)
                if baseline:
                    victims = [i.path for i in fm.list("state/") if i.path.endswith(".changelog")]
                    victims = victims[: sizes.baseline_deletes]
                    t0 = time.perf_counter()
                    for p in victims:
                        fm.delete_many([p])
                    seconds = time.perf_counter() - t0
                    files = len(victims)
                else:
                    report = expire_versions(fm, settings)
                    assert report.ok, report.errors
                    seconds, files = report.seconds, report.files
                rows.append([backend, label, written, files, round(seconds, 2), round(files / seconds)])
                log.info("expiry %s %s: %d files in %.2fs", backend, label, files, seconds)
    return Table(
        "Expiry throughput",
        ["checkpoint location", "deleter", "files in root", "files deleted", "s", "files/s"],
        rows,
        [
            f"{sizes.expiry_stores} stores x {sizes.expiry_versions} committed versions, 5 retained per store; "
            "expire_versions time includes its listing and reading every commit record and manifest.",
            "Batches of up to 1000 paths (one DeleteObjects request each on S3), 8 in flight; the baseline "
            f"deletes the first {sizes.baseline_deletes} changelogs one request at a time.",
            "moto's server handles requests one at a time in Python (and fails some concurrent DeleteObjects "
            "with 500s, which the file manager retries): a real S3 endpoint parallelises far better.",
        ],
    )


@contextmanager
def _local(base: str) -> Iterator[str]:
    path = os.path.join(base, "expiry")
    os.makedirs(path, exist_ok=True)
    yield path


def run(quick: bool) -> list[Table]:
    logging.getLogger("statekeeper.store.files.s3").setLevel(logging.WARNING)  # one line per delete request otherwise
    logging.getLogger("statekeeper.maintenance").setLevel(logging.WARNING)  # one line per run otherwise
    sizes = QUICK if quick else FULL
    base = tempfile.mkdtemp(prefix="bench-maintenance-")
    try:
        tables = recovery_and_snapshots(sizes, base)
        tables.append(expiry(sizes, base))
        return tables
    finally:
        close_replicas()
        shutil.rmtree(base, ignore_errors=True)
