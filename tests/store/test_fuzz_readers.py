"""Bad input into every reader of a persisted format is refused, loudly and harmlessly (DESIGN
invariants 7 and 9).

Real files are written by the product (changelogs, snapshot manifests, commit records through a
short history; a schema record as the typed state stores it), then fed to their readers truncated
at every kind of length, with bits flipped, with random bytes after an intact magic, and as random
bytes (and an SST block holding bytes RocksDB will not ingest). Each must be refused with the reader's own error
naming the file (or the state variable), never another exception; a reader never executes anything (the formats
hold no pickle) and never deletes (the root's listing is unchanged after the run). The number of inputs fed is
counted (`tests/model_steps.py` FUZZED) for docs/reliability.md.
"""

from __future__ import annotations

import io
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import rocksdict as rd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_builds import create_snapshots
from statekeeper.store.commit_log import CommitLog
from statekeeper.store.config import StoreConfig
from statekeeper.store.errors import CheckpointError, CorruptFileError
from statekeeper.store.files import open_file_manager
from statekeeper.store.formats.changelog import ChangelogHeader, ChangelogReader, ChangelogWriter
from statekeeper.store.formats.commit import FORMAT_VERSION as COMMIT_FORMAT
from statekeeper.store.formats.commit import MAGIC as COMMIT_MAGIC
from statekeeper.store.formats.commit import CommitRecord
from statekeeper.store.formats.framing import decode_whole_frame, encode_frame
from statekeeper.store.formats.snapshot import SnapshotManifest
from statekeeper.store.formats.typed_scalars import CorruptStateError
from statekeeper.store.formats.typed_schema import parse_ddl
from statekeeper.store.layout import StoreId, new_checkpoint_id
from statekeeper.store.spark.schemas import SCHEMA_PREFIX, STATE_META_PREFIX, VariableRecord, read_record, schema_key
from statekeeper.store.state_store import StateStore
from tests.model_steps import FUZZED
from tests.reliability.scenarios import write_batches

MUTATIONS_PER_FILE = 60


def read_changelog(data: bytes, name: str) -> None:
    reader = ChangelogReader(io.BytesIO(data), name)
    reader.check_footer()
    for _ in reader.entries(None):  # record blocks decoded, SST blocks checked
        pass


READERS: dict[str, tuple[str, Callable[[bytes, str], object]]] = {
    "changelog": (".changelog", read_changelog),
    "snapshot manifest": (".manifest", SnapshotManifest.from_bytes),
    "commit record": (".commit", CommitRecord.from_bytes),
}


def mutations(data: bytes, rng: random.Random) -> Iterator[bytes]:
    """Truncations, bit flips, random tails after the magic, random files."""
    yield b""
    for cut in {1, 3, 7, len(data) // 2, len(data) - 1, *(rng.randrange(len(data)) for _ in range(10))}:
        if 0 <= cut < len(data):
            yield data[:cut]
    for _ in range(MUTATIONS_PER_FILE // 2):
        buf = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        yield bytes(buf)
    for _ in range(5):
        yield data[:8] + rng.randbytes(rng.randint(0, 200))
        yield rng.randbytes(rng.randint(1, 400))


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("fuzz")
    root = str(base / "root")
    write_batches(root, str(base / "work"), 4, losing=True)
    with StateStore(root, "bulk", 0) as bulk:  # a changelog with an SST block, as a rescale writes
        bulk.load(0)
        bulk.put_sorted((b"a%04d" % i, b"v" * 20) for i in range(500))
        bulk.put(b"z", b"after")
        bulk.commit()
    create_snapshots(
        open_file_manager(root), MaintenanceSettings(snapshot_threshold=2, work_dir=str(base / "maintenance"))
    )
    return base / "root"


@pytest.mark.parametrize("kind", sorted(READERS))
def test_reader_refuses_bad_bytes_naming_the_file(kind: str, written: Path) -> None:
    suffix, reader = READERS[kind]
    fm = open_file_manager(str(written))
    before = [(i.path, i.size) for i in fm.list()]
    files = [p for p, _ in before if p.endswith(suffix)]
    assert files, f"no {kind} written"
    rng = random.Random(kind)
    fed = 0
    for path in files:
        data = fm.read_bytes(path)
        reader(data, path)  # the intact file reads
        for bad in mutations(data, rng):
            if bad == data:
                continue
            fed += 1
            try:
                reader(bad, path)
            except CheckpointError as e:
                assert path in str(e), f"{kind}: the error does not name the file: {e}"
            else:
                pytest.fail(f"{kind} {path}: a damaged copy was accepted ({len(bad)} of {len(data)} bytes)")
    assert [(i.path, i.size) for i in fm.list()] == before, "reading bad input changed the checkpoint"
    FUZZED[kind] += fed


MALFORMED_COMMIT_FIELDS: list[dict[str, Any]] = [
    {"copied_from": {"op": "3"}},
    {"copied_from": {"op": [1]}},
    {"copied_from": {"op": -1}},
    {"copied_from": {"op": True}},
    {"copied_from": {"op": 10**6}},  # a version at or above the record's own: a rollback copies an older one
    {"copied_from": ["op", 1]},
    {"in_place": {"op": "0,1"}},
    {"in_place": {"op": [None]}},
    {"layouts": {"op": {"partitions": "many", "max_key_groups": 8}}},
    {"layouts": {"op": {"partitions": 3}}},
    {"batch_id": -2},
    {"batch_id": "7"},
    {"operators": {"op": [1, 2]}},
]


@pytest.mark.parametrize("fields", MALFORMED_COMMIT_FIELDS, ids=repr)
def test_commit_record_with_well_framed_but_malformed_fields_is_refused(fields: dict[str, Any], written: Path) -> None:
    """The checksum passes (the record is re-framed), so only the field checks stand between a bad
    record and the batch history, the reader and rescale."""
    fm = open_file_manager(str(written))
    path = next(i.path for i in fm.list() if i.path.endswith(".commit"))
    payload = decode_whole_frame(fm.read_bytes(path), COMMIT_MAGIC, COMMIT_FORMAT, path)
    bad = encode_frame(COMMIT_MAGIC, COMMIT_FORMAT, {**payload, **fields})
    with pytest.raises(CorruptFileError) as e:
        CommitRecord.from_bytes(bad, path)
    assert path in str(e.value)
    FUZZED["commit record"] += 1


class Meta:
    """The meta column family as `read_record` sees it (get, items by prefix), holding given bytes."""

    def __init__(self, entries: dict[bytes, bytes]) -> None:
        self.entries = entries

    def get(self, key: bytes) -> bytes | None:
        return self.entries.get(key)

    def items(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return iter(sorted((k, v) for k, v in self.entries.items() if k.startswith(prefix)))


def test_schema_record_refuses_bad_bytes_naming_the_variable() -> None:
    schema = parse_ddl("count BIGINT, label STRING")
    record = VariableRecord(kind="value", schema_id=1, user_key_schema=parse_ddl("id INT"))
    good = {
        STATE_META_PREFIX + b"clicks": record.payload(),
        schema_key("clicks", 1): json.dumps(schema.json_value()).encode(),
    }
    assert read_record(cast(Any, Meta(good)), "clicks") is not None
    rng = random.Random("schema")
    fed = 0
    for key, data in good.items():
        for bad in mutations(data, rng):
            if bad == data:
                continue
            fed += 1
            try:
                read_record(cast(Any, Meta({**good, key: bad})), "clicks")
            except CorruptStateError as e:
                assert "clicks" in str(e), f"the error does not name the state variable: {e}"
            # accepting is allowed here: a schema record has no checksum, and a flipped bit in a
            # JSON string can still be a valid record; it must never raise anything else
    assert SCHEMA_PREFIX
    FUZZED["schema record"] += fed


@given(sst=st.binary(max_size=200) | st.sampled_from([b"", b"\x00" * 4096]))
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
def test_an_sst_block_rocksdb_will_not_ingest_fails_the_load_naming_the_changelog(
    tmp_path_factory: pytest.TempPathFactory, sst: bytes
) -> None:
    """A well-framed changelog whose SST block (its CRC right) holds no SST: RocksDB's bare `Exception` escaped the
    load, naming nothing (rocksdict has no exception classes)."""
    tmp = tmp_path_factory.mktemp("sst-block")
    fm = open_file_manager(str(tmp / "root"))
    (tmp / "block.sst").write_bytes(sst)
    cid = new_checkpoint_id()
    writer = ChangelogWriter(str(tmp / "c"), ChangelogHeader("agg", 0, 1, cid, ()))
    writer.append_sst("default", str(tmp / "block.sst"), 1)
    writer.finish()
    fm.put_file(str(tmp / "c"), StoreId("agg", 0).changelog(1, cid))
    CommitLog(fm).commit(1, {"agg": [cid]})
    with (
        StateStore(fm, "agg", 0, config=StoreConfig(local_dir=str(tmp / "w"))) as s,
        pytest.raises(CorruptFileError, match="SST block") as ei,
    ):
        s.load(1)
    assert StoreId("agg", 0).changelog(1, cid) in str(ei.value)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(extra=st.integers(1, 2**64 - 1))
def test_an_sst_block_claiming_more_records_than_bytes_fails_the_load_naming_the_changelog(
    tmp_path_factory: pytest.TempPathFactory, extra: int
) -> None:
    """A real SST block whose header (its CRC right) claims more records than its file has bytes: the count reached
    the load's replayed-records metric, and Spark's progress, as it stood."""
    tmp = tmp_path_factory.mktemp("sst-count")
    fm = open_file_manager(str(tmp / "root"))
    sst = tmp / "block.sst"
    w = rd.SstFileWriter(rd.Options(raw_mode=True))
    w.open(str(sst))
    w[b"k"] = b"v"
    w.finish()
    size = sst.stat().st_size
    cid = new_checkpoint_id()
    writer = ChangelogWriter(str(tmp / "c"), ChangelogHeader("agg", 0, 1, cid, ()))
    writer.append_sst("default", str(sst), min(size + extra, 2**64 - 1))
    writer.finish()
    fm.put_file(str(tmp / "c"), StoreId("agg", 0).changelog(1, cid))
    CommitLog(fm).commit(1, {"agg": [cid]})
    with (
        StateStore(fm, "agg", 0, config=StoreConfig(local_dir=str(tmp / "w"))) as s,
        pytest.raises(CorruptFileError, match=r"claims \d+ records") as ei,
    ):
        s.load(1)
    assert StoreId("agg", 0).changelog(1, cid) in str(ei.value)
