"""Baselines the benchmarks compare statekeeper with, and the shared workload.

- `RawRocks`: rocksdict opened with exactly the options the store uses (`statekeeper.store.rocks.db_options()`,
  `write_options()` with the WAL disabled, the same process-wide block cache / write buffer manager),
  written through the same per-record and WriteBatch calls, with no changelog. The upper bound for
  the store's data path.
- `SnapshotPerCommitStore`: the design the changelog store replaces. Updates go straight into a local
  RocksDB (no WAL); every commit flushes and checkpoints the whole DB (rocksdict `Checkpoint`: memtable
  flush + hard links) and copies every file of the checkpoint to the checkpoint location through the
  same atomic checkpoint file manager the store uses (temp file, fsync, link, fsync dir). Its commit
  cost therefore grows with the size of the state, which is what the commit benchmark shows.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Sequence

import rocksdict as rd

from statekeeper.store.files import LocalFileManager
from statekeeper.store.rocks import db_options, write_options

KEY_BYTES = 16
VALUE_BYTES = 64


def random_keys(n: int, seed: int = 1) -> list[bytes]:
    """`n` distinct uniformly random 16-byte keys (hash-distributed, like grouping keys)."""
    r = random.Random(seed)
    raw = r.randbytes(KEY_BYTES * n)
    keys = [raw[i : i + KEY_BYTES] for i in range(0, KEY_BYTES * n, KEY_BYTES)]
    if len(set(keys)) != n:  # 128-bit collisions: practically impossible, but keep counts exact
        raise AssertionError("duplicate random keys")
    return keys


def sequential_keys(n: int, start: int = 0) -> list[bytes]:
    """`n` 16-byte big-endian counters: keys arriving in key order (e.g. time-ordered ids)."""
    return [i.to_bytes(KEY_BYTES, "big") for i in range(start, start + n)]


def random_values(n: int, seed: int = 2) -> list[bytes]:
    """`n` random (incompressible) 64-byte values."""
    raw = random.Random(seed).randbytes(VALUE_BYTES * n)
    return [raw[i : i + VALUE_BYTES] for i in range(0, VALUE_BYTES * n, VALUE_BYTES)]


class RawRocks:
    """Raw rocksdict with the store's options: the reference for the store's single-op and batch paths."""

    def __init__(self, path: str) -> None:
        self.db = rd.Rdict(path, db_options())
        self.db.set_write_options(write_options())

    def put_batch(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        wb = rd.WriteBatch(raw_mode=True)
        put = wb.put
        for k, v in zip(keys, values, strict=True):
            put(k, v)
        self.db.write(wb)

    def close(self) -> None:
        self.db.close()


class SnapshotPerCommitStore:
    """A store that makes every commit durable by copying a full checkpoint of its RocksDB.

    `version` counts commits; copies live under `<root>/baseline/v<version>/` of the checkpoint root.
    `keep_copies` old copies are kept (the default 1 keeps only the newest, to bound disk use).
    """

    def __init__(self, root: str, local_dir: str, *, keep_copies: int = 1) -> None:
        self.fm = LocalFileManager(root)
        self.local_dir = os.path.abspath(local_dir)
        self.db_dir = os.path.join(self.local_dir, "db")
        self.keep_copies = keep_copies
        self.version = 0
        self._copies: list[str] = []
        self.db: rd.Rdict | None = None
        self.last_commit_bytes = 0

    def open(self) -> SnapshotPerCommitStore:
        """Open (or create) the local DB, passing its column families and options explicitly."""
        os.makedirs(self.local_dir, exist_ok=True)
        cfs: dict[str, rd.Options] = {}
        if os.path.exists(os.path.join(self.db_dir, "CURRENT")):
            cfs = {n: db_options() for n in rd.Rdict.list_cf(self.db_dir, db_options()) if n != "default"}
        self.db = rd.Rdict(self.db_dir, db_options(), column_families=cfs or None)
        self.db.set_write_options(write_options())
        return self

    def adopt_checkpoint_of(self, db: rd.Rdict) -> SnapshotPerCommitStore:
        """Start from a RocksDB checkpoint (hard links) of another DB: the same state, loaded in seconds."""
        if self.db is not None:
            raise RuntimeError("adopt_checkpoint_of() before open()")
        os.makedirs(self.local_dir, exist_ok=True)
        rd.Checkpoint(db).create_checkpoint(self.db_dir)
        return self.open()

    def _db(self) -> rd.Rdict:
        if self.db is None:
            raise RuntimeError("baseline store is not open")
        return self.db

    def put_batch(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        wb = rd.WriteBatch(raw_mode=True)
        put = wb.put
        for k, v in zip(keys, values, strict=True):
            put(k, v)
        self._db().write(wb)

    def get(self, key: bytes) -> bytes | None:
        value: bytes | None = self._db().get(key)
        return value

    def commit(self) -> int:
        """Checkpoint the whole DB and publish a full copy as the next version; returns the version."""
        self.version += 1
        tmp = os.path.join(self.local_dir, f"ckpt-{self.version}")
        rd.Checkpoint(self._db()).create_checkpoint(tmp)  # flushes the memtable, hard-links SST files
        prefix = f"baseline/v{self.version:020d}"
        total = 0
        try:
            for name in sorted(os.listdir(tmp)):
                # A byte copy, as to any remote location (put_file would hard-link on this disk).
                with self.fm.create(f"{prefix}/{name}") as out, open(os.path.join(tmp, name), "rb") as src:
                    shutil.copyfileobj(src, out, 1 << 20)
                total += os.path.getsize(os.path.join(tmp, name))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self.last_commit_bytes = total
        self._copies.append(os.path.join(self.fm.root_path, prefix))
        return self.version

    def drop_old_copies(self) -> None:
        """Delete published copies beyond `keep_copies` (outside any timed region: disk hygiene)."""
        while len(self._copies) > self.keep_copies:
            shutil.rmtree(self._copies.pop(0), ignore_errors=True)

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None
