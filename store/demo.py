"""The store alone, without Spark or Java: a simulated micro-batch loop on a local checkpoint,
`python -m statekeeper.store.demo` (`make run` runs the Spark example job, examples/session_count.py).

Each batch, every partition loads its committed version, applies counter updates for random users,
commits a changelog, and the "driver" writes the batch's commit record. At the end, fresh store
instances with empty working directories recover every partition from the checkpoint alone and the
result is checked against counts kept in a plain dict.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import statistics
import struct
import tempfile
import time
import zlib

from statekeeper.store import CommitLog, StateStore, StoreConfig

log = logging.getLogger("statekeeper.demo")
COUNT = struct.Struct(">q")


def run(root: str, *, partitions: int, batches: int, rows: int, users: int, seed: int) -> int:
    work = tempfile.mkdtemp(prefix="statekeeper-demo-")
    stores = [
        StateStore(root, "user_counts", p, config=StoreConfig(local_dir=os.path.join(work, f"p{p}")))
        for p in range(partitions)
    ]
    commit_log = CommitLog(stores[0].fm)
    start = commit_log.latest()
    expected: dict[bytes, int] = {}
    if start:
        log.info("resuming from committed version %d in %s", start, root)
        for store in stores:
            expected.update((k, COUNT.unpack(v)[0]) for k, v in store.load(start).items(cf="counts"))
            store.abort()
    latencies = []
    print(f"{'batch':>5} {'rows':>7} {'users':>8} {'commit p50 ms':>14} {'batch ms':>9} {'changelog KiB':>14}")
    for batch in range(start, start + batches):
        rng = random.Random(seed * 1_000_003 + batch)  # reproducible per batch, also after a resume
        t0 = time.perf_counter()
        ids, commit_ms, kib = [], [], 0.0
        by_partition: list[list[bytes]] = [[] for _ in range(partitions)]
        for _ in range(rows):
            user = f"user-{rng.randrange(users):06d}".encode()
            by_partition[zlib.crc32(user) % partitions].append(user)
        for p, store in enumerate(stores):
            store.load(batch)
            counts = store.column_family("counts")
            for user in by_partition[p]:
                old = counts.get(user)
                n = (COUNT.unpack(old)[0] if old else 0) + 1
                counts.put(user, COUNT.pack(n))
                expected[user] = n
            result = store.commit()
            ids.append(result.checkpoint_id)
            commit_ms.append(result.metrics.commit_ms)
            kib += result.metrics.changelog_bytes / 1024
        commit_log.commit(batch + 1, {"user_counts": ids})
        batch_ms = (time.perf_counter() - t0) * 1000
        latencies.append(batch_ms)
        p50 = statistics.median(commit_ms)
        print(f"{batch:>5} {rows:>7} {len(expected):>8} {p50:>14.2f} {batch_ms:>9.1f} {kib:>14.1f}")
    for store in stores:
        store.close()
    shutil.rmtree(work)

    t0 = time.perf_counter()
    recovered: dict[bytes, int] = {}
    final = commit_log.latest()
    for p in range(partitions):
        with StateStore(root, "user_counts", p) as fresh:
            fresh.load(final)
            recovered.update((k, COUNT.unpack(v)[0]) for k, v in fresh.items(cf="counts"))
    recovery_ms = (time.perf_counter() - t0) * 1000
    ok = recovered == expected
    print(
        f"\n{batches} batches, batch p50 {statistics.median(latencies):.1f} ms, max {max(latencies):.1f} ms; "
        f"recovered version {final} ({len(recovered)} users) from {root} with empty working directories "
        f"in {recovery_ms:.0f} ms: {'state matches' if ok else 'STATE DIFFERS'}"
    )
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m statekeeper.store.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default="run/demo-checkpoint", help="checkpoint root (path or URI)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--rows", type=int, default=20_000, help="rows per batch")
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(
        args.checkpoint,
        partitions=args.partitions,
        batches=args.batches,
        rows=args.rows,
        users=args.users,
        seed=args.seed,
    )


if __name__ == "__main__":
    raise SystemExit(main())
