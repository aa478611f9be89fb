"""How does commit latency grow with the state: a changelog commit vs a snapshot per commit?

Commit latency vs state size: changelog commit vs snapshot-per-commit, same run.

For each state size the store is loaded with that many keys, then runs micro-batches of random
updates to existing keys (`load` of the version just committed, `put_batch`, `commit`, commit record).
Only `commit()` is timed. The baseline (`bench.baselines.SnapshotPerCommitStore`) starts from the
same state (a RocksDB checkpoint, i.e. hard links, of the store's loaded DB), applies the same kind of
batches and at each commit checkpoints its whole RocksDB and copies it to the checkpoint location
through the same atomic file manager; its `commit()` is timed the same way.

Initial state: committed as a series of changelogs of at most `load_chunk` keys each (`put_batch` of
100k-key batches, one commit and commit record per chunk), which is what a stream that inserted the
keys over a few batches would have produced. Then the benchmark waits for RocksDB's background
flushes and compactions of that bulk load to finish (not timed), so the measured batches see the
steady state rather than the load's compaction backlog.
"""

from __future__ import annotations

import logging
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

from bench.baselines import KEY_BYTES, VALUE_BYTES, SnapshotPerCommitStore
from bench.report import Table, load_note
from statekeeper.store.commit_log import CommitLog
from statekeeper.store.state_store import StateStore, StoreConfig

log = logging.getLogger("bench.commit")

OPERATOR = "bench"
_FLUSHES = "rocksdb.num-running-flushes"
_COMPACTIONS = "rocksdb.num-running-compactions"
SPEEDUP_TARGET = 100.0
TAIL_TARGET = 2.0  # p99 / p50
_MULT = 0x9E3779B97F4A7C15F39CC0605CEDC835  # odd: i -> i * _MULT mod 2**128 is a bijection
_MASK = (1 << 128) - 1


@dataclass(frozen=True)
class Sizes:
    states: tuple[int, ...]
    updates: int  # updates per batch (table 1)
    warmup: int
    batches: int  # measured store batches per size
    baseline_warmup: dict[int, int]
    baseline_batches: dict[int, int]  # measured baseline commits per state size
    load_chunk: int  # keys per initial-state changelog
    sweep_state: int  # table 2: state size
    sweep_updates: tuple[int, ...]  # table 2: updates per batch
    sweep_batches: int
    sweep_baseline_batches: int
    paced_batches: int  # table 3: measured batches at a fixed cadence
    paced_interval_s: float


FULL = Sizes(
    states=(10_000, 1_000_000, 10_000_000),
    updates=10_000,
    warmup=10,
    batches=200,
    baseline_warmup={10_000: 3, 1_000_000: 1, 10_000_000: 1},
    baseline_batches={10_000: 20, 1_000_000: 10, 10_000_000: 3},
    load_chunk=1_000_000,
    sweep_state=1_000_000,
    sweep_updates=(1_000, 10_000, 100_000),
    sweep_batches=50,
    sweep_baseline_batches=3,
    paced_batches=200,
    paced_interval_s=0.1,
)
QUICK = Sizes(
    states=(1_000, 20_000),
    updates=500,
    warmup=2,
    batches=10,
    baseline_warmup={1_000: 1, 20_000: 1},
    baseline_batches={1_000: 3, 20_000: 3},
    load_chunk=10_000,
    sweep_state=20_000,
    sweep_updates=(100, 1_000),
    sweep_batches=5,
    sweep_baseline_batches=2,
    paced_batches=10,
    paced_interval_s=0.05,
)


def key_of(i: int) -> bytes:
    """The key of record `i`: distinct for distinct i, uniformly spread over the 16-byte key space."""
    return ((i * _MULT) & _MASK).to_bytes(KEY_BYTES, "big")


def _values(n: int, r: random.Random) -> list[bytes]:
    raw = r.randbytes(VALUE_BYTES * n)
    return [raw[i : i + VALUE_BYTES] for i in range(0, len(raw), VALUE_BYTES)]


def percentile(samples: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(samples)
    if not s:
        return math.nan
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


LATENCY_COLUMNS = [
    "store p50",
    "store p99",
    "store max",
    "store p99/p50",
    "commits with no RocksDB flush/compaction running",
]
"""The columns of `Stats.cells()`."""


@dataclass
class Stats:
    samples_ms: list[float]
    bytes_per_commit: float
    probe_ms: list[float] | None = None  # write + fsync of the same bytes, right after each commit
    busy: list[bool] | None = None  # per sample: a RocksDB flush or compaction was running as it began

    @property
    def p50(self) -> float:
        return percentile(self.samples_ms, 50)

    @property
    def p99(self) -> float:
        return percentile(self.samples_ms, 99)

    @property
    def max(self) -> float:
        return max(self.samples_ms)

    def cells(self) -> list[object]:
        """Table cells: p50, p99, max, p99/p50, and how many commits began with no background work."""
        tail = round(self.p99 / self.p50, 2)
        return [
            round(self.p50, 2),
            round(self.p99, 2),
            round(self.max, 2),
            tail,
            f"{len(self.quiet())} of {len(self.samples_ms)}",
        ]

    def quiet(self) -> list[float]:
        """The samples of commits that began while RocksDB did no background I/O."""
        return [s for s, b in zip(self.samples_ms, self.busy or [], strict=True) if not b]


class _Changelogged:
    """The store under test plus the driver's commit log, one micro-batch at a time."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.store = StateStore(
            os.path.join(base, "ckpt"), OPERATOR, 0, config=StoreConfig(local_dir=os.path.join(base, "store"))
        )
        self.commits = CommitLog(self.store.fm)
        self.busy = False  # whether RocksDB ran a flush or compaction as the last commit began
        self.store.load(0)

    def batch(self, keys: Sequence[bytes], values: Sequence[bytes], sub: int = 100_000) -> tuple[float, int]:
        """Apply one batch and commit it; returns (commit seconds, changelog bytes)."""
        cf = self.store.column_family("default")
        for i in range(0, len(keys), sub):
            cf.put_batch(keys[i : i + sub], values[i : i + sub])
        self.busy = self.background_busy()
        t0 = time.perf_counter()
        res = self.store.commit()
        elapsed = time.perf_counter() - t0
        self.commits.commit(res.version, {OPERATOR: [res.checkpoint_id]})  # the driver's record: not timed
        self.store.load(res.version, res.checkpoint_id)
        last = self.store.last_load
        assert last is not None and last.reused_local, "the next batch must reuse the local DB"
        return elapsed, res.metrics.changelog_bytes

    def background_busy(self) -> bool:
        db = self.store.db
        return bool(db.property_int_value(_FLUSHES) or db.property_int_value(_COMPACTIONS))

    def wait_for_compactions(self, timeout: float = 600.0) -> float:
        db = self.store.db
        t0 = time.perf_counter()
        props = (_COMPACTIONS, _FLUSHES, "rocksdb.compaction-pending")
        while time.perf_counter() - t0 < timeout:
            if not any(db.property_int_value(p) for p in props):
                break
            time.sleep(0.2)
        return time.perf_counter() - t0

    def close(self) -> None:
        self.store.close()


def _load_initial(cl: _Changelogged, n: int, chunk: int, r: random.Random) -> float:
    t0 = time.perf_counter()
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        keys = [key_of(i) for i in range(start, stop)]
        cl.batch(keys, _values(stop - start, r))
    return time.perf_counter() - t0


def _update_batch(state: int, updates: int, r: random.Random) -> tuple[list[bytes], list[bytes]]:
    idx = r.sample(range(state), updates) if updates < state else list(range(state))
    return [key_of(i) for i in idx], _values(len(idx), r)


def _disk_probe(path: str, data: bytes) -> float:
    """Seconds to write `data` to a new file and fsync it: the disk's floor for any durable commit."""
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - t0
    os.unlink(path)
    return elapsed


def _measure_store(
    cl: _Changelogged, state: int, updates: int, warmup: int, batches: int, seed: int, interval_s: float = 0.0
) -> Stats:
    """Commit `batches` batches after `warmup`; with `interval_s`, one batch starts every interval_s."""
    r = random.Random(seed)
    samples: list[float] = []
    probes: list[float] = []
    busy: list[bool] = []
    total_bytes = 0
    probe_path = os.path.join(cl.base, "disk-probe")
    next_start = time.perf_counter()
    for b in range(warmup + batches):
        if interval_s:
            time.sleep(max(0.0, next_start - time.perf_counter()))
            next_start += interval_s
        keys, values = _update_batch(state, updates, r)
        elapsed, size = cl.batch(keys, values)
        if b >= warmup:
            samples.append(elapsed * 1000)
            busy.append(cl.busy)
            total_bytes += size
            probes.append(_disk_probe(probe_path, r.randbytes(size)) * 1000)
    return Stats(samples, total_bytes / batches, probes, busy)


def _measure_baseline(
    cl: _Changelogged, base: str, state: int, updates: int, warmup: int, batches: int, seed: int
) -> Stats:
    bl = SnapshotPerCommitStore(os.path.join(base, "ckpt"), os.path.join(base, "baseline"))
    bl.adopt_checkpoint_of(cl.store.db)
    r = random.Random(seed)
    samples: list[float] = []
    total_bytes = 0
    try:
        for b in range(warmup + batches):
            keys, values = _update_batch(state, updates, r)
            bl.put_batch(keys, values)
            t0 = time.perf_counter()
            bl.commit()
            elapsed = time.perf_counter() - t0
            bl.drop_old_copies()  # disk hygiene, not timed
            if b >= warmup:
                samples.append(elapsed * 1000)
                total_bytes += bl.last_commit_bytes
            log.debug("baseline state=%d commit %d: %.0f ms", state, b, elapsed * 1000)
    finally:
        bl.close()
        bl.keep_copies = 0
        bl.drop_old_copies()
        shutil.rmtree(bl.local_dir, ignore_errors=True)
        os.sync()  # let the deletes' I/O settle before anything else is measured
    return Stats(samples, total_bytes / batches)


def _fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def _probe_percentile(st: Stats, q: float) -> float:
    return percentile(st.probe_ms or [], q)


def run(quick: bool) -> list[Table]:
    sz = QUICK if quick else FULL
    load_start = os.getloadavg()[0]
    top = tempfile.mkdtemp(prefix="statekeeper-bench-commit-")
    rows: list[list[object]] = []
    speedups: list[float] = []
    tails: list[float] = []
    loads: list[str] = []
    sweep_rows: list[list[object]] = []
    paced_rows: list[list[object]] = []
    paced_tails: list[float] = []
    try:
        for state in sz.states:
            base = tempfile.mkdtemp(prefix=f"state-{state}-", dir=top)
            cl = _Changelogged(base)
            try:
                load_s = _load_initial(cl, state, sz.load_chunk, random.Random(state))
                settle_s = cl.wait_for_compactions()
                loads.append(
                    f"{state:,} keys: initial state committed as {math.ceil(state / sz.load_chunk)} changelog(s) "
                    f"in {load_s:.1f} s, then {settle_s:.1f} s waiting for background compaction."
                )
                log.info(loads[-1])
                st = _measure_store(cl, state, sz.updates, sz.warmup, sz.batches, seed=1)
                log.info("store state=%d: p50 %.1f ms p99 %.1f ms", state, st.p50, st.p99)
                paced = _measure_store(
                    cl, state, sz.updates, sz.warmup, sz.paced_batches, seed=3, interval_s=sz.paced_interval_s
                )
                log.info("store state=%d paced: p50 %.1f ms p99 %.1f ms", state, paced.p50, paced.p99)
                paced_tails.append(paced.p99 / paced.p50)
                paced_rows.append(
                    [
                        state,
                        sz.updates,
                        *paced.cells(),
                        round(_probe_percentile(paced, 50), 2),
                        round(_probe_percentile(paced, 99), 2),
                    ]
                )
                bl = _measure_baseline(
                    cl, base, state, sz.updates, sz.baseline_warmup[state], sz.baseline_batches[state], seed=2
                )
                log.info("baseline state=%d: p50 %.0f ms", state, bl.p50)
                if state == sz.sweep_state:
                    sweep_rows = _sweep(cl, base, sz)
            finally:
                cl.close()
                shutil.rmtree(base, ignore_errors=True)
            speedups.append(bl.p50 / st.p50)
            tails.append(st.p99 / st.p50)
            quiet = st.quiet()
            rows.append(
                [
                    state,
                    sz.updates,
                    *st.cells(),
                    round(percentile(quiet, 99) / percentile(quiet, 50), 2),
                    round(_probe_percentile(st, 50), 2),
                    round(_probe_percentile(st, 99), 2),
                    _fmt_bytes(st.bytes_per_commit),
                    round(bl.p50, 1),
                    round(bl.max, 1),
                    _fmt_bytes(bl.bytes_per_commit),
                    round(speedups[-1], 1),
                ]
            )
    finally:
        shutil.rmtree(top, ignore_errors=True)

    by_state = Table(
        title="Commit latency vs state size (ms): changelog commit vs snapshot-per-commit baseline",
        columns=[
            "state keys",
            "updates/batch",
            *LATENCY_COLUMNS,
            "their p99/p50",
            "disk fsync p50",
            "disk fsync p99",
            "changelog/commit",
            "baseline p50",
            "baseline max",
            "copied/commit",
            "speedup (p50)",
        ],
        rows=rows,
        notes=[
            f"Targets: the store's commit cost follows the batch, not the state; >= {SPEEDUP_TARGET:.0f}x faster than "
            f"the baseline at the largest state (here {speedups[-1]:.0f}x: "
            f"{'met' if speedups[-1] >= SPEEDUP_TARGET else 'NOT met'}); store p99 <= {TAIL_TARGET:.0f}x p50 "
            f"({'met' if all(t <= TAIL_TARGET for t in tails) else 'NOT met'} at every size: "
            + ", ".join(f"{t:.1f}x" for t in tails)
            + ").",
            f"{KEY_BYTES}-byte keys, {VALUE_BYTES}-byte random values; each batch updates distinct random existing "
            "keys. Timed: `StateStore.commit()` (flush the last changelog blocks, seal, fsync, atomic publish to the "
            "local checkpoint directory) vs the baseline's commit (RocksDB checkpoint + copy of every file through "
            "the same file manager). The driver's commit record and the next `load` (local DB reused) are not timed.",
            "disk fsync: after each measured store commit, a new file with as many bytes as that changelog is "
            "written and fsynced (not part of the commit): the disk's own latency floor and tail at that moment. "
            "The store's commit fsyncs the sealed changelog once, hard-links it into the checkpoint directory and "
            "fsyncs that directory.",
            "Commits that begin while RocksDB flushes a memtable or compacts (in the background, on the same disk) "
            "wait behind that I/O in their fsyncs; the two columns after p99/p50 show the commits that began with no "
            "such work running. The loop commits back to back (about 100 batches/s), so the larger states compact "
            "during much of it.",
            f"Store: {sz.warmup} warm-up + {sz.batches} measured batches per size; baseline: "
            + ", ".join(f"{sz.baseline_warmup[s]} + {sz.baseline_batches[s]} at {s:,}" for s in sz.states)
            + " (it is slow by design); percentiles interpolate linearly between ranks.",
            *loads,
            "Baseline state: a RocksDB checkpoint (hard links) of the store's loaded DB, so both start from "
            "identical data; only its newest published copy is kept on disk.",
            load_note(load_start),
        ],
    )
    sweep = Table(
        title=f"Commit latency vs batch size at {sz.sweep_state:,} state keys (ms)",
        columns=[
            "updates/batch",
            "store p50",
            "store p99",
            "disk fsync p50",
            "changelog/commit",
            "baseline p50",
            "copied/commit",
            "speedup (p50)",
        ],
        rows=sweep_rows,
        notes=[
            f"Same store as the table above, continuing its batches; store: {sz.warmup} warm-up + "
            f"{sz.sweep_batches} measured batches per row, all rows first; then the baseline: 1 warm-up + "
            f"{sz.sweep_baseline_batches} commits per row. The store's commit grows with the updates it publishes; "
            "the baseline's with the state.",
        ],
    )
    paced_table = Table(
        title=f"Commit latency at a steady {1 / sz.paced_interval_s:.0f} batches/s (ms)",
        columns=[
            "state keys",
            "updates/batch",
            *LATENCY_COLUMNS,
            "disk fsync p50",
            "disk fsync p99",
        ],
        rows=paced_rows,
        notes=[
            f"The same stores, right after the table above: {sz.warmup} warm-up + {sz.paced_batches} batches, one "
            f"starting every {sz.paced_interval_s * 1000:.0f} ms (a streaming job's cadence: Spark micro-batches take "
            "hundreds of ms), so RocksDB's background flushes and compactions mostly run between commits. "
            f"p99 <= {TAIL_TARGET:.0f}x p50: {'met' if all(t <= TAIL_TARGET for t in paced_tails) else 'NOT met'} "
            "(" + ", ".join(f"{t:.1f}x" for t in paced_tails) + ").",
        ],
    )
    return [by_state, paced_table, sweep]


def _sweep(cl: _Changelogged, base: str, sz: Sizes) -> list[list[object]]:
    stores = {u: _measure_store(cl, sz.sweep_state, u, sz.warmup, sz.sweep_batches, seed=u) for u in sz.sweep_updates}
    rows: list[list[object]] = []
    for updates, st in stores.items():
        bl = _measure_baseline(cl, base, sz.sweep_state, updates, 1, sz.sweep_baseline_batches, seed=updates + 1)
        rows.append(
            [
                updates,
                round(st.p50, 2),
                round(st.p99, 2),
                round(_probe_percentile(st, 50), 2),
                _fmt_bytes(st.bytes_per_commit),
                round(bl.p50, 1),
                _fmt_bytes(bl.bytes_per_commit),
                round(bl.p50 / st.p50, 1),
            ]
        )
        log.info("sweep updates=%d: store p50 %.1f ms, baseline p50 %.0f ms", updates, st.p50, bl.p50)
    return rows
