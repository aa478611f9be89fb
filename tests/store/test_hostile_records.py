"""The small JSON records outside the framed formats are untrusted checkpoint content too (DESIGN invariant 12):
the Spark driver's batch files and event-time records, and the schema records a state's `__meta` column family
holds. Hostile bodies (nested 100k deep, not an object, fields of the wrong type or out of range, not UTF-8,
longer than any real record) are a `CorruptFileError` naming the file (a `CorruptStateError` naming the state
variable for `__meta`), never a raw RecursionError, KeyError or TypeError. A commit record's version is a claim
too: one far above the rest costs the state reader's history a few reads.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statekeeper.store.batch_history import BatchHistory
from statekeeper.store.commit_log import CommitLog
from statekeeper.store.config import StoreConfig
from statekeeper.store.errors import CorruptFileError, LineageError
from statekeeper.store.files import open_file_manager
from statekeeper.store.formats.commit import CommitRecord
from statekeeper.store.formats.typed_scalars import CorruptStateError
from statekeeper.store.layout import batch_path, commit_path, event_time_path
from statekeeper.store.spark.batch_records import BatchRecords
from statekeeper.store.spark.event_time import WatermarkLog
from statekeeper.store.spark.schemas import (
    GROUPING_KEY,
    META_CF,
    SCHEMA_PREFIX,
    STATE_META_PREFIX,
    VariableRecord,
    read_grouping_key,
    read_record,
)
from statekeeper.store.state_store import StateStore

OP = "agg"
HYPO = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))


def hostile_bodies(fields: tuple[str, ...]) -> st.SearchStrategy[bytes]:
    """Bodies a record reader must refuse: too deep, not an object, wrong or missing fields, huge numbers,
    not UTF-8, longer than any real record, and any of the fields swapped for a hostile value."""
    deep = [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000, b"[" * 3000]
    fixed = [b"", b"null", b"[]", b'"x"', b"1e999999", b"\xff\xfe{", b"{}", b" " * 10_000 + b"{}", *deep]
    bad_values = st.sampled_from([None, "1", 1.5, [1], {"a": 1}, True, 10**30, -(10**30), "9" * 5000])
    swapped = st.tuples(st.sampled_from(fields), bad_values).map(
        lambda kv: ('{"%s": %s}' % (kv[0], __import__("json").dumps(kv[1]))).encode()  # noqa: UP031
    )
    return st.sampled_from(fixed) | swapped | st.binary(max_size=64)


@pytest.fixture
def root(tmp_path: Path) -> str:
    return str(tmp_path / "root")


def plant(root: str, path: str, data: bytes) -> None:
    full = Path(root) / path
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_bytes(data)


@given(body=hostile_bodies(("batch_id", "timestamp_ms", "num_partitions")))
@HYPO
def test_a_hostile_batch_file_is_refused_naming_it(tmp_path_factory: pytest.TempPathFactory, body: bytes) -> None:
    root = str(tmp_path_factory.mktemp("b") / "root")
    plant(root, batch_path(OP, 7), body)
    fm = open_file_manager(root)
    records = BatchRecords(fm, CommitLog(fm), OP)
    for partitions in (True, False):
        try:
            records.intent_partitions(7) if partitions else records.batch_timestamp(7, 4)
        except CorruptFileError as e:
            assert batch_path(OP, 7) in str(e)
        # else: a body that happens to be a valid record (hypothesis' binary may produce one)


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000,
        b'{"batch_id": 7, "timestamp_ms": 1, "num_partitions": 1000000000000}',
        b'{"batch_id": 7, "timestamp_ms": 1}',
        b"[1]",
        b'{"timestamp_ms": 1, "num_partitions": 2}',  # no batch id
        b'{"batch_id": 6, "timestamp_ms": 1, "num_partitions": 2}',  # batch 6's record under batch 7's name
    ],
)
def test_each_batch_file_class_is_refused(root: str, body: bytes) -> None:
    plant(root, batch_path(OP, 7), body)
    fm = open_file_manager(root)
    with pytest.raises(CorruptFileError, match=batch_path(OP, 7)):
        BatchRecords(fm, CommitLog(fm), OP).intent_partitions(7)


@given(body=hostile_bodies(("batch_id", "watermark_ms", "max_event_ms")))
@HYPO
def test_a_hostile_event_time_record_is_refused_naming_it(
    tmp_path_factory: pytest.TempPathFactory, body: bytes
) -> None:
    root = str(tmp_path_factory.mktemp("e") / "root")
    plant(root, event_time_path(OP, 3), body)
    log = WatermarkLog(open_file_manager(root), OP, 1000)
    try:
        log.times(4)
    except CorruptFileError as e:
        assert event_time_path(OP, 3) in str(e)


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000,
        b'{"batch_id": 3, "watermark_ms": "1"}',
        b"{}",
        b"7",
        b'{"batch_id": 2, "watermark_ms": 1}',  # batch 2's record under batch 3's name
    ],
)
def test_each_event_time_class_is_refused(root: str, body: bytes) -> None:
    plant(root, event_time_path(OP, 3), body)
    with pytest.raises(CorruptFileError, match=event_time_path(OP, 3)):
        WatermarkLog(open_file_manager(root), OP, 1000).times(4)


@pytest.mark.parametrize(
    ("key", "body"),
    [
        (STATE_META_PREFIX + b"counts", b"[" * 100_000),
        (STATE_META_PREFIX + b"counts", b"[1, 2]"),
        (STATE_META_PREFIX + b"counts", b'{"kind": "value", "user_key_schema": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
        (SCHEMA_PREFIX + b"counts/\x00\x00\x00\x01", b'{"type":' * 20_000 + b'"long"' + b"}" * 20_000),
        (GROUPING_KEY, b"[" * 100_000),
    ],
)
def test_a_hostile_schema_record_in_meta_is_a_corrupt_state_naming_it(tmp_path: Path, key: bytes, body: bytes) -> None:
    with StateStore(str(tmp_path / "root"), OP, 0, config=StoreConfig(local_dir=str(tmp_path / "w"))) as s:
        s.load(0)
        meta = s.column_family(META_CF)
        meta.put(STATE_META_PREFIX + b"counts", VariableRecord("value").payload())
        meta.put(key, body)
        with pytest.raises(CorruptStateError, match=r"counts|grouping key"):
            if key == GROUPING_KEY:
                read_grouping_key(meta)
            else:
                read_record(meta, "counts")


def test_the_records_the_driver_writes_read_back(root: str) -> None:
    fm = open_file_manager(root)
    log = WatermarkLog(fm, OP, 1000)
    log.record(3, 5_000, None)
    log.record(4, 6_000, 9_000)
    assert log.read(3) == (5_000, None) and log.read(4) == (6_000, 9_000)
    records = BatchRecords(fm, CommitLog(fm), OP)
    stamp = records.batch_timestamp(7, 4)
    assert records.batch_timestamp(7, 8) == stamp and records.intent_partitions(7) == 4
    assert records.intent_partitions(8) is None


@pytest.mark.parametrize(
    "props",
    [
        "[" * 100_000,
        "[1, 2]",
        '{"stateVariables": [1]}',
        '{"stateVariables": [{"stateName": 7, "stateVariableType": "ValueState"}]}',
        '{"stateVariables": [{"stateName": "__meta", "stateVariableType": "ValueState"}]}',
        '{"stateVariables": [{"stateName": "' + "x" * 300 + '", "stateVariableType": "ValueState"}]}',
    ],
)
def test_a_hostile_spark_operator_properties_is_refused_naming_it(props: str) -> None:
    """An import reads Spark's operatorProperties (its state metadata) as untrusted: a variable name must be one
    statekeeper can hold before Spark is asked to read it."""
    from statekeeper.store.spark import spark_checkpoint as sc

    with pytest.raises(CorruptFileError, match=r"operatorProperties.*ckpt/state/0/_metadata"):
        sc._tws_variables(None, "ckpt", 0, 1, sc._operator_properties(props, "ckpt/state/0/_metadata"))  # type: ignore[arg-type]


@pytest.mark.timeout(60)
@given(head=st.integers(10, 10**18))
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
def test_a_commit_record_far_above_the_others_costs_the_history_a_few_reads(
    tmp_path_factory: pytest.TempPathFactory, head: int
) -> None:
    """A well-framed record of version `head` above records 1-3: the state reader's history of batches read ahead
    every version between (a future held for each: a hang, and memory without bound); it reads a few, then names
    the version missing."""
    root = str(tmp_path_factory.mktemp("history") / "root")
    log = CommitLog(open_file_manager(root))
    for v in (1, 2, 3):
        log.commit(v, {OP: ["a" * 32]})
    plant(root, commit_path(head), CommitRecord(head, {OP: ("a" * 32,)}).to_bytes())
    reads = CommitLog(open_file_manager(root))
    counted = reads.get
    calls: list[int] = []

    def get(version: int, *, use_cache: bool = True) -> CommitRecord | None:
        calls.append(version)
        return counted(version, use_cache=use_cache)

    reads.get = get  # type: ignore[method-assign]
    with pytest.raises(LineageError, match=f"version {head - 1} has expired"):
        BatchHistory(reads, OP, root).version_of(1)
    assert len(calls) < 100, len(calls)
