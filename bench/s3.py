"""What do S3's requests cost: batched deletes, commits and cold loads on S3 (moto) vs local disk?

S3 checkpoint location on a local S3 endpoint (moto's server in its own process), same run:

1. Deleting N objects (100k): one DeleteObject request per object, serially, as a naive cleanup
   would, vs `S3FileManager.delete_many` (DeleteObjects batches of 1000 keys, 8 in parallel). The
   same N objects are created before each side (with a thread pool, not timed); both sides talk to
   the same server through botocore with the same settings.
2. Commit latency of the state store on S3 vs on local disk for the same workload: micro-batches of
   10k random updates (`put_batch`, 16-byte keys, 64-byte values), `commit()` timed alone and with
   the driver's commit record, 20 batches per backend, p50 / p99.
3. A cold load of the last of those versions (every changelog replayed), its changelogs read in turn vs
   read ahead (`StoreConfig.read_ahead`), on both backends.

moto keeps objects in memory and answers each request in Python, so absolute S3 figures are those
of a local emulator, not of AWS; the ratios compare request patterns on the same server.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import statistics
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from bench.report import Table
from statekeeper.store.commit_log import CommitLog
from statekeeper.store.files.read_ahead import READ_AHEAD
from statekeeper.store.files.s3 import S3FileManager
from statekeeper.store.state_store import StateStore, StoreConfig
from testkit.s3 import emulator_env, moto_server, s3_client

log = logging.getLogger("bench.s3")

DELETE_TARGET = 20.0  # serial time / batched time
OPERATOR = "bench"


@dataclass(frozen=True)
class Sizes:
    objects: int
    updates: int
    batches: int
    keyspace: int


FULL = Sizes(objects=100_000, updates=10_000, batches=20, keyspace=200_000)
QUICK = Sizes(objects=2_000, updates=2_000, batches=5, keyspace=20_000)


def _client(endpoint: str, pool: int = 32) -> Any:
    retries = {"mode": "standard", "total_max_attempts": 8}
    return s3_client(endpoint, retries=retries, max_pool_connections=pool)


def _populate(client: Any, bucket: str, keys: list[str]) -> float:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(32) as pool:
        for _ in pool.map(lambda k: client.put_object(Bucket=bucket, Key=k, Body=b""), keys, chunksize=64):
            pass
    return time.perf_counter() - t0


def _count(client: Any, bucket: str) -> int:
    n = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        n += len(page.get("Contents", []))
    return n


def bench_delete(endpoint: str, n: int) -> Table:
    client = _client(endpoint)
    bucket = f"bench-delete-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    paths = [f"state/bench/{i % 100:05d}/changelogs/{i:020d}_{uuid.uuid4().hex}.changelog" for i in range(n)]
    keys = [f"ckpt/{p}" for p in paths]

    log.info("creating %d objects for the serial delete", n)
    populate_serial = _populate(client, bucket, keys)
    log.info("created in %.1fs; deleting one request per object", populate_serial)
    t0 = time.perf_counter()
    for k in keys:
        client.delete_object(Bucket=bucket, Key=k)
    serial = time.perf_counter() - t0
    assert _count(client, bucket) == 0

    log.info("creating %d objects for delete_many", n)
    populate_batched = _populate(client, bucket, keys)
    fm = S3FileManager(f"s3://{bucket}/ckpt", endpoint_url=endpoint)
    t0 = time.perf_counter()
    result = fm.delete_many(paths)
    batched = time.perf_counter() - t0
    assert not result.errors and len(result.deleted) == n
    assert _count(client, bucket) == 0
    client.delete_bucket(Bucket=bucket)

    ratio = serial / batched
    return Table(
        title=f"Deleting {n:,} objects on a local S3 endpoint (moto): serial DeleteObject vs delete_many",
        columns=["method", "objects", "requests", "seconds", "objects/s", "speedup", "target", "met"],
        rows=[
            ["serial DeleteObject, one per object", n, n, round(serial, 2), round(n / serial), 1.0, "", ""],
            [
                "delete_many: DeleteObjects x1000 keys, 8 parallel",
                n,
                -(-n // 1000),
                round(batched, 2),
                round(n / batched),
                round(ratio, 1),
                f">= {DELETE_TARGET:.0f}x",
                "yes" if ratio >= DELETE_TARGET else "NO",
            ],
        ],
        notes=[
            f"Same {n:,} keys (checkpoint-like names) created before each side with 32 threads, not timed "
            f"({populate_serial:.0f}s and {populate_batched:.0f}s).",
            "Both sides: botocore over HTTP to one moto server process on 127.0.0.1, standard retries; the "
            "bucket is listed empty after each side.",
            "moto handles requests in one Python process, so the parallel side is bounded by the server's CPU "
            "share; against AWS the batched side also saves 1000x the request charges.",
        ],
    )


def _workload(sizes: Sizes, seed: int) -> list[tuple[list[bytes], list[bytes]]]:
    rng = random.Random(seed)
    batches = []
    for _ in range(sizes.batches + 1):  # the first batch is a warm-up, not counted
        ks = [rng.randrange(sizes.keyspace).to_bytes(16, "big") for _ in range(sizes.updates)]
        batches.append((ks, [rng.randbytes(64) for _ in ks]))
    return batches


def _commit_latencies(root: str | S3FileManager, work: str, batches: list[tuple[list[bytes], list[bytes]]]) -> Any:
    store = StateStore(root, OPERATOR, 0, config=StoreConfig(local_dir=work))
    commit_log = CommitLog(store.fm)
    commit_ms: list[float] = []
    total_ms: list[float] = []
    try:
        store.load(0)
        for i, (ks, vs) in enumerate(batches):
            store.put_batch(ks, vs)
            t0 = time.perf_counter()
            result = store.commit()
            t1 = time.perf_counter()
            commit_log.commit(result.version, {OPERATOR: [result.checkpoint_id]})
            t2 = time.perf_counter()
            if i > 0:
                commit_ms.append((t1 - t0) * 1000)
                total_ms.append((t2 - t0) * 1000)
            store.load(result.version, result.checkpoint_id)
        size = result.metrics.changelog_bytes
    finally:
        store.close()
    return commit_ms, total_ms, size, (result.version, result.checkpoint_id)


def _cold_load_ms(root: str | S3FileManager, work: str, target: tuple[int, str], read_ahead: int) -> float:
    """A fresh store in an empty directory (a restarted task) loads `target`: every changelog replayed."""
    shutil.rmtree(work, ignore_errors=True)
    store = StateStore(root, OPERATOR, 0, config=StoreConfig(local_dir=work, read_ahead=read_ahead))
    try:
        t0 = time.perf_counter()
        store.load(*target)
        return (time.perf_counter() - t0) * 1000
    finally:
        store.close()


def bench_cold_load(roots: dict[str, tuple[str | S3FileManager, tuple[int, str]]], work: str, repeats: int) -> Table:
    """Cold loads with and without read-ahead, alternated on each backend: median of `repeats` each."""
    rows = []
    for name, (root, target) in roots.items():
        times: dict[int, list[float]] = {0: [], READ_AHEAD: []}
        for _ in range(repeats):
            for depth, taken in times.items():
                taken.append(_cold_load_ms(root, os.path.join(work, "cold"), target, depth))
        off, on = (statistics.median(times[d]) for d in (0, READ_AHEAD))
        rows.append([name, target[0], round(off, 1), round(on, 1), round(off / on, 2)])
    return Table(
        title="Cold load replaying every changelog, read in turn vs read ahead (ms, median)",
        columns=["checkpoint location", "changelogs replayed", "read in turn", f"{READ_AHEAD} read ahead", "speedup"],
        rows=rows,
        notes=[
            "The commit table's checkpoint: each load is a fresh StateStore in an empty directory loading its last "
            "version, with no snapshot, so it replays every changelog (`StoreConfig.read_ahead` 0 vs the default).",
            f"The two settings alternate, {repeats} loads each; the local changelogs are in the page cache, so "
            "there read-ahead only adds threads; on S3 it keeps that many GETs in flight.",
        ],
    )


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def bench_commit(endpoint: str, sizes: Sizes) -> tuple[Table, Table]:
    client = _client(endpoint)
    bucket = f"bench-commit-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    batches = _workload(sizes, seed=7)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-s3-") as tmp:
        local = _commit_latencies(os.path.join(tmp, "ckpt"), os.path.join(tmp, "w-local"), batches)
        fm = S3FileManager(f"s3://{bucket}/ckpt", endpoint_url=endpoint)
        s3 = _commit_latencies(fm, os.path.join(tmp, "w-s3"), batches)
        roots: dict[str, tuple[str | S3FileManager, tuple[int, str]]] = {
            "local disk": (os.path.join(tmp, "ckpt"), local[3]),
            "S3 (moto, 127.0.0.1)": (fm, s3[3]),
        }
        loads = bench_cold_load(roots, tmp, 3 if sizes is QUICK else 7)
    for name, (commit_ms, total_ms, size, _) in (("local disk", local), ("S3 (moto, 127.0.0.1)", s3)):
        rows.append(
            [
                name,
                len(commit_ms),
                size,
                round(_pct(commit_ms, 0.5), 1),
                round(_pct(commit_ms, 0.99), 1),
                round(statistics.fmean(commit_ms), 1),
                round(_pct(total_ms, 0.5), 1),
                round(_pct(total_ms, 0.99), 1),
            ]
        )
    ratio = _pct(s3[0], 0.5) / _pct(local[0], 0.5)
    commits = Table(
        title=f"Commit latency, S3 vs local: {sizes.updates:,} updates per batch, {sizes.batches} batches (ms)",
        columns=[
            "checkpoint location",
            "batches",
            "changelog bytes",
            "commit p50",
            "commit p99",
            "commit mean",
            "+ commit record p50",
            "+ commit record p99",
        ],
        rows=rows,
        notes=[
            f"Same batches both sides: `put_batch` of {sizes.updates:,} random 16-byte keys from a "
            f"{sizes.keyspace:,}-key space with 64-byte random values, then `commit()` (seal, compress, publish "
            "the changelog: local = fsync, hard link of the sealed file, fsync dir; "
            "S3 = one PutObject with If-None-Match).",
            "'+ commit record' adds the driver's exclusive commit record (CommitLog.commit) to the same timing.",
            f"S3 / local commit p50 = {ratio:.1f}x; one warm-up batch per backend is not counted; with "
            f"{sizes.batches} batches the p99 is the slowest batch.",
        ],
    )
    return commits, loads


def run(quick: bool) -> list[Table]:
    sizes = QUICK if quick else FULL
    logging.getLogger("statekeeper.store").setLevel(logging.WARNING)
    with emulator_env(), moto_server() as endpoint:
        commit, loads = bench_commit(endpoint, sizes)
        delete = bench_delete(endpoint, sizes.objects)
    return [delete, commit, loads]
