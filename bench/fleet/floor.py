"""The fleet benchmark's baseline: the RocksDB work a maintainer cannot avoid per store-commit, on raw rocksdict.

One store of `keys` keys; per commit, `updates` random updates written as one batch (what replaying its
changelog writes); every `threshold` commits a flush, a RocksDB checkpoint, the SHA-256 of each new SST
and its copy to an "uploaded" directory (what a snapshot does). No statekeeper code runs: no changelog
format, listing, catalog, leases, expiry or process around it. The CPU (every thread of this process,
RocksDB's flush and compaction threads included) per store-commit is the floor the maintainers' marginal
cost is compared with, measured in the same run: it moves with the machine's speed as they do.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import tempfile
import time
from collections import deque

import rocksdict as rd

from bench.baselines import VALUE_BYTES
from bench.fleet.maintainers import FleetParams


def rocksdict_floor(p: FleetParams, commits: int = 300) -> float:
    """CPU seconds per store-commit of the raw RocksDB work of maintenance (see the module docstring)."""
    from statekeeper.store.rocks import open_db

    work = tempfile.mkdtemp(prefix="statekeeper-floor-")
    rng = random.Random(7)
    keyspace = [b"k%015d" % i for i in range(p.keys)]
    try:
        db = open_db(os.path.join(work, "db"), bulk_replay=True)  # the replicas' options
        try:
            wb = rd.WriteBatch(raw_mode=True)
            deque(map(wb.put, *_batch(keyspace, rng)), maxlen=0)
            db.write(wb)
            db.flush(True)
            uploaded: set[str] = set()
            batches = [_batch(rng.sample(keyspace, p.updates), rng) for _ in range(commits)]  # off the clock
            cpu0 = time.process_time()
            for n, (keys, values) in enumerate(batches, 1):
                wb = rd.WriteBatch(raw_mode=True)
                deque(map(wb.put, keys, values), maxlen=0)  # as a replay writes a block of records
                db.write(wb)
                if n % p.threshold == 0:
                    _snapshot(db, work, n, uploaded)
            return (time.process_time() - cpu0) / commits
        finally:
            db.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _batch(keys: list[bytes], rng: random.Random) -> tuple[list[bytes], list[bytes]]:
    raw = rng.randbytes(VALUE_BYTES * len(keys))
    return keys, [raw[i : i + VALUE_BYTES] for i in range(0, len(raw), VALUE_BYTES)]


def _snapshot(db: rd.Rdict, work: str, n: int, uploaded: set[str]) -> None:
    db.flush(True)
    ckpt = os.path.join(work, f"checkpoint-{n}")
    rd.Checkpoint(db).create_checkpoint(ckpt)
    out = os.path.join(work, "uploaded")
    os.makedirs(out, exist_ok=True)
    for name in sorted(os.listdir(ckpt)):
        if name.endswith(".sst") and name not in uploaded:
            path = os.path.join(ckpt, name)
            with open(path, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
            shutil.copyfile(path, os.path.join(out, digest[:40] + ".sst"))
            uploaded.add(name)
    shutil.rmtree(ckpt)


__all__ = ["rocksdict_floor"]
