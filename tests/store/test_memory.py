"""Bounded memory (DESIGN "Memory"): every store instance of a process shares one limit.

Each case runs `tests/store/helpers/memory_probe.py` in a fresh process, so the process-wide limit
is set before the first store opens. The probe opens many stores, writes several times the limit
into them in batches, reads some back, commits, and reports RSS (psutil, plus the kernel's VmHWM
peak reset just before the stores open) and the shared cache and write-buffer usage.

Why the RSS bound has a fixed and a per-store part (measured on this 2-core Linux box, glibc 2.x,
rocksdict 0.3.29, 64 MiB limit -> 32 MiB write buffer budget):

* Opening a store costs ~0.24 MiB of RSS outside the cache (DB object, column family, table cache,
  info log, changelog writer); with data, SST table readers and a zstd context take it to
  ~0.3-0.5 MiB per store. Python-side, a 512 KiB batch costs ~2 MiB transient (lists, the encoded
  changelog block, its compressed copy); interpreter and thread stacks add a few MiB.
  Measured RSS growth minus the limit: 4.7 MiB (4 stores), 7 (8), 10.4 (16), 13.7-20 (32)
  writing round-robin.
* glibc's dynamic mmap threshold keeps freed 2 MiB memtable arena blocks resident in the heap
  (freed, reused, but counted in RSS). Writing the stores one after another it adds ~1 MiB per
  store: growth minus limit 12 MiB (8 stores), 20-26 (16), 37-46 (32). With the threshold pinned
  (MALLOC_MMAP_THRESHOLD_=131072) the same runs measure 8 (16 stores) and 13.6 (32): the rest is
  the allocator, not the store. jemalloc or malloc_trim would recover it.

So the bound under the default allocator is limit + 16 MiB + 1.5 MiB per store (for 16 stores:
104 MiB; measured 74-90), and with the threshold pinned limit + 8 MiB + 0.5 MiB per store (16
stores: 80 MiB; measured 69-72). Before the memtable-flush fix in store/rocks.py the write buffers
reached 84 MiB of their 32 MiB budget and the cache 86 MiB of 64: the cache and write-buffer
assertions below catch that reliably, the RSS ones catch gross leaks.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

MiB = 1 << 20
REPO = Path(__file__).resolve().parents[2]

LIMIT_MB = 64
FIXED_OVERHEAD = 16 * MiB
PER_STORE_OVERHEAD = int(1.5 * MiB)
TIGHT_FIXED_OVERHEAD = 10 * MiB  # 8 MiB was exceeded by 0.6 MiB once under a loaded make test (2 xdist workers + Spark)
TIGHT_PER_STORE_OVERHEAD = MiB // 2
CACHE_SLACK = 4 * MiB
"""The LRU cache is not strict: pinned L0 index/filter blocks and the write buffer manager's dummy
entries are inserted even when full. Measured overshoot: at most 2.2 MiB."""
WRITE_BUFFER_SLACK = 8 * MiB
"""Memtables are sampled between batches; flushes started asynchronously by relief are still
counted until they finish. Measured: at most 5 MiB over the budget (4 stores x 64 MiB)."""


def run_probe(
    tmp_path: Path,
    *,
    stores: int,
    mb_per_store: int,
    order: str,
    env: dict[str, str] | None = None,
    limit_from_env: bool = False,
) -> dict[str, Any]:
    args = [
        sys.executable, "-m", "tests.store.helpers.memory_probe",
        "--stores", str(stores), "--mb-per-store", str(mb_per_store), "--order", order,
        "--root", str(tmp_path / "ckpt"), "--work", str(tmp_path / "work"),
    ]  # fmt: skip
    full_env = {**os.environ, **(env or {})}
    if limit_from_env:
        full_env["STATEKEEPER_MEMORY_MB"] = str(LIMIT_MB)
    else:
        args += ["--limit-mb", str(LIMIT_MB)]
        full_env.pop("STATEKEEPER_MEMORY_MB", None)
    # A hang here used to be the symptom of write stalls waiting on idle stores' memtables.
    proc = subprocess.run(args, check=False, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"memory probe failed:\n{proc.stdout}\n{proc.stderr}"
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def check_bounded(r: dict[str, Any], fixed: int, per_store: int) -> None:
    limit = LIMIT_MB * MiB
    assert r["limit"] == limit
    assert r["written_bytes"] >= 5 * limit, "the probe must write several times the limit"
    assert r["mismatches"] == 0
    assert r["scanned"] == r["scan_expected"]
    summary = {k: (round(v / MiB, 1) if isinstance(v, int) and v > MiB else v) for k, v in r.items()}
    assert r["cache_usage_max"] <= r["cache_capacity"] + CACHE_SLACK, summary
    assert r["write_buffer_usage_max"] <= r["write_buffer_size"] + WRITE_BUFFER_SLACK, summary
    bound = limit + fixed + per_store * r["stores"]
    growth = r["rss_peak"] - r["rss_before"]
    assert growth <= bound, f"RSS grew {growth / MiB:.1f} MiB, bound {bound / MiB:.1f} MiB: {summary}"


def test_many_stores_written_round_robin_stay_within_limit(tmp_path: Path) -> None:
    """16 stores x 24 MiB (6x the limit), every memtable live at once."""
    r = run_probe(tmp_path, stores=16, mb_per_store=24, order="round-robin")
    check_bounded(r, FIXED_OVERHEAD, PER_STORE_OVERHEAD)


def test_idle_stores_do_not_hold_memory_or_stall_writers(tmp_path: Path) -> None:
    """Stores written one after another: the memory sits in idle stores RocksDB never flushes by
    itself; a write stall would wait for them forever. The limit comes from STATEKEEPER_MEMORY_MB."""
    r = run_probe(tmp_path, stores=16, mb_per_store=24, order="sequential", limit_from_env=True)
    check_bounded(r, FIXED_OVERHEAD, PER_STORE_OVERHEAD)


def test_store_overhead_without_allocator_retention(tmp_path: Path) -> None:
    """With glibc's mmap threshold pinned, what remains over the limit is the store's own overhead."""
    r = run_probe(tmp_path, stores=16, mb_per_store=24, order="sequential", env={"MALLOC_MMAP_THRESHOLD_": "131072"})
    check_bounded(r, TIGHT_FIXED_OVERHEAD, TIGHT_PER_STORE_OVERHEAD)


@pytest.mark.slow
@pytest.mark.parametrize("order", ["round-robin", "sequential"])
def test_32_stores_at_20x_the_limit(tmp_path: Path, order: str) -> None:
    """32 stores x 40 MiB: 1.25 GiB through a 64 MiB limit."""
    r = run_probe(tmp_path, stores=32, mb_per_store=40, order=order)
    check_bounded(r, FIXED_OVERHEAD, PER_STORE_OVERHEAD)


def test_store_dropped_without_close_frees_its_db(tmp_path: Path) -> None:
    """The memtable registry must not keep a forgotten store's DB open (memory, files, its LOCK)."""
    from statekeeper.store import StateStore, StoreConfig
    from statekeeper.store.rocks import forget_collected_stores, shared_memory

    config = StoreConfig(local_dir=str(tmp_path / "work"))

    def use_and_forget() -> None:
        s = StateStore(str(tmp_path / "ckpt"), "mem", 0, config=config).load(0)
        s.put(b"k", b"v")

    tracked_before = len(shared_memory().memtables)  # other tests' stores may be open too
    use_and_forget()
    gc.collect()
    forget_collected_stores()  # the finalizer only queues (it may run while the registry is locked)
    assert len(shared_memory().memtables) == tracked_before, "a collected store is still tracked"
    with StateStore(str(tmp_path / "ckpt"), "mem", 0, config=config) as again:
        again.load(0)  # the same local DB directory: fails with a RocksDB lock error if still open


def test_collector_finalizer_never_blocks_on_the_registry_lock(tmp_path: Path) -> None:
    """The garbage collector may finalize a forgotten store while this thread holds the registry lock
    (e.g. inside untrack_memtables); a finalizer that took the lock deadlocked the whole process."""
    import threading

    from statekeeper.store import StateStore, StoreConfig, rocks

    store = StateStore(str(tmp_path / "ckpt"), "mem", 1, config=StoreConfig(local_dir=str(tmp_path / "w")))
    store.load(0)
    finalizer = rocks.shared_memory().owners[id(store)]

    def finalize_under_lock() -> None:
        with rocks._lock:
            finalizer()

    t = threading.Thread(target=finalize_under_lock, daemon=True)
    t.start()
    t.join(timeout=10)
    assert not t.is_alive(), "the finalizer blocked on the registry lock"
    rocks.forget_collected_stores()
    assert all(k[0] != id(store) for k in rocks.shared_memory().memtables)
    store.close()


def test_a_long_running_query_does_not_keep_every_commit_record(tmp_path: Path) -> None:
    """A driver writes a commit record per batch and a store given no checkpoint id reads one per load; a
    query runs for months, so neither may keep every record it saw (each names every partition's id): they
    did, found by tracing the soak's allocations (tracemalloc). Python's own allocations after 600 more
    batches stay where they were after the first 100, within a few cached records (and the lineage a store
    with no snapshot to start from carries back to version 1)."""
    import tracemalloc

    from statekeeper.store import CommitLog, StateStore, StoreConfig
    from statekeeper.store.layout import new_checkpoint_id

    root = str(tmp_path / "ckpt")
    other_partitions = [new_checkpoint_id() for _ in range(63)]  # a record as a 64-partition query writes it
    with StateStore(root, "agg", 0, config=StoreConfig(local_dir=str(tmp_path / "w"))) as store:
        driver = CommitLog(store.fm)

        def batches(first: int, last: int) -> None:
            for version in range(first, last + 1):
                store.load(version - 1)  # the id from the commit record, as an executor given none reads it
                store.put(b"key", b"%d" % version)
                driver.commit(version, {"agg": [store.commit().checkpoint_id, *other_partitions]})

        tracemalloc.start()
        try:
            batches(1, 100)
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            batches(101, 700)
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    # Keeping every record: ~5.5 KiB per record per log, 600 x 2 logs = ~6.6 MiB.
    assert grown < 512 * 1024, f"Python memory grew {grown / 1024:.0f} KiB over 600 batches"
