"""The state store's commit / load loop on S3 while the endpoint misbehaves.

Partitions commit changelogs (one large enough for a multipart upload), retried attempts and aborts
happen, the driver commits records, maintenance writes snapshots, fresh executors rebuild from the
checkpoint, all through a proxy that injects 503s, 500s, resets, timeouts and truncated bodies.
Afterwards every committed version of every partition loads and equals a dict model, and the bucket
holds only complete files.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from statekeeper.store import CommitLog, StateStore, StoreConfig
from statekeeper.store.files.s3 import MIN_PART_SIZE, S3FileManager
from statekeeper.store.snapshot import write_snapshot
from testkit.s3 import ALL_FAULTS, FaultProxy, incomplete_uploads, s3_client

OPERATOR = "agg"
PARTITIONS = 2
BATCHES = 12
Model = dict[bytes, bytes]


@pytest.fixture(params=[3, 11], ids=lambda seed: f"seed{seed}")
def proxy(s3_endpoint: str, request: pytest.FixtureRequest) -> Iterator[FaultProxy]:
    with FaultProxy(s3_endpoint, seed=request.param, hang_s=1.5) as p:
        yield p


def content(store: StateStore) -> Model:
    return dict(store.items())


def test_commit_and_load_loop_survives_faults(
    proxy: FaultProxy, s3_endpoint: str, s3_bucket: str, tmp_path: Path
) -> None:
    fm = S3FileManager(
        f"s3://{s3_bucket}/ckpt",
        endpoint_url=proxy.endpoint_url,
        max_attempts=10,
        connect_timeout=1.0,
        read_timeout=1.0,
        list_page_size=7,
        multipart_threshold=MIN_PART_SIZE,
        multipart_part_size=MIN_PART_SIZE,
    )
    rng = random.Random(proxy.seed)
    config = StoreConfig(block_bytes=64 * 1024, max_lineage=4, snapshot_check_interval=3)

    def instance(p: int) -> StateStore:
        return StateStore(fm, OPERATOR, p, config=replace(config, local_dir=tempfile.mkdtemp(dir=tmp_path)))

    stores = [instance(p) for p in range(PARTITIONS)]
    log = CommitLog(fm)
    committed: list[list[tuple[str, Model]]] = [[("", {}) for _ in range(PARTITIONS)]]
    snapshotted: set[tuple[int, int]] = set()
    proxy.set_faults(0.15, ALL_FAULTS)
    try:
        for batch in range(BATCHES):
            v = len(committed) - 1
            winners: list[tuple[str, Model]] = []
            for p in range(PARTITIONS):
                ckpt, state = committed[v][p]
                attempts = 2 if rng.random() < 0.3 else 1  # a retried task: the first attempt loses
                for _attempt in range(attempts):
                    store = stores[p].load(v, ckpt or None)
                    assert content(store) == state
                    if rng.random() < 0.15:  # an aborted attempt: its updates vanish
                        store.put(b"aborted", b"x")
                        store.abort()
                        store = stores[p].load(v, ckpt or None)
                        assert content(store) == state
                    model = dict(state)
                    for _ in range(rng.randint(50, 300)):
                        k = b"k%04d" % rng.randint(0, 999)
                        if rng.random() < 0.2:
                            store.delete(k)
                            model.pop(k, None)
                        else:
                            val = rng.randbytes(rng.randint(0, 64))
                            store.put(k, val)
                            model[k] = val
                    if batch == 3 and p == 0:  # incompressible: the changelog goes multipart
                        big = {b"big%02d" % i: rng.randbytes(256 * 1024) for i in range(24)}
                        store.put_batch(list(big), list(big.values()))
                        model.update(big)
                    result = store.commit()
                    assert result.version == v + 1
                    winner = (result.checkpoint_id, model)
                winners.append(winner)
            log.commit(v + 1, {OPERATOR: [w[0] for w in winners]})
            committed.append(winners)
            sv, sp = rng.randint(1, len(committed) - 1), rng.randrange(PARTITIONS)
            if batch % 4 == 2 and (sv, sp) not in snapshotted:  # maintenance snapshots a committed version
                snapshotted.add((sv, sp))
                maint = instance(sp)
                try:
                    maint.load(sv, committed[sv][sp][0])
                    maint.abort()
                    write_snapshot(fm, maint.store_id, sv, committed[sv][sp][0], maint.db, maint.local_dir)
                finally:
                    maint.close()
            if batch % 3 == 1:  # an executor is lost: a fresh one rebuilds from the checkpoint
                p = rng.randrange(PARTITIONS)
                stores[p].close()
                shutil.rmtree(stores[p].local_dir, ignore_errors=True)
                stores[p] = instance(p)
    finally:
        for s in stores:
            s.close()
    faults = sum(proxy.injected.values())
    assert faults >= 20, proxy.injected
    assert len([k for k in ALL_FAULTS if proxy.injected[k]]) >= 5, proxy.injected
    assert proxy.requests["UploadPart"] >= 2, "the large changelog went multipart"

    # Nothing lost: with the endpoint healthy again, every committed version loads from scratch.
    proxy.set_faults(0.0)
    fresh_log = CommitLog(fm)
    assert fresh_log.latest() == BATCHES
    for v in range(len(committed)):
        for p in range(PARTITIONS):
            checker = instance(p)
            try:
                assert content(checker.load(v)) == committed[v][p][1], f"version {v} partition {p}"
            finally:
                checker.close()
    # No partial object visible: every object is a complete file the store wrote or can read.
    raw: Any = s3_client(s3_endpoint)
    for up in incomplete_uploads(raw, s3_bucket):  # only orphans of a lost CreateMultipartUpload answer
        assert raw.list_parts(Bucket=s3_bucket, Key=up["Key"], UploadId=up["UploadId"]).get("Parts", []) == []
    names = [i.path for i in fm.list()]
    assert all(n.startswith(("commits/", "state/agg/")) for n in names), names
    assert sum(n.startswith("commits/") for n in names) == BATCHES
