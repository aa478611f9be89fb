"""Typed state's internal column families are untrusted checkpoint content too (DESIGN invariant 12).

A changelog that frames and checksums well can still carry hostile entries in ``__ttl``, ``__timers``,
``__timer_index`` and ``__meta`` (short keys, names that are not UTF-8 or name internal column families, counts of
the wrong width, a key-group count of 0): every reader of them (the batch's TTL eviction and timer scan, the
quiet-input tick's next due time, the state reader, rescale) refuses them as a `CorruptStateError`, never a raw
struct.error / IndexError / UnicodeDecodeError / ZeroDivisionError, and eviction never deletes outside the
user's state variables. A key of a group its partition does not own fails a rescale, which would drop it.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statekeeper.store import CommitLog
from statekeeper.store.config import StoreConfig
from statekeeper.store.errors import StatekeeperError
from statekeeper.store.files import open_file_manager
from statekeeper.store.formats.typed_scalars import CorruptStateError
from statekeeper.store.formats.typed_schema import parse_ddl
from statekeeper.store.key_groups import KeyGroupLayout, group_prefix
from statekeeper.store.layout import StoreId
from statekeeper.store.rescale import RescaleError, execute_rescale, plan_rescale
from statekeeper.store.snapshot import write_snapshot
from statekeeper.store.spark.handle import StatefulProcessorHandle
from statekeeper.store.spark.rescale_rules import TypedStateKeys
from statekeeper.store.spark.schemas import MAX_KEY_GROUPS, META_CF
from statekeeper.store.spark.state import ROWS_TOTAL, TIMER_INDEX_CF, TIMERS_CF, TTL_CF, StateContext
from statekeeper.store.spark.state_view import StateView
from statekeeper.store.state_store import StateStore

_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")
KEY = parse_ddl("k string")


def _store(tmp: Path, work: str) -> StateStore:
    return StateStore(str(tmp / "root"), "op", 0, config=StoreConfig(local_dir=str(tmp / work)))


def _with_planted(tmp: Path, cf: str, key: bytes, value: bytes) -> StateStore:
    """A store whose version 2 replays a changelog that wrote typed state (a TTL'd value, a timer) and then
    the planted entry, as a writer of hostile checkpoints would: framed and checksummed by our own encoder."""
    store = _store(tmp, "w1")
    store.load(0)
    ctx = StateContext(store, 1_000, KEY)
    handle = StatefulProcessorHandle(ctx)
    counts = handle.getValueState("counts", "n long", ttlDurationMs=10)
    ctx.set_key(("a",))
    counts.update((1,))
    handle.registerTimer(500)
    ctx.save_rows_total()
    first = store.commit()
    CommitLog(store.fm).commit(first.version, {"op": [first.checkpoint_id]})
    store.load(1, first.checkpoint_id)
    store.put(key, value, cf=cf)
    second = store.commit()
    CommitLog(store.fm).commit(second.version, {"op": [second.checkpoint_id]})
    store.close()
    fresh = _store(tmp, "w2")
    fresh.load(2, second.checkpoint_id)  # replays both changelogs into a new working copy
    return fresh


def _readers(store: StateStore) -> list[Callable[[], Any]]:
    def ctx() -> StateContext:
        return StateContext(store, 10**12, KEY)

    def evict() -> None:
        c = ctx()
        c.evict_expired()

    def fire() -> None:
        c = ctx()
        for gk, _expiry in c.expired_timers():
            c.decode_gk(gk)

    def locate() -> None:
        rules = TypedStateKeys()
        for cf in store.column_families():
            for k, _ in store.items(cf=cf):
                if rules.rule(cf).name == "LOCATED":
                    rules.locate(cf, k)
        rules.max_key_groups(store)

    def view() -> None:
        v = StateView(store)
        list(v.timers())
        for name in v.records:
            list(v.rows(name))

    return [
        lambda: ctx().rows_total_before(),
        lambda: ctx().next_expiry_ms(),
        lambda: ctx().next_timer_ms(),
        evict,
        fire,
        locate,
        view,
    ]


def _hostile_entries() -> st.SearchStrategy[tuple[str, bytes, bytes]]:
    expiry = st.integers(0, 2**64 - 1).map(_U64.pack)
    names = st.sampled_from([b"", b"\xff\xfe", b"__meta", b"__timers", b"counts", b"missing", b"x" * 300])
    ttl_keys = st.one_of(
        st.binary(max_size=12),
        st.tuples(expiry, st.integers(0, 2**16 - 1), names, st.binary(max_size=8)).map(
            lambda t: t[0] + _U16.pack(t[1]) + t[2] + t[3]
        ),
        st.tuples(expiry, names, st.binary(max_size=8)).map(lambda t: t[0] + _U16.pack(len(t[1])) + t[1] + t[2]),
    )
    timer_index_keys = st.one_of(st.binary(max_size=12), st.tuples(expiry, st.binary(max_size=6)).map(b"".join))
    meta = st.sampled_from([ROWS_TOTAL, MAX_KEY_GROUPS, b"state/\xff", b"state/x"])
    return st.one_of(
        st.tuples(st.just(TTL_CF), ttl_keys, st.just(b"")),
        st.tuples(st.just(TIMER_INDEX_CF), timer_index_keys, st.just(b"")),
        st.tuples(st.just(TIMERS_CF), st.binary(max_size=16), st.just(b"")),
        st.tuples(st.just(META_CF), meta, st.binary(max_size=12)),
        st.tuples(st.just("counts"), st.binary(max_size=8), st.sampled_from([b"", b"T", b"T\x00\x01", b"S\x05"])),
    )


@given(entry=_hostile_entries())
@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
def test_hostile_internal_entries_are_a_corrupt_state_never_a_crash(
    tmp_path_factory: pytest.TempPathFactory, entry: tuple[str, bytes, bytes]
) -> None:
    cf, key, value = entry
    tmp = tmp_path_factory.mktemp("hostile")
    store = _with_planted(tmp, cf, key, value)
    try:
        meta_before = dict(store.items(cf=META_CF))
        for read in _readers(store):
            with contextlib.suppress(StatekeeperError):  # refused by name, never a raw error
                read()
        assert dict(store.items(cf=META_CF)) == meta_before, "eviction deleted outside the state variables"
    finally:
        store.close()


@pytest.mark.parametrize(
    ("cf", "key", "value", "match"),
    [
        (TTL_CF, b"\x00" * 9, b"", "__ttl key"),
        (TTL_CF, _U64.pack(5) + _U16.pack(2) + b"\xff\xfe" + b"\x00\x01a", b"", "__ttl key"),
        (TTL_CF, _U64.pack(5) + _U16.pack(6) + b"__meta" + b"\x00\x01a", b"", "__ttl key"),
        (TIMER_INDEX_CF, b"\x00\x00\x01", b"", "__timer_index key"),
        (META_CF, MAX_KEY_GROUPS, b"\x00\x00\x00\x00", "max_key_groups"),
        (META_CF, ROWS_TOTAL, b"\x01", "row count"),
    ],
)
def test_each_internal_class_is_refused_by_name(tmp_path: Path, cf: str, key: bytes, value: bytes, match: str) -> None:
    store = _with_planted(tmp_path, cf, key, value)
    try:
        refused = 0
        for read in _readers(store):
            try:
                read()
            except CorruptStateError as e:
                assert match in str(e)
                refused += 1
        assert refused, f"no reader refused the planted {cf} entry"
    finally:
        store.close()


@given(stray=st.integers(32, 0xFFFF), cf=st.sampled_from(["default", "counts"]))
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
def test_a_key_of_a_group_its_partition_does_not_own_fails_a_rescale_naming_it(
    tmp_path_factory: pytest.TempPathFactory, stray: int, cf: str
) -> None:
    """Partition 0 of 2 (groups 0-31 of 64) holds a key of group `stray`, put there by a well-framed changelog: a
    rescale to 4 of the snapshotted partitions copied their byte ranges and trimmed the rest, silently dropping the
    key (a relay from changelogs refused it); it refuses, naming it."""
    root = str(tmp_path_factory.mktemp("stray") / "root")
    fm = open_file_manager(root)
    layout, ids = KeyGroupLayout(2, 64), []
    for p in range(2):
        with StateStore(fm, "agg", p) as s:
            s.load(0)
            s.put(group_prefix(layout.groups_of(p)[0]) + b"k", b"v", cf=cf)
            if p == 0:
                s.put(group_prefix(stray) + b"stray", b"x", cf=cf)
            ids.append(s.commit().checkpoint_id)
    CommitLog(fm).commit(1, {"agg": ids}, layouts={"agg": layout})
    for p in range(2):
        with StateStore(fm, "agg", p) as s:
            s.load(1)
            os.makedirs(work := os.path.join(s.local_dir, "snap"))
            write_snapshot(fm, StoreId("agg", p), 1, s.checkpoint_id or "", s.db, work)
    with pytest.raises(RescaleError, match=r"stray.*does not own"):
        execute_rescale(fm, plan_rescale(fm, "agg", 4))
    assert CommitLog(fm).latest() == 1
