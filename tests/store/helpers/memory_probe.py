"""Memory probe, run as its own process so the process-wide RocksDB memory limit can be set fresh.

    python -m tests.store.helpers.memory_probe --limit-mb 64 --stores 16 --mb-per-store 24 --root DIR

Opens `--stores` store instances under one checkpoint root, writes `--mb-per-store` MiB of values into
each in batches (interleaved across the stores, so every memtable is live at once), reads some back,
commits, and prints one JSON line with RSS samples and the shared block cache usage.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time

import psutil

from statekeeper.store import CommitLog, MemoryLimits, StateStore, StoreConfig, configure_memory
from statekeeper.store.rocks import peak_rss, reset_peak_rss, shared_memory

VALUE_SIZE = 1024


def value_for(store: int, i: int) -> bytes:
    """1 KiB, distinct per key, compressible (so the disk and CPU cost stay small while the
    memtables still hold the full uncompressed bytes)."""
    head = f"{store:04d}:{i:012d}:".encode()
    return (head * (VALUE_SIZE // len(head) + 1))[:VALUE_SIZE]


def key_for(i: int) -> bytes:
    return b"key-%012d" % i


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--limit-mb", type=int, help="configure_memory(); default: the STATEKEEPER_MEMORY_MB variable")
    p.add_argument("--stores", type=int, required=True)
    p.add_argument("--mb-per-store", type=int, required=True)
    p.add_argument("--batch-kb", type=int, default=512)
    p.add_argument("--reads", type=int, default=20_000)
    p.add_argument(
        "--order",
        choices=("round-robin", "sequential"),
        default="round-robin",
        help="round-robin: every store's memtable is live at once; sequential: one store after another, "
        "so the memory is held by idle stores that RocksDB itself never flushes",
    )
    p.add_argument("--root", required=True)
    p.add_argument("--work", required=True)
    args = p.parse_args(argv)

    proc = psutil.Process()
    if args.limit_mb is not None:
        configure_memory(MemoryLimits(total_bytes=args.limit_mb << 20))
    mem = shared_memory()
    limit = mem.limits.total_bytes
    gc.collect()
    hwm_reset = reset_peak_rss()
    rss_before = proc.memory_info().rss

    stores = [
        StateStore(args.root, "mem", p, config=StoreConfig(local_dir=os.path.join(args.work, f"p{p}"))).load(0)
        for p in range(args.stores)
    ]
    rss_opened = proc.memory_info().rss

    per_batch = max(1, (args.batch_kb << 10) // VALUE_SIZE)
    per_store = (args.mb_per_store << 20) // VALUE_SIZE
    peak = rss_opened
    max_cache = mem.cache.get_usage()
    max_wbm = mem.write_buffer_manager.get_usage()
    t0 = time.perf_counter()
    starts = range(0, per_store, per_batch)
    if args.order == "round-robin":
        plan = [(start, s_idx) for start in starts for s_idx in range(args.stores)]
    else:
        plan = [(start, s_idx) for s_idx in range(args.stores) for start in starts]
    for start, s_idx in plan:
        n = min(per_batch, per_store - start)
        stores[s_idx].put_batch(
            [key_for(i) for i in range(start, start + n)], [value_for(s_idx, i) for i in range(start, start + n)]
        )
        max_cache = max(max_cache, mem.cache.get_usage())
        max_wbm = max(max_wbm, mem.write_buffer_manager.get_usage())
        if s_idx == 0:
            peak = max(peak, proc.memory_info().rss)
    write_s = time.perf_counter() - t0

    rng = random.Random(7)
    t0 = time.perf_counter()
    mismatches = 0
    for _ in range(args.reads // 100):
        s_idx = rng.randrange(args.stores)
        idx = [rng.randrange(per_store) for _ in range(100)]
        got = stores[s_idx].multi_get([key_for(i) for i in idx])
        mismatches += sum(g != value_for(s_idx, i) for g, i in zip(got, idx, strict=True))
        max_cache = max(max_cache, mem.cache.get_usage())
    scan_end = min(per_store, 5000)
    scanned = sum(1 for _ in stores[0].items(start=key_for(0), end=key_for(scan_end)))
    peak = max(peak, proc.memory_info().rss)
    read_s = time.perf_counter() - t0

    results = [s.commit() for s in stores]
    CommitLog(stores[0].fm).commit(1, {"mem": [r.checkpoint_id for r in results]})
    gc.collect()
    rss_after = proc.memory_info().rss
    peak = max(peak, rss_after)
    hwm = peak_rss() if hwm_reset else None
    if hwm is not None:
        peak = max(peak, hwm)
    max_cache = max(max_cache, mem.cache.get_usage())
    out = {
        "limit": limit,
        "stores": args.stores,
        "order": args.order,
        "written_bytes": per_store * VALUE_SIZE * args.stores,
        "rss_before": rss_before,
        "rss_opened": rss_opened,
        "rss_peak": peak,
        "rss_after": rss_after,
        "cache_capacity": limit,  # rocksdict has no getter; the cache is built with exactly this capacity
        "cache_usage_max": max_cache,
        "cache_usage_end": mem.cache.get_usage(),
        "cache_pinned_end": mem.cache.get_pinned_usage(),
        "write_buffer_size": mem.write_buffer_manager.get_buffer_size(),
        "write_buffer_usage_max": max_wbm,
        "peak_from_kernel": hwm is not None,
        "mismatches": mismatches,
        "scanned": scanned,
        "scan_expected": scan_end,
        "write_s": round(write_s, 2),
        "read_s": round(read_s, 2),
    }
    for s in stores:
        s.close()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
