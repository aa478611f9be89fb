"""The RocksDB floors of `bench spark` do a store's work and no more: their DB and its column family stay open over
the batches, so RocksDB's memtable fills as a store's does, not flushed after every batch (rocksdict flushes a column
family's memtable whenever a Python object for it goes)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from bench.spark_floors import WORK, FloorDB, sync_writes


@pytest.mark.parametrize("kind", sorted(WORK))
def test_a_floor_keeps_its_memtable_over_the_batches(tmp_path: Path, kind: str) -> None:
    db = FloorDB(str(tmp_path / "db"))
    try:
        for batch in range(3):
            keys = [f"user-{i:04d}" for i in range(batch, 300, 3)]
            table = pa.table({"key": keys, "value": pa.array([1] * len(keys), pa.int64())})
            names, counts, totals = WORK[kind](db, table, str.encode, "key", None)
            assert sorted(zip(names, counts, totals, strict=True)) == [(k, 1, 1) for k in keys]
        assert db.cf.property_int_value("rocksdb.num-entries-active-mem-table") == 300
        assert not list((tmp_path / "db").glob("*.sst"))  # nothing was flushed
        names, counts, totals = WORK[kind](db, table, str.encode, "key", None)
        assert sorted(zip(names, counts, totals, strict=True)) == [(k, 2, 2) for k in keys]  # reads what it wrote
    finally:
        db.close()


@pytest.mark.parametrize("kind", sorted(WORK))
def test_a_durable_floor_syncs_exactly_what_it_wrote(tmp_path: Path, kind: str) -> None:
    """The routed floors list every write they make and sync them to a file: one record per touched key, the value
    the DB holds."""
    db = FloorDB(str(tmp_path / "db"))
    try:
        keys = [f"user-{i:04d}" for i in range(50)]
        table = pa.table({"key": keys + keys[:10], "value": pa.array([2] * 60, pa.int64())}).sort_by("key")
        writes: list[tuple[bytes, bytes]] = []
        WORK[kind](db, table, str.encode, "key", writes)
        assert sorted(k for k, _ in writes) == [k.encode() for k in keys]
        assert all(db.cf.get(k) == v for k, v in writes)
        sync_writes(str(tmp_path / "writes"), writes)
        data = (tmp_path / "writes").read_bytes()
        assert len(data) == sum(8 + len(k) + len(v) for k, v in writes)
    finally:
        db.close()
