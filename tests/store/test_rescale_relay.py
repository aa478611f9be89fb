"""A rescale of never-snapshotted state relays its sources' changelog records (store/rescale_relay.py).

The relay must leave exactly what the load-and-copy route leaves: generated histories (puts, deletes and range
deletes, blocks sorted or not, several column families) are rescaled both ways, unsnapshotted and snapshotted,
and compared with each other and with the model. Well-framed content that is wrong (a key outside its
partition's groups) is refused naming the changelog; a chain the relay cannot read record by record (an SST
block) is loaded instead.
"""

from __future__ import annotations

import logging
import random
import shutil
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
import zstandard
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from statekeeper.store import CommitLog, StateStore, rescale_relay
from statekeeper.store.errors import CorruptFileError, StatekeeperError
from statekeeper.store.files import open_file_manager
from statekeeper.store.formats import changelog
from statekeeper.store.formats.changelog import ChangelogHeader, ChangelogReader, ChangelogWriter, SstFile
from statekeeper.store.formats.typed_schema import parse_ddl
from statekeeper.store.key_group_rules import CfRule, GroupLedKeys
from statekeeper.store.key_groups import KeyGroupLayout, group_at, group_byte_range, group_prefix
from statekeeper.store.layout import StoreId, new_checkpoint_id
from statekeeper.store.rescale import RescaleError, execute_rescale, plan_rescale, plan_rollback
from statekeeper.store.spark.handle import StatefulProcessorHandle
from statekeeper.store.spark.rescale_rules import TypedStateKeys
from statekeeper.store.spark.schemas import META_CF
from statekeeper.store.spark.state import ROWS_TOTAL, TIMER_INDEX_CF, TTL_CF, StateContext
from tests.store.test_rescale import CFS, GROUPS, OP, clean, read_all, snapshot_all, stored

Model = dict[str, dict[bytes, bytes]]
KEY = parse_ddl("k string")


def write_history(root: str, layout: KeyGroupLayout, seed: int, batches: int) -> Model:
    """`batches` batches of puts, deletes and range deletes on every partition of `layout`, some written as
    sorted bulk blocks and some key by key in random order; returns the model of the state they leave."""
    rng = random.Random(seed)
    model: Model = {cf: {} for cf in CFS}
    fm = open_file_manager(root)
    for version in range(batches):
        ids = []
        for p in range(layout.partitions):
            lo, hi = layout.groups_of(p)
            with StateStore(fm, OP, p) as s:
                s.load(version)
                for cf in CFS:
                    kv = model[cf]
                    keys = [
                        k for k in (stored(b"k%d" % rng.randint(0, 150)) for _ in range(30)) if lo <= group_at(k) < hi
                    ]
                    if rng.random() < 0.4:  # one sorted bulk block
                        values = [b"b%d" % rng.randint(0, 10**6) for _ in keys]
                        pairs = dict(zip(keys, values, strict=True))
                        s.put_batch(sorted(pairs), [pairs[k] for k in sorted(pairs)], cf=cf)
                        kv.update(pairs)
                    else:
                        for k in keys:
                            if rng.random() < 0.25:
                                s.delete(k, cf=cf)
                                kv.pop(k, None)
                            else:
                                kv[k] = b"v%d" % rng.randint(0, 10**6)
                                s.put(k, kv[k], cf=cf)
                    if rng.random() < 0.3:  # a range delete of one of the partition's groups
                        g = rng.randrange(lo, hi)
                        s.delete_range(group_prefix(g), group_prefix(g + 1), cf=cf)
                        for k in [k for k in kv if group_at(k) == g]:
                            del kv[k]
                ids.append(s.commit().checkpoint_id)
        CommitLog(fm).commit(version + 1, {OP: ids}, layouts={OP: layout})
    return model


def new_changelogs(root: str, version: int) -> list[tuple[ChangelogHeader, list[object]]]:
    """(header, blocks) of every partition's changelog at committed `version`."""
    fm = open_file_manager(root)
    record = CommitLog(fm).get(version)
    assert record is not None
    out: list[tuple[ChangelogHeader, list[object]]] = []
    for p, ckpt in enumerate(record.checkpoint_ids[OP]):
        path = StoreId(OP, p).changelog(version, ckpt)
        with fm.open(path) as f:
            reader = ChangelogReader(f, path)
            out.append((reader.header, list(reader.entries(None))))
    return out


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    src=st.integers(1, 6),
    dst=st.integers(1, 9),
    batches=st.integers(1, 4),
    seed=st.integers(0, 10**6),
    workers=st.sampled_from([1, 3]),
)
def test_relay_leaves_what_load_and_copy_leaves(
    tmp_path_factory: pytest.TempPathFactory, src: int, dst: int, batches: int, seed: int, workers: int
) -> None:
    base = tmp_path_factory.mktemp("relay")
    relayed, copied = base / "relayed", base / "copied"
    layout = KeyGroupLayout(src, GROUPS)
    model = write_history(relayed.as_uri(), layout, seed, batches)
    shutil.copytree(relayed, copied)
    snapshot_all(copied.as_uri(), batches, src)
    target = KeyGroupLayout(dst, GROUPS)
    states, relayed_partitions = [], []
    for root in (relayed.as_uri(), copied.as_uri()):
        fm = open_file_manager(root)
        result = execute_rescale(fm, plan_rescale(fm, OP, dst), workers=workers)
        states.append(read_all(root, result.plan.new_version, target))
        relayed_partitions.append(result.relayed)
    assert relayed_partitions == [dst, 0], "relayed where nothing is snapshotted, copied from the snapshots"
    assert states[0] == states[1] == clean(model)
    record = CommitLog(open_file_manager(relayed.as_uri())).get(batches + 1)
    assert record is not None and record.in_place.get(OP, []) == [], "a relay writes every new partition anew"
    written = new_changelogs(relayed.as_uri(), batches + 1)
    assert len(written) == dst
    for header, blocks in written:
        assert header.lineage == (), "a full-state changelog: its load replays from the empty state"
        assert not any(isinstance(b, SstFile) for b in blocks)


def test_relay_then_rescale_again_and_roll_back(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Relayed partitions are sources like any other: rescaled again (relayed from their full-state changelogs
    and the batch after them), then rolled back to the first relay's version, exact at each step."""
    root = tmp_path_factory.mktemp("again").as_uri()
    fm = open_file_manager(root)
    model = write_history(root, KeyGroupLayout(3, GROUPS), 9, 2)
    execute_rescale(fm, plan_rescale(fm, OP, 5))  # version 3
    after_first = clean(model)
    ids = []
    for p in range(5):  # a batch on the new layout: version 4
        with StateStore(fm, OP, p) as s:
            s.load(3)
            lo, _hi = KeyGroupLayout(5, GROUPS).groups_of(p)
            key = group_prefix(lo) + b"late"
            s.put(key, b"x")
            model["default"][key] = b"x"
            ids.append(s.commit().checkpoint_id)
    CommitLog(fm).commit(4, {OP: ids}, layouts={OP: KeyGroupLayout(5, GROUPS)})
    execute_rescale(fm, plan_rescale(fm, OP, 2))  # version 5
    assert read_all(root, 5, KeyGroupLayout(2, GROUPS)) == clean(model)
    execute_rescale(fm, plan_rollback(fm, OP, 3))  # version 6: the state of version 3 on its 5 partitions
    assert read_all(root, 6, KeyGroupLayout(5, GROUPS)) == after_first


def test_a_key_outside_its_partitions_groups_is_refused_naming_the_changelog(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Checksum-valid content that is wrong: partition 0's changelog holds a key of a group partition 3 owns.
    The relay refuses it naming the file, and nothing is committed."""
    root = tmp_path_factory.mktemp("outside").as_uri()
    fm = open_file_manager(root)
    layout = KeyGroupLayout(4, GROUPS)
    ids = []
    for p in range(4):
        with StateStore(fm, OP, p) as s:
            s.load(0)
            lo, _hi = layout.groups_of(p)
            s.put(group_prefix(lo) + b"mine", b"1")
            if p == 0:
                s.put(group_prefix(layout.groups_of(3)[0]) + b"stray", b"2")
            ids.append(s.commit().checkpoint_id)
    CommitLog(fm).commit(1, {OP: ids}, layouts={OP: layout})
    with pytest.raises(RescaleError, match="does not lead with one of the partition's key groups") as err:
        execute_rescale(fm, plan_rescale(fm, OP, 2))
    assert StoreId(OP, 0).changelog(1, ids[0]) in str(err.value)
    assert CommitLog(fm).latest() == 1


def test_a_changelog_with_an_sst_block_is_loaded_not_relayed(
    tmp_path_factory: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Partitions copied from snapshots hold their ranges as SST blocks; rescaled again before any snapshot,
    they cannot be relayed record by record: the run loads them instead, and the state is exact."""
    root = tmp_path_factory.mktemp("sst").as_uri()
    fm = open_file_manager(root)
    model = write_history(root, KeyGroupLayout(4, GROUPS), 4, 2)
    snapshot_all(root, 2, 4)
    execute_rescale(fm, plan_rescale(fm, OP, 8))  # version 3: partitions 1..7 are SST blocks
    with caplog.at_level(logging.INFO, logger="statekeeper.store.rescale_relay"):
        execute_rescale(fm, plan_rescale(fm, OP, 4), workers=4)  # version 4: a run per new partition
    assert "holds an SST block" in caplog.text
    assert read_all(root, 4, KeyGroupLayout(4, GROUPS)) == clean(model)


def write_typed_history(root: str, layout: KeyGroupLayout, seed: int, batches: int) -> None:
    """Typed state as the Spark integration writes it: values with a TTL (the `__ttl` index), timers registered
    and deleted (the `__timer_index` index), a map state, the shared metadata and the row count."""
    rng = random.Random(seed)
    fm = open_file_manager(root)
    for version in range(batches):
        ids = []
        for p in range(layout.partitions):
            with StateStore(fm, OP, p) as s:
                s.load(version)
                ctx = StateContext(s, 1_000 * (version + 1), KEY, max_key_groups=GROUPS)
                handle = StatefulProcessorHandle(ctx)
                counts = handle.getValueState("counts", "n long", ttlDurationMs=50_000)
                seen = handle.getMapState("seen", "day string", "n long")
                for i in range(40):
                    key = (f"k{rng.randint(0, 60)}",)
                    if layout.owner(group_at(ctx.encode_gk(key))) != p:
                        continue
                    ctx.set_key(key)
                    if rng.random() < 0.2:
                        counts.clear()
                        seen.clear()
                        continue
                    counts.update((i,))
                    seen.updateValue((f"d{i % 3}",), (i,))
                    timer = 10_000 + rng.randint(0, 5) * 1_000
                    if rng.random() < 0.3:
                        handle.deleteTimer(timer)
                    else:
                        handle.registerTimer(timer)
                ctx.clear_key()
                ctx.save_rows_total()
                ids.append(s.commit().checkpoint_id)
        CommitLog(fm).commit(version + 1, {OP: ids}, layouts={OP: layout})


def every_record(root: str, version: int, partitions: int) -> list[dict[str, dict[bytes, bytes]]]:
    out = []
    for p in range(partitions):
        with StateStore(root, OP, p) as s:
            s.load(version)
            out.append({cf: dict(s.items(cf=cf)) for cf in s.column_families() if any(True for _ in s.items(cf=cf))})
    return out


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(src=st.integers(1, 4), dst=st.integers(1, 6), seed=st.integers(0, 10**6))
def test_typed_state_relays_as_it_copies(
    tmp_path_factory: pytest.TempPathFactory, src: int, dst: int, seed: int
) -> None:
    """Every record of every new partition, indexes, metadata and row count included, is the same relayed from
    unsnapshotted sources as copied from snapshotted ones."""
    base = tmp_path_factory.mktemp("typed")
    relayed, copied = base / "relayed", base / "copied"
    write_typed_history(relayed.as_uri(), KeyGroupLayout(src, GROUPS), seed, 3)
    shutil.copytree(relayed, copied)
    snapshot_all(copied.as_uri(), 3, src)
    records = []
    for root in (relayed.as_uri(), copied.as_uri()):
        fm = open_file_manager(root)
        rules = TypedStateKeys()
        execute_rescale(fm, plan_rescale(fm, OP, dst, rules=rules), rules=rules)
        records.append(every_record(root, 4, dst))
    assert records[0] == records[1]
    assert any(TTL_CF in r and TIMER_INDEX_CF in r and ROWS_TOTAL in r[META_CF] for r in records[0])


def test_counting_more_keys_than_the_bound_loads_instead(
    tmp_path_factory: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Typed state's row count is counted from the keys a relay holds in memory; past `COUNTED_KEYS` the run
    loads and copies instead (counting in RocksDB), and the rows are still exact."""
    base = tmp_path_factory.mktemp("bound")
    relayed, copied = base / "relayed", base / "copied"
    write_typed_history(relayed.as_uri(), KeyGroupLayout(2, GROUPS), 3, 2)
    shutil.copytree(relayed, copied)
    snapshot_all(copied.as_uri(), 2, 2)
    monkeypatch.setattr(rescale_relay, "COUNTED_KEYS", 5)
    records = []
    for root in (relayed.as_uri(), copied.as_uri()):
        fm = open_file_manager(root)
        rules = TypedStateKeys()
        with caplog.at_level(logging.INFO, logger="statekeeper.store.rescale_relay"):
            execute_rescale(fm, plan_rescale(fm, OP, 3, rules=rules), rules=rules)
        records.append(every_record(root, 3, 3))
    assert "more than 5 keys in memory" in caplog.text
    assert records[0] == records[1]


def _range_delete_loaded_not_relayed(
    base: Path, caplog: pytest.LogCaptureFixture, cf: str, start: bytes, end: bytes | None
) -> list[dict[str, dict[bytes, bytes]]]:
    """Rescale 2 -> 3 a typed history whose old partition 0 logged a range delete of `cf` over ``[start, end)``, never
    snapshotted and snapshotted: the runs reading old partition 0 load it instead of relaying it (logged), and both
    leave the same records, which are returned."""
    relayed, copied = base / "relayed", base / "copied"
    layout = KeyGroupLayout(2, GROUPS)
    write_typed_history(relayed.as_uri(), layout, 5, 2)
    fm = open_file_manager(relayed.as_uri())
    record = CommitLog(fm).get(2)
    assert record is not None
    planted = plant(relayed.as_uri(), 0, 3, record.checkpoint_ids[OP][0], [("range", cf, start, end)])
    with StateStore(fm, OP, 1) as s:
        s.load(2, record.checkpoint_ids[OP][1])
        second = s.commit().checkpoint_id
    CommitLog(fm).commit(3, {OP: [planted, second]}, layouts={OP: layout})
    shutil.copytree(relayed, copied)
    snapshot_all(copied.as_uri(), 3, 2)
    records, relayed_partitions = [], []
    for root in (relayed.as_uri(), copied.as_uri()):
        fm = open_file_manager(root)
        rules = TypedStateKeys()
        with caplog.at_level(logging.INFO, logger="statekeeper.store.rescale_relay"):
            result = execute_rescale(fm, plan_rescale(fm, OP, 3, rules=rules), rules=rules)
        relayed_partitions.append(result.relayed)
        records.append(every_record(root, 4, 3))
    assert f"column family {cf!r}" in caplog.text and "range delete of" in caplog.text
    assert relayed_partitions[0] < 3 and relayed_partitions[1] == 0, "the runs reading old partition 0 loaded it"
    assert records[0] == records[1]
    return records[0]


def test_a_range_delete_of_counted_state_is_loaded_not_relayed(
    tmp_path_factory: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Typed state never logs a range delete, but a changelog may hold one: finding the counted keys it covers would
    scan every key the relay holds, at each such record. The run loads and copies instead (counting in RocksDB), and
    the state is what the snapshotted copy of the same checkpoint gives."""
    lo, hi = KeyGroupLayout(2, GROUPS).groups_of(0)
    records = _range_delete_loaded_not_relayed(
        tmp_path_factory.mktemp("ranged"), caplog, "counts", *group_byte_range(lo, hi)
    )
    counted = [group_at(k) for r in records for k in r.get("counts", {})]
    assert counted and not any(lo <= g < hi for g in counted), "the range delete took old partition 0's counts only"


def test_a_range_delete_of_shared_metadata_is_loaded_not_relayed(
    tmp_path_factory: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing logs a range delete of typed state's shared metadata either; relaying one would scan every shared
    record held, at each. The runs reading that partition load and copy, and leave what the snapshotted copy of the
    same checkpoint leaves."""
    _range_delete_loaded_not_relayed(tmp_path_factory.mktemp("shared-range"), caplog, META_CF, b"zz-a", b"zz-b")


# -- hostile content: well framed, every checksum right, wrong ---------------------------------------------------
Op = tuple[str, str, Any, Any]
"""("data", cf, keys, values) or ("range", cf, start, end)."""


def _empty_block(writer: ChangelogWriter, cf: str) -> None:
    """A record block of no records, framed and checksummed as the writer frames any (our writer never emits one)."""
    f = writer._open_file()
    name = cf.encode()
    head = bytes((changelog.BLOCK_DATA, len(name))) + name
    payload = zstandard.ZstdCompressor().compress(b"")
    sizes = (0, 0, len(payload))
    f.write(head + struct.pack("<IIII", *sizes, zlib.crc32(payload, zlib.crc32(head + struct.pack("<III", *sizes)))))
    f.write(payload)
    writer.blocks += 1


def plant(root: str, partition: int, version: int, parent: str, ops: list[Op]) -> str:
    """Commit-ready changelog `version` of `partition` extending `parent`, holding `ops` as they are; its id."""
    header = ChangelogHeader(OP, partition, version, new_checkpoint_id(), ((version - 1, parent),))
    fm = open_file_manager(root)
    local = f"{fm.root_uri.removeprefix('file://')}/planted-{header.checkpoint_id}"
    writer = ChangelogWriter(local, header)
    for kind, cf, a, b in ops:
        if kind == "range":
            writer.append_range_delete(cf, a, b)
        elif not a:
            _empty_block(writer, cf)
        else:
            writer.append_block(cf, a, b)
    writer.finish()
    fm.put_file(local, StoreId(OP, partition).changelog(version, header.checkpoint_id))
    return header.checkpoint_id


def hostile_ops(lo: int, hi: int) -> st.SearchStrategy[list[Op]]:
    """Blocks a writer of partition [lo, hi)'s groups might leave, and some it must not: keys of its groups and of
    others, keys too short to hold a group, duplicates, unsorted and empty blocks, deletes of absent keys, range
    deletes inverted or reaching past its groups."""
    own = st.builds(lambda g, i: group_prefix(g) + b"k%d" % i, st.integers(lo, hi - 1), st.integers(0, 30))
    stray = st.builds(lambda g: group_prefix(g) + b"x", st.integers(0, GROUPS - 1)) | st.sampled_from([b"", b"\x00"])
    key = st.one_of(own, own, own, stray)
    value = st.none() | st.binary(min_size=1, max_size=8)
    block = st.lists(st.tuples(key, value), max_size=12).map(
        lambda kv: ("data", "default", [k for k, _ in kv], [v for _, v in kv])
    )
    bound = st.builds(group_prefix, st.integers(0, GROUPS)) | own
    ranged = st.tuples(st.just("range"), st.just("default"), bound, bound)
    return st.lists(block | ranged, min_size=1, max_size=6)


def apply(state: dict[bytes, bytes], ops: list[Op], lo: int, hi: int) -> None:
    """`ops` applied by the partition owning groups [lo, hi): a range delete reaches only the keys it holds."""
    for kind, _cf, a, b in ops:
        if kind == "range":
            for k in [k for k in state if a <= k < b and lo <= group_at(k) < hi]:
                del state[k]
            continue
        for k, v in zip(a, b, strict=True):
            if v is None:
                state.pop(k, None)
            else:
                state[k] = v


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hostile_changelog_content_is_relayed_exactly_or_refused_naming_the_file(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    """Partition 0's newest changelog is generated: records of its groups and of others, empty and unsorted blocks,
    inverted and overreaching range deletes, every checksum right. The rescale either commits exactly the state
    those records leave, each partition holding only its groups, or refuses with an error naming that changelog,
    committing nothing: never another exception."""
    root = tmp_path_factory.mktemp("hostile").as_uri()
    layout = KeyGroupLayout(2, GROUPS)
    fm = open_file_manager(root)
    base = {group_prefix(g) + b"k%d" % i: b"v" for g in range(GROUPS) for i in range(2)}
    ids = []
    for p in range(2):
        with StateStore(fm, OP, p) as s:
            s.load(0)
            lo, hi = layout.groups_of(p)
            for k, v in base.items():
                if lo <= group_at(k) < hi:
                    s.put(k, v)
            ids.append(s.commit().checkpoint_id)
    CommitLog(fm).commit(1, {OP: ids}, layouts={OP: layout})
    lo, hi = layout.groups_of(0)
    ops = data.draw(hostile_ops(lo, hi))
    with StateStore(fm, OP, 1) as s:
        s.load(1)
        second = s.commit().checkpoint_id
    planted = plant(root, 0, 2, ids[0], ops)
    CommitLog(fm).commit(2, {OP: [planted, second]}, layouts={OP: layout})
    expected = dict(base)
    apply(expected, ops, lo, hi)
    try:
        result = execute_rescale(fm, plan_rescale(fm, OP, 3))
    except StatekeeperError as e:
        assert StoreId(OP, 0).changelog(2, planted) in str(e), e
        assert CommitLog(fm).latest() == 2, "nothing committed"
        return
    assert result.relayed == 3
    assert read_all(root, 3, KeyGroupLayout(3, GROUPS)) == ({"default": expected} if expected else {})


def test_a_located_key_that_does_not_parse_is_refused_naming_the_changelog(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Typed state's TTL index holds a key that is not expiry | name | storage key: the relay names the file."""
    root = tmp_path_factory.mktemp("ttl").as_uri()
    write_typed_history(root, KeyGroupLayout(2, GROUPS), 1, 1)
    fm = open_file_manager(root)
    record = CommitLog(fm).get(1)
    assert record is not None
    ids = record.checkpoint_ids[OP]
    planted = plant(root, 0, 2, ids[0], [("data", TTL_CF, [b"\x00garbage"], [b""])])
    with StateStore(fm, OP, 1) as s:
        s.load(1)
        second = s.commit().checkpoint_id
    CommitLog(fm).commit(2, {OP: [planted, second]}, layouts={OP: KeyGroupLayout(2, GROUPS)})
    rules = TypedStateKeys()
    with pytest.raises(CorruptFileError, match=TTL_CF) as err:
        execute_rescale(fm, plan_rescale(fm, OP, 3, rules=rules), rules=rules)
    assert StoreId(OP, 0).changelog(2, planted) in str(err.value)
    assert CommitLog(fm).latest() == 2


@pytest.mark.parametrize("snapshotted", [False, True], ids=["relayed", "loaded and copied"])
def test_shared_records_past_the_cap_are_refused_naming_the_source(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, snapshotted: bool
) -> None:
    """Typed state's metadata (shared by every partition) is a few records; a changelog that claims megabytes of it,
    well framed, is refused before the rescale holds it all in memory, naming the changelog (relay) or the partition
    it loaded (load and copy), and nothing is committed."""
    from statekeeper.store import rescale_plan

    root_path = tmp_path_factory.mktemp("shared")
    root = root_path.as_uri()
    layout = KeyGroupLayout(2, GROUPS)
    write_typed_history(root, layout, 1, 1)
    fm = open_file_manager(root)
    record = CommitLog(fm).get(1)
    assert record is not None
    keys = [b"planted-%06d" % i for i in range(200)]
    planted = plant(root, 0, 2, record.checkpoint_ids[OP][0], [("data", META_CF, keys, [b"v" * 1024] * len(keys))])
    with StateStore(fm, OP, 1) as s:
        s.load(1)
        second = s.commit().checkpoint_id
    CommitLog(fm).commit(2, {OP: [planted, second]}, layouts={OP: layout})
    if snapshotted:
        snapshot_all(root, 2, 2)
    rules = TypedStateKeys()
    monkeypatch.setattr(rescale_plan, "MAX_SHARED_BYTES", 64 << 10)  # legitimate metadata here: under 1 KB
    with pytest.raises(RescaleError, match=META_CF) as err:
        execute_rescale(fm, plan_rescale(fm, OP, 3, rules=rules), rules=rules)
    source = f"{OP}/0 version 2" if snapshotted else StoreId(OP, 0).changelog(2, planted)
    assert source in str(err.value)
    assert CommitLog(fm).latest() == 2


class _SharedMeta(GroupLedKeys):
    """Group-led keys, but column family ``meta`` holds metadata every partition shares (equal values merge, others
    conflict), as typed state's ``__meta`` does."""

    def rule(self, cf: str) -> CfRule:
        return CfRule.SHARED if cf == "meta" else CfRule.LEADING

    def merge_shared(self, cf: str, key: bytes, kept: bytes | None, new: bytes, source: str) -> bytes | None:
        if kept is not None and kept != new:
            raise RescaleError(f"partitions disagree on {cf} key {key!r} (from {source})")
        return None if kept is not None else new


def hostile_shared_ops() -> st.SearchStrategy[list[Op]]:
    """Blocks of the shared column family a writer must not leave: keys of any bytes (empty too), deletes, values
    that contradict the other partition's, many records, range deletes inverted or not."""
    key = st.sampled_from([b"m0", b"m1"]) | st.binary(max_size=6)
    value = st.none() | st.sampled_from([b"a", b"b"]) | st.binary(min_size=1, max_size=40)
    block = st.lists(st.tuples(key, value), max_size=12).map(
        lambda kv: ("data", "meta", [k for k, _ in kv], [v for _, v in kv])
    )
    ranged = st.tuples(st.just("range"), st.just("meta"), key, key)
    return st.lists(block | ranged, min_size=1, max_size=6)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hostile_shared_records_are_merged_exactly_or_refused_naming_where(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, data: st.DataObject
) -> None:
    """Partition 0's newest changelog holds generated records of the shared column family, every checksum right,
    the shared records capped low. The rescale either commits, each new partition holding exactly the union of
    what its old partitions end with, or refuses with an error naming that changelog or an old partition, committing
    nothing (a conflict, a range delete that ends before it starts, more than the cap): never another exception."""
    from statekeeper.store import rescale_plan

    monkeypatch.setattr(rescale_plan, "MAX_SHARED_BYTES", 512)
    root = tmp_path_factory.mktemp("hostile-shared").as_uri()
    old, new = KeyGroupLayout(2, GROUPS), KeyGroupLayout(3, GROUPS)
    fm = open_file_manager(root)
    base = {group_prefix(g) + b"k": b"v" for g in range(GROUPS)}
    meta = {b"m0": b"a", b"m1": b"b"}
    ids = []
    for p in range(2):
        with StateStore(fm, OP, p) as s:
            s.load(0)
            lo, hi = old.groups_of(p)
            s.put_batch([k for k in base if lo <= group_at(k) < hi], [b"v"] * (hi - lo))
            s.put_batch(list(meta), list(meta.values()), cf="meta")
            ids.append(s.commit().checkpoint_id)
    CommitLog(fm).commit(1, {OP: ids}, layouts={OP: old})
    ops = data.draw(hostile_shared_ops())
    with StateStore(fm, OP, 1) as s:
        s.load(1)
        second = s.commit().checkpoint_id
    planted = plant(root, 0, 2, ids[0], ops)
    CommitLog(fm).commit(2, {OP: [planted, second]}, layouts={OP: old})
    ends = [dict(meta), dict(meta)]  # what each old partition ends with
    for kind, _cf, a, b in ops:
        if kind == "range":
            for k in [k for k in ends[0] if a <= k < b]:
                del ends[0][k]
            continue
        for k, v in zip(a, b, strict=True):
            if v is None:
                ends[0].pop(k, None)
            else:
                ends[0][k] = v
    rules = _SharedMeta()
    try:
        execute_rescale(fm, plan_rescale(fm, OP, 3, rules=rules), rules=rules)
    except StatekeeperError as e:
        named = [StoreId(OP, 0).changelog(2, planted), f"{OP}/0 version 2", f"{OP}/1 version 2"]
        assert any(n in str(e) for n in named), e
        assert CommitLog(fm).latest() == 2, "nothing committed"
        event(f"refused: {type(e).__name__}")
        return
    event("committed")
    records = every_record(root, 3, 3)
    assert {k: v for r in records for k, v in r.get("default", {}).items()} == base
    for p, held in enumerate(records):
        expected: dict[bytes, bytes] = {}
        for q, _lo, _hi in new.overlaps(p, old):
            for k, v in ends[q].items():
                assert expected.setdefault(k, v) == v, "committed although two old partitions disagree"
        assert held.get("meta", {}) == expected, f"new partition {p}"
