"""Counts, sizes and depths a checkpoint claims are capped (DESIGN invariant 12, docs/formats.md "Limits"): the
column families a changelog or snapshot makes a store create, the state variables and value schemas a typed state's
`__meta` records and their bytes, and how deep a schema nests (the typed codec recurses per level). Each cap holds
for writers too, so nothing a store writes is refused on reading; past it, a reader refuses naming the file, store
or variable, never a RecursionError or an unbounded load.

The column-family and schema-bytes caps are lowered for these tests (a fault injected: the caps' values, not their
logic): creating 4,096 real RocksDB column families, or 16 MiB of schemas, would take the tests minutes.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statekeeper.store import rocks
from statekeeper.store.column_family import ColumnFamily
from statekeeper.store.commit_log import CommitLog
from statekeeper.store.config import StoreConfig
from statekeeper.store.errors import ConfigurationError, CorruptFileError
from statekeeper.store.files import open_file_manager
from statekeeper.store.formats import changelog as cl
from statekeeper.store.formats.commit import CommitRecord
from statekeeper.store.formats.framing import encode_frame
from statekeeper.store.formats.limits import MAX_SCHEMA_DEPTH, MAX_SCHEMA_VERSIONS, MAX_STATE_VARIABLES
from statekeeper.store.formats.snapshot import SnapshotManifest
from statekeeper.store.formats.typed_scalars import CorruptStateError
from statekeeper.store.formats.typed_schema import (
    DataType,
    Field,
    SchemaError,
    SchemaEvolutionError,
    from_json,
    infer,
    map_of,
    parse_ddl,
    struct,
)
from statekeeper.store.layout import PARTITIONS, StoreId, parse_commit_name, parse_versioned_name
from statekeeper.store.snapshot import write_snapshot
from statekeeper.store.spark import schemas
from statekeeper.store.spark.schemas import (
    META_CF,
    STATE_META_PREFIX,
    ValueFormat,
    VariableRecord,
    read_record,
    recorded_schema_bytes,
    schema_key,
    variable_names,
)
from statekeeper.store.state_store import StateStore

OP = "agg"
CAP = 8


# -- schema depth --------------------------------------------------------------------------------
def _nested(depth: int, kinds: list[str]) -> tuple[DataType | None, Any, str, Any]:
    """A schema of `depth` types (None where construction refuses it), a value of it, its DDL and its Spark JSON,
    each level the kind `kinds` names in turn (struct, array, map: the map's value nests)."""
    typ: DataType | None = DataType("long")
    value: Any = 7
    ddl, doc = "long", cast(Any, "long")
    for i in range(depth - 1):
        kind = kinds[i % len(kinds)]
        if kind == "struct":
            value, ddl = (value,), f"struct<f{i}:{ddl}>"
            doc = {"type": "struct", "fields": [{"name": f"f{i}", "type": doc, "nullable": True, "metadata": {}}]}
        elif kind == "array":
            value, ddl = [value], f"array<{ddl}>"
            doc = {"type": "array", "elementType": doc, "containsNull": True}
        else:
            value, ddl = {"k": value}, f"map<string,{ddl}>"
            doc = {"type": "map", "keyType": "string", "valueType": doc, "valueContainsNull": True}
        if typ is not None and i + 2 <= MAX_SCHEMA_DEPTH:
            if kind == "struct":
                typ = struct(Field(f"f{i}", typ))
            elif kind == "array":
                typ = DataType("array", element=typ)
            else:
                typ = map_of(DataType("string"), typ)
        else:
            typ = None
    return typ, value, ddl, doc


@pytest.mark.timeout(120)  # a codec built twice per level took 2**depth: 1.2 s at 40 mixed levels, hours at 64
@given(
    depth=st.integers(1, MAX_SCHEMA_DEPTH + 40),
    kinds=st.lists(st.sampled_from(["struct", "array", "map"]), min_size=1, max_size=4),
)
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_a_schema_within_the_depth_cap_round_trips_and_one_past_it_is_refused_by_every_reader(
    depth: int, kinds: list[str]
) -> None:
    """The same nested schema as Spark JSON (a checkpoint's record), DDL (a declaration) and a value to infer
    from: within the cap each reads to the same type, whose codec writes and reads a value back, also from an older
    schema of the same shape whose leaf was an int (evolution: projected at every level); past it each is a
    SchemaError naming the cap, never a RecursionError."""
    typ, value, ddl, doc = _nested(depth, kinds)
    readers: dict[str, Callable[[], DataType]] = {
        "json": lambda: from_json(json.dumps(doc)),
        "ddl": lambda: parse_ddl(ddl),
        "inferred": lambda: infer(value, "state variable 'v'"),
    }
    if depth <= MAX_SCHEMA_DEPTH:
        assert typ is not None and typ.depth == depth
        for read in readers.values():
            got = read()
            assert got.depth == depth
        fmt = ValueFormat("v", False)
        fmt.use(1, typ, {1: typ})
        raw = fmt.encode_any(value)
        assert fmt.decode_any(raw) == value
        old = from_json(json.dumps(doc).replace('"long"', '"integer"'))
        fmt.use(2, old, {1: typ, 2: old})
        raw_old = fmt.encode_any(value)
        fmt.use(3, typ, {1: typ, 2: old, 3: typ})
        assert fmt.decode_any(raw_old) == value
    else:
        for read in readers.values():
            with pytest.raises(SchemaError, match=f"{MAX_SCHEMA_DEPTH}"):
                read()


def test_a_checkpoint_schema_record_nested_past_the_cap_is_a_corrupt_state_naming_the_variable(tmp_path: Path) -> None:
    """Valid JSON, within any JSON parser's own limits (200 structs: 600 levels), whose codec would have exhausted
    the stack: a CorruptStateError naming the variable, for the value schema and the map key schema alike."""
    _, _, _, doc = _nested(200, ["struct"])
    with StateStore(str(tmp_path / "root"), OP, 0, config=StoreConfig(local_dir=str(tmp_path / "w"))) as s:
        s.load(0)
        meta = s.column_family(META_CF)
        meta.put(STATE_META_PREFIX + b"counts", VariableRecord("value", schema_id=1).payload())
        meta.put(schema_key("counts", 1), json.dumps(doc).encode())
        with pytest.raises(CorruptStateError, match="counts"):
            read_record(meta, "counts")
        bad_key = {"kind": "map", "schema_id": 0, "user_key_schema": doc}
        meta.put(STATE_META_PREFIX + b"lookups", json.dumps(bad_key).encode())
        with pytest.raises(CorruptStateError, match="lookups"):
            read_record(meta, "lookups")


# -- records in __meta ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "body"),
    [
        (STATE_META_PREFIX + b"counts", VariableRecord("value", schema_id=MAX_SCHEMA_VERSIONS + 1).payload()),
        (STATE_META_PREFIX + b"counts", VariableRecord("value", schema_id=-1).payload()),
        (schema_key("counts", 0), b'"long"'),
        (schema_key("counts", MAX_SCHEMA_VERSIONS + 1), b'"long"'),
        (schema_key("counts", 2**32 - 1), b'"long"'),
    ],
)
def test_a_schema_id_outside_the_ids_a_writer_gives_is_a_corrupt_state(tmp_path: Path, key: bytes, body: bytes) -> None:
    """Ids run 1, 2, ... up to MAX_SCHEMA_VERSIONS: anything else is refused, so a reader holds at most that many
    schemas of a variable whatever its `__meta` holds."""
    with StateStore(str(tmp_path / "root"), OP, 0, config=StoreConfig(local_dir=str(tmp_path / "w"))) as s:
        s.load(0)
        meta = s.column_family(META_CF)
        meta.put(STATE_META_PREFIX + b"counts", VariableRecord("value").payload())
        meta.put(key, body)
        with pytest.raises(CorruptStateError, match="counts"):
            read_record(meta, "counts")


def test_more_state_variables_than_a_writer_records_are_refused_and_a_writer_stops_at_the_cap(tmp_path: Path) -> None:
    from statekeeper.store.spark.state import StateContext

    with StateStore(str(tmp_path / "root"), OP, 0, config=StoreConfig(local_dir=str(tmp_path / "w"))) as s:
        s.load(0)
        meta = s.column_family(META_CF)
        meta.put_batch(
            [STATE_META_PREFIX + f"v{i:05d}".encode() for i in range(MAX_STATE_VARIABLES - 1)],
            [VariableRecord("value").payload()] * (MAX_STATE_VARIABLES - 1),
        )
        ctx = StateContext(s, 0)
        ctx.declare("one_more", "value", None, DataType("long"), None)  # the last one a store may record
        assert len(variable_names(meta)) == MAX_STATE_VARIABLES
        with pytest.raises(ConfigurationError, match=f"'too_many'.*{MAX_STATE_VARIABLES}"):
            ctx.declare("too_many", "value", None, DataType("long"), None)
        ctx.declare("one_more", "value", None, DataType("long"), None)  # a recorded one still declares
        meta.put(STATE_META_PREFIX + b"planted", VariableRecord("value").payload())
        with pytest.raises(CorruptStateError, match=f"more than {MAX_STATE_VARIABLES} state variables"):
            variable_names(meta)


def test_a_variable_stops_taking_new_schemas_at_the_cap() -> None:
    record = VariableRecord("value")
    for _ in range(MAX_SCHEMA_VERSIONS):
        record.add_schema("counts", DataType("long"))
    assert record.schema_id == MAX_SCHEMA_VERSIONS and len(record.schemas) == MAX_SCHEMA_VERSIONS
    with pytest.raises(SchemaEvolutionError, match=f"'counts' has {MAX_SCHEMA_VERSIONS} value schemas"):
        record.add_schema("counts", DataType("string"))


# -- column families -------------------------------------------------------------------------------
@pytest.fixture
def low_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rocks, "MAX_COLUMN_FAMILIES", CAP)


def _many_families(root: str, work: str, families: int) -> None:
    """A store whose version 1 writes `families` column families (default included), snapshotted."""
    log = CommitLog(open_file_manager(root))
    with StateStore(root, OP, 0, config=StoreConfig(local_dir=work)) as s:
        s.load(0)
        for i in range(families - 1):
            s.put(b"k", b"v", cf=f"cf{i}")
        s.put(b"k", b"v")
        r = s.commit()
        log.commit(r.version, {OP: [r.checkpoint_id]})
        s.load(1)
        write_snapshot(s.fm, StoreId(OP, 0), 1, s.checkpoint_id or "", s.db, work)


def test_a_writer_cannot_create_more_column_families_than_the_cap(tmp_path: Path, low_cap: None) -> None:
    with StateStore(str(tmp_path / "root"), OP, 0, config=StoreConfig(local_dir=str(tmp_path / "w"))) as s:
        s.load(0)
        for i in range(CAP - 1):
            s.put(b"k", b"v", cf=f"cf{i}")
        assert len(s.column_families()) == CAP
        with pytest.raises(ConfigurationError, match=f"'one_more'.*limit of {CAP}"):
            s.put(b"k", b"v", cf="one_more")


def test_a_checkpoint_with_more_column_families_than_the_cap_is_refused_naming_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written where the cap was higher, read where it is lower: the snapshot is refused before RocksDB opens its
    column families (the load falls back to the changelog), and the changelog's replay refuses the first family
    past the cap naming the changelog."""
    root, work = str(tmp_path / "root"), str(tmp_path / "w")
    _many_families(root, work, CAP + 4)
    monkeypatch.setattr(rocks, "MAX_COLUMN_FAMILIES", CAP)
    with (
        StateStore(root, OP, 0, config=StoreConfig(local_dir=str(tmp_path / "r"))) as s,
        pytest.raises(CorruptFileError) as e,
    ):
        s.load(1)
    said = str(e.value)
    assert f"column families, above the limit of {CAP}" in said and ".manifest" in said, said
    assert f"would make {CAP + 1}, above the limit of {CAP}" in said and ".changelog" in said, said


def test_maintenance_replaying_a_changelog_with_more_column_families_than_the_cap_refuses_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot builder's replica replays changelogs into its own RocksDB: the same cap, the same error."""
    from statekeeper.maintenance.replica import Replica

    root = str(tmp_path / "root")
    _many_families(root, str(tmp_path / "w"), CAP + 4)
    monkeypatch.setattr(rocks, "MAX_COLUMN_FAMILIES", CAP)
    fm = open_file_manager(root)
    ckpt = CommitLog(fm).get(1)
    assert ckpt is not None
    replica = Replica(fm, StoreId(OP, 0), str(tmp_path / "replica"))
    try:
        with pytest.raises(CorruptFileError, match=rf"would make {CAP + 1}, above the limit of {CAP}.*\.changelog"):
            replica.ensure(1, ckpt.checkpoint_ids[OP][0], {1: ckpt.checkpoint_ids[OP][0]}, {})
    finally:
        replica.close()


@pytest.mark.parametrize("depth", [MAX_SCHEMA_DEPTH + 1, 3000])
def test_a_declared_pyspark_schema_past_the_cap_is_a_schema_error_naming_the_variable(depth: int) -> None:
    """PySpark's own StructType, declared by a processor: past the cap, and past PySpark's own recursion (its
    jsonValue recurses per level), a SchemaError naming what was declared."""
    from pyspark.sql.types import LongType, StructField, StructType

    from statekeeper.store.formats.typed_schema import to_schema

    typ: Any = LongType()
    for _ in range(depth - 1):
        typ = StructType([StructField("a", typ)])
    with pytest.raises(SchemaError, match=f"state variable 'deep'.*{MAX_SCHEMA_DEPTH}"):
        to_schema(typ, "state variable 'deep'")


def test_a_rescale_relaying_a_changelog_with_more_column_families_than_the_cap_refuses_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never snapshotted, a source is relayed: its changelog's records are cut into the new partitions' changelogs
    without a load. A source naming more column families than a store may have is refused naming its changelog,
    before any new changelog is published or the new layout committed (which no load could then open)."""
    from statekeeper.store.key_groups import KeyGroupLayout
    from statekeeper.store.rescale import execute_rescale, plan_rescale

    root = str(tmp_path / "root")
    fm = open_file_manager(root)
    with StateStore(root, OP, 0, config=StoreConfig(local_dir=str(tmp_path / "w"))) as s:
        s.load(0)
        for i in range(CAP + 3):
            s.put(b"\x00\x01k", b"v", cf=f"cf{i}")  # key group 1, as a group-led key
        s.put(b"\x00\x01k", b"v")
        r = s.commit()
        CommitLog(fm).commit(r.version, {OP: [r.checkpoint_id]}, layouts={OP: KeyGroupLayout(1, 1024)})
    monkeypatch.setattr(rocks, "MAX_COLUMN_FAMILIES", CAP)
    with pytest.raises(CorruptFileError, match=rf"old partition 0: .*above the limit of {CAP}.*\.changelog"):
        execute_rescale(fm, plan_rescale(fm, OP, 2))
    assert CommitLog(fm).latest() == 1
    assert not list((Path(root) / "state" / OP / "00001").glob("**/*.changelog"))


def test_a_relayed_partition_whose_sources_together_name_too_many_column_families_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each source within the cap, their union past it: the merged partition is refused before it is published."""
    from statekeeper.store.key_groups import KeyGroupLayout
    from statekeeper.store.rescale import execute_rescale, plan_rescale
    from statekeeper.store.rescale_plan import RescaleError

    root = str(tmp_path / "root")
    fm = open_file_manager(root)
    ids = []
    for p, lead in ((0, b"\x00\x01"), (1, b"\x02\x01")):  # key groups 1 and 513: one in each half
        with StateStore(root, OP, p, config=StoreConfig(local_dir=str(tmp_path / f"w{p}"))) as s:
            s.load(0)
            for i in range(CAP - 2):
                s.put(lead + b"k", b"v", cf=f"p{p}cf{i}")
            s.put(lead + b"k", b"v")
            ids.append(s.commit().checkpoint_id)
    CommitLog(fm).commit(1, {OP: ids}, layouts={OP: KeyGroupLayout(2, 1024)})
    monkeypatch.setattr(rocks, "MAX_COLUMN_FAMILIES", CAP)
    with pytest.raises(RescaleError, match=rf"new partition 0: {2 * (CAP - 2) + 1} column families.*limit of {CAP}"):
        execute_rescale(fm, plan_rescale(fm, OP, 1))
    assert CommitLog(fm).latest() == 1


# -- schema bytes ----------------------------------------------------------------------------------
SCHEMA_CAP, SCHEMAS_CAP = 2_000, 4_000


@pytest.fixture
def low_schema_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Caps of a few KiB (a fault injected: the caps' values, not their logic), so a test writes kilobytes."""
    monkeypatch.setattr(schemas, "MAX_SCHEMA_BYTES", SCHEMA_CAP)
    monkeypatch.setattr(schemas, "MAX_SCHEMAS_BYTES", SCHEMAS_CAP)


def _wide(fields: int) -> DataType:
    """A struct of `fields` long fields: its JSON grows ~50 bytes a field."""
    return from_json(json.dumps({"type": "struct", "fields": [_long_field(f"f{i}") for i in range(fields)]}))


def _long_field(name: str) -> dict[str, Any]:
    return {"name": name, "type": "long", "nullable": True, "metadata": {}}


def _view_of(root: Path, work: Path, plant: Callable[[ColumnFamily], None]) -> None:
    """Commit version 1 of a typed state whose `__meta` `plant` fills, then read it through a `StateView`."""
    from statekeeper.store.spark.state_view import StateView

    with StateStore(str(root), OP, 0, config=StoreConfig(local_dir=str(work))) as s:
        s.load(0)
        plant(s.column_family(META_CF))
        s.commit()
    CommitLog(open_file_manager(str(root))).commit(1, {OP: [s.checkpoint_id or ""]})
    with StateStore(str(root), OP, 0, config=StoreConfig(local_dir=str(work))) as s:
        s.load(1)
        StateView(s)


def test_a_checkpoint_schema_wider_than_the_cap_is_a_corrupt_state_naming_it(
    tmp_path: Path, low_schema_caps: None
) -> None:
    """Valid JSON of a valid schema, one value past the cap: refused before it is parsed, naming the variable."""
    wide = _wide(60).to_json().encode()
    assert len(wide) > SCHEMA_CAP

    def plant(meta: ColumnFamily) -> None:
        record = VariableRecord("value", schema_id=1)
        meta.put(STATE_META_PREFIX + b"wide", record.payload())
        meta.put(schema_key("wide", 1), wide)

    with pytest.raises(
        CorruptStateError, match=rf"schema 1 of state variable 'wide' is {len(wide)} bytes.*{SCHEMA_CAP}"
    ):
        _view_of(tmp_path / "root", tmp_path / "w", plant)


def test_checkpoint_schemas_past_the_total_cap_are_a_corrupt_state(tmp_path: Path, low_schema_caps: None) -> None:
    """Many variables, each schema under its cap, together past the total a reader holds: refused."""
    one = _wide(20).to_json().encode()
    assert len(one) < SCHEMA_CAP and 10 * len(one) > SCHEMAS_CAP

    def plant(meta: ColumnFamily) -> None:
        for i in range(10):
            meta.put(STATE_META_PREFIX + b"v%d" % i, VariableRecord("value", schema_id=1).payload())
            meta.put(schema_key(f"v{i}", 1), one)

    with pytest.raises(CorruptStateError, match=rf"more than {SCHEMAS_CAP} bytes of schemas"):
        _view_of(tmp_path / "root", tmp_path / "w", plant)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c", "d", "e"]), st.integers(5, 45), st.booleans()),
        min_size=1,
        max_size=12,
    )
)
def test_writers_record_no_schema_a_reader_refuses(
    tmp_path_factory: pytest.TempPathFactory, low_schema_caps: None, steps: list[tuple[str, int, bool]]
) -> None:
    """Model: declarations of variables with value schemas of random widths (each width a new, compatible schema:
    fields only added), some variables deleted. A declaration past either cap is refused naming the variable and
    writes nothing; whatever was recorded, a reader reads, and the recorded bytes never pass the total cap."""
    from statekeeper.store.spark.state import StateContext
    from statekeeper.store.spark.state_view import StateView

    work = tmp_path_factory.mktemp("schema-bytes")
    widths: dict[str, int] = {}
    with StateStore(str(work / "root"), OP, 0, config=StoreConfig(local_dir=str(work / "w"))) as s:
        s.load(0)
        meta = s.column_family(META_CF)
        for name, asked, delete in steps:
            ctx = StateContext(s, 0)
            if delete:
                ctx.undeclare(name)
                widths.pop(name, None)
                continue
            width = max(asked, widths.get(name, 0))  # evolution may add fields, never drop them
            before = dict(meta.items())
            try:
                ctx.declare(name, "value", None, _wide(width), None)
                widths[name] = width
            except ConfigurationError as e:
                assert repr(name) in str(e) and dict(meta.items()) == before
            assert recorded_schema_bytes(meta) <= SCHEMAS_CAP
            StateView(s)  # never refuses what a writer recorded


def test_a_change_feed_changelog_recording_a_schema_past_the_cap_is_refused(low_schema_caps: None) -> None:
    """The change feed compares the schemas a changelog records with the ones it decodes by: one past the cap is
    refused without being parsed, even when it would parse to the same schema."""
    from statekeeper.store.spark.state_view import TypedSchemas

    wide = _wide(60)
    record = VariableRecord("value", schema_id=1, schemas={1: wide})
    raw = wide.to_json().encode()
    assert len(raw) > SCHEMA_CAP
    with pytest.raises(CorruptStateError, match="records schema 1 of state variable 'wide' unlike"):
        TypedSchemas(None, {"wide": record}, "")._check_schemas("wide", [schema_key("wide", 1)], [raw], "cl")


# -- numbers a clock or a 64-bit long cannot hold ----------------------------------------------------
ID = "a" * 32
SHA = "b" * 64


def _framed(kind: str, field: str, value: object) -> tuple[bytes, str]:
    """A commit record, manifest or changelog header written by the product's encoders, `field` set to `value`."""
    if kind == "commit":
        payload: dict[str, Any] = {"version": 3, "batch_id": 2, "created_at": 0.0, "operators": {OP: [ID]}}
        magic, name = b"SKCR", "commits/00000000000000000003.commit"
    elif kind == "manifest":
        magic, name = b"SKSM", "state/agg/00000/snapshots/x.manifest"
        payload = {
            "operator": OP, "partition": 0, "version": 3, "checkpoint_id": ID, "created_at": 0.0,
            "column_families": ["default"], "num_keys": 1, "sst_files": [["000012.sst", SHA[:40] + ".sst", 9, SHA]],
            "db_files": {}, "key_count": 1, "content_sha256": SHA,
        }  # fmt: skip
    else:
        magic, name = b"SKCL", "state/agg/00000/changelogs/x.changelog"
        payload = cl.ChangelogHeader(OP, 0, 3, ID, ()).to_payload()
    if field == "sst size":
        payload["sst_files"][0][2] = value
    elif field == "sst sizes":
        payload["sst_files"] = [[f"{i}.sst", SHA[:40] + ".sst", value, SHA] for i in range(4)]
    else:
        payload[field] = value
    return encode_frame(magic, 1, payload), name


def _read(kind: str, data: bytes, name: str) -> object:
    if kind == "commit":
        return CommitRecord.from_bytes(data, name)
    if kind == "manifest":
        return SnapshotManifest.from_bytes(data, name)
    return cl.read_header(io.BytesIO(data), name)


@given(
    when=st.sampled_from([math.nan, math.inf, -math.inf, 1e300, -1.0, True, "1", [1], None])
    | st.integers(10**309, 10**400)
    | st.integers(-(10**400), -1),
    kind=st.sampled_from(["commit", "manifest", "changelog"]),
)
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_a_time_no_clock_holds_is_corruption_naming_the_file(when: object, kind: str) -> None:
    """An int past a float's range raised OverflowError out of the manifest and header readers; NaN and infinities
    were taken, to defeat an age check or fail the catalog's datetime later."""
    data, name = _framed(kind, "created_at", when)
    with pytest.raises(CorruptFileError, match="'created_at'") as ei:
        _read(kind, data, name)
    assert name in str(ei.value)


@given(
    case=st.sampled_from(
        [
            ("commit", "version"),
            ("commit", "batch_id"),
            ("manifest", "num_keys"),
            ("manifest", "key_count"),
            ("manifest", "sst size"),
            ("manifest", "sst sizes"),
        ]
    ),
    value=st.integers(1 << 63, 10**20 - 1),
)
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_a_number_a_64_bit_long_cannot_hold_is_corruption_naming_the_file(case: tuple[str, str], value: int) -> None:
    """Versions, batch ids, counts and sizes a catalog BIGINT (and Spark's long) cannot hold: `catalog sync` died of
    an OverflowError inserting them. Four SSTs of 2**61 bytes each are refused too (their sum)."""
    kind, field = case
    data, name = _framed(kind, field, value if field != "sst sizes" else 1 << 61)
    with pytest.raises(CorruptFileError) as ei:
        _read(kind, data, name)
    assert name in str(ei.value)
    assert parse_commit_name(f"commits/{value:020d}.commit") is None  # a name claiming one is not ours
    assert parse_versioned_name(f"{value:020d}_{ID}.changelog") is None
    assert parse_commit_name(f"commits/{(1 << 63) - 1:020d}.commit") is None
    assert parse_versioned_name(f"{(1 << 63) - 2:020d}_{ID}.changelog") is not None


def test_a_commit_record_naming_more_partitions_than_a_store_id_holds_is_corruption_naming_it() -> None:
    """Each id is a store, and a partition has 5 digits in names: 100,001 ids made maintenance plan 100,001 stores
    (97 s of `verify` over nothing), each one past the first 100,000 refused only when it became a StoreId."""
    data, name = _framed("commit", "operators", {OP: [ID] * (PARTITIONS + 1)})
    with pytest.raises(CorruptFileError, match="checkpoint id list") as ei:
        CommitRecord.from_bytes(data, name)
    assert name in str(ei.value)
    held, _ = _framed("commit", "operators", {OP: [ID] * PARTITIONS})
    assert len(CommitRecord.from_bytes(held, name).checkpoint_ids[OP]) == PARTITIONS


@given(over=st.integers(1, 64), which=st.sampled_from(["key", "value"]), n=st.integers(1, 40))
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
def test_a_record_block_key_or_value_past_the_writers_cap_is_corruption_naming_the_file(
    over: int, which: str, n: int
) -> None:
    """Keys and values a writer refuses at `put` were taken from a changelog (within the block cap): a key past its
    cap then made a writer's range delete through it one its own reader refuses. Caps lowered to 1 KiB (the logic,
    not the values: a 128 MiB value takes a while)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cl, "MAX_KEY_BYTES", 1024, raising=False)
        mp.setattr(cl, "MAX_VALUE_BYTES", 1024, raising=False)
        keys = [b"k%d" % i for i in range(n)]
        values: list[bytes | None] = [b"v"] * n
        if which == "key":
            keys[-1] = b"k" * (1024 + over)
        else:
            values[-1] = b"v" * (1024 + over)
        raw = b"".join(cl.encode_block_parts(keys, values))
        with pytest.raises(CorruptFileError, match=f"a {which} of {1024 + over} bytes") as ei:
            cl.decode_block_payload(raw, n, "the/changelog")
        assert "the/changelog" in str(ei.value)
        fits = b"".join(cl.encode_block_parts([b"k" * 1024] * n, [b"v" * 1024] * n))
        assert cl.decode_block_payload(fits, n, "the/changelog")[0][0] == b"k" * 1024
