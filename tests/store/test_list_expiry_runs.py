"""A TTL'd ListState keeps an expiry per element, as Spark's does: a model of Spark's semantics against the
store (appends in different batches expire apart, ``put`` resets every element, the batch's eviction removes
and counts expired elements), and the per-element encoding (tag 0x55) read as untrusted content."""

from __future__ import annotations

import contextlib
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statekeeper.store import CommitLog
from statekeeper.store.config import StoreConfig
from statekeeper.store.formats.typed_scalars import CorruptStateError
from statekeeper.store.formats.typed_schema import parse_ddl
from statekeeper.store.spark.handle import StatefulProcessorHandle
from statekeeper.store.spark.schemas import (
    TAG_RUNS,
    Runs,
    ValueFormat,
    drop_expired_elements,
    read_runs,
    varint,
)
from statekeeper.store.spark.state import StateContext
from statekeeper.store.state_store import StateStore

TTL = 1_000
ELEMENT = parse_ddl("v int")

_ops = st.lists(
    st.tuples(
        st.sampled_from(["append", "append_list", "put", "clear", "nothing"]),
        st.sampled_from(["a", "b"]),
        st.lists(st.integers(-5, 5), min_size=1, max_size=3),
        st.integers(0, 700),  # ms the clock moves before the op's batch
    ),
    min_size=1,
    max_size=25,
)


@given(ops=_ops)
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_elements_expire_one_by_one_as_in_spark(
    tmp_path_factory: Any, ops: list[tuple[str, str, list[int], int]]
) -> None:
    """Each op is a batch of its own: the op on one key, then the batch's eviction; the model holds each
    element with its expiry, as Spark's ListStateImplWithTTL does."""
    tmp = tmp_path_factory.mktemp("runs")
    store = StateStore(str(tmp / "root"), "op", 0, config=StoreConfig(local_dir=str(tmp / "w")))
    store.load(0)
    model: dict[str, list[tuple[int, int]]] = {}  # key -> [(value, expiry)]
    now = 0
    try:
        for op, key, values, step in ops:
            now += step
            ctx = StateContext(store, now, parse_ddl("k string"))
            state = StatefulProcessorHandle(ctx).getListState("l", ELEMENT, TTL)
            ctx.set_key((key,))
            live = [v for v, e in model.get(key, []) if e > now]
            assert [t[0] for t in state.get()] == live and state.exists() == bool(live)
            if op == "append":
                state.appendValue((values[0],))
                model.setdefault(key, []).append((values[0], now + TTL))
            elif op == "append_list":
                state.appendList([(v,) for v in values])
                model.setdefault(key, []).extend((v, now + TTL) for v in values)
            elif op == "put":
                state.put([(v,) for v in values])
                model[key] = [(v, now + TTL) for v in values]
            elif op == "clear":
                state.clear()
                model.pop(key, None)
            ctx.clear_key()
            ctx.evict_expired()
            expired = sum(1 for entries in model.values() for _, e in entries if e <= now)
            assert ctx.ttl_removed == expired
            model = {k: [(v, e) for v, e in entries if e > now] for k, entries in model.items()}
            model = {k: entries for k, entries in model.items() if entries}
            stored = {k: [t[0] for t in state_values] for k, state_values in _stored(store).items()}
            assert stored == {k: [v for v, _ in entries] for k, entries in model.items()}
    finally:
        store.close()


def _stored(store: StateStore) -> dict[str, list[Any]]:
    """Every key's stored list as decoded without a clock (what eviction left)."""
    fmt = ValueFormat("l", True)
    fmt.use(1, ELEMENT, {1: ELEMENT})
    out: dict[str, list[Any]] = {}
    if "l" not in store.column_families():
        return out
    codec = StateContext(store, 0, parse_ddl("k string"))
    for k, raw in store.column_family("l").items():
        out[codec.decode_gk(k)[0]] = fmt.decode(raw)
    return out


def _runs_value(runs: Runs, elements: list[int]) -> bytes:
    fmt = ValueFormat("l", True)
    fmt.use(1, ELEMENT, {1: ELEMENT})
    return fmt.encode_runs([(v,) for v in elements], runs)


@given(
    runs=st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**16)), min_size=0, max_size=5),
    head=st.integers(0, 2**64 - 1),
    count=st.integers(0, 2**20),
    elements=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=6),
    cut=st.integers(0, 80),
)
@settings(max_examples=300, deadline=None)
def test_hostile_runs_are_a_corrupt_state_never_a_crash(
    runs: list[tuple[int, int]], head: int, count: int, elements: list[int], cut: int
) -> None:
    """Well-framed but wrong per-element expiries (counts that do not cover the list, a head that is not the
    earliest, a run count past the bytes, a cut value) fail with CorruptStateError naming the variable."""
    body = b"".join(struct.pack(">Q", e) + varint(n) for e, n in runs)
    fmt = ValueFormat("l", True, " (operator op partition 0)")
    fmt.use(1, ELEMENT, {1: ELEMENT})
    row = fmt.encode([(v,) for v in elements])[2:]  # the list row after tag and schema id
    raw = bytes((TAG_RUNS,)) + struct.pack(">Q", head) + varint(count) + body + varint(1) + row
    for value in (raw, raw[: len(raw) - cut] if cut else raw):
        for now in (None, 5, 2**63):
            with contextlib.suppress(CorruptStateError):
                fmt.decode(value, now)
        with contextlib.suppress(CorruptStateError):
            drop_expired_elements(value, 5)


def test_runs_round_trip_and_eviction_keeps_the_live_elements_bytes() -> None:
    raw = _runs_value([(100, 2), (300, 1), (200, 2)], [1, 2, 3, 4, 5])
    assert raw[0] == TAG_RUNS and read_runs(raw)[0] == [(100, 2), (300, 1), (200, 2)]
    fmt = ValueFormat("l", True)
    fmt.use(1, ELEMENT, {1: ELEMENT})
    assert fmt.decode(raw, 99) == [(1,), (2,), (3,), (4,), (5,)]
    assert fmt.decode(raw, 100) == [(3,), (4,), (5,)] and fmt.decode(raw, 200) == [(3,)]
    kept, dropped, earliest = drop_expired_elements(raw, 150)
    assert kept is not None and dropped == 2 and earliest == 200
    assert fmt.decode(kept) == [(3,), (4,), (5,)] and read_runs(kept)[0] == [(300, 1), (200, 2)]
    kept, dropped, earliest = drop_expired_elements(raw, 250)
    assert kept is not None and kept[0] == 0x54 and dropped == 4 and earliest == 300 and fmt.decode(kept) == [(3,)]
    assert drop_expired_elements(raw, 300) == (None, 5, None)


def test_a_value_variable_refuses_per_element_expiries() -> None:
    raw = _runs_value([(100, 1), (200, 1)], [1, 2])
    fmt = ValueFormat("v", False, " (operator op partition 0)")
    fmt.use(1, ELEMENT, {1: ELEMENT})
    with pytest.raises(CorruptStateError, match=r"state variable 'v' \(operator op partition 0\).*0x55"):
        fmt.decode(raw)


def test_an_imported_list_keeps_its_per_element_expiries(tmp_path: Path) -> None:
    """What a restart reads back: the runs survive a commit and a load from the changelog."""
    store = StateStore(str(tmp_path / "root"), "op", 0, config=StoreConfig(local_dir=str(tmp_path / "w")))
    store.load(0)
    ctx = StateContext(store, 0, parse_ddl("k string"))
    state = StatefulProcessorHandle(ctx).getListState("l", ELEMENT, TTL)
    ctx.set_key(("a",))
    state.appendValue((1,))
    ctx.now_ms = 500
    state.appendValue((2,))
    ctx.clear_key()
    first = store.commit()
    CommitLog(store.fm).commit(first.version, {"op": [first.checkpoint_id]})
    store.close()
    again = StateStore(str(tmp_path / "root"), "op", 0, config=StoreConfig(local_dir=str(tmp_path / "w2")))
    again.load(first.version, first.checkpoint_id)
    ctx = StateContext(again, 1_200, parse_ddl("k string"))
    state = StatefulProcessorHandle(ctx).getListState("l", ELEMENT, TTL)
    ctx.set_key(("a",))
    assert list(state.get()) == [(2,)]
    again.close()
