"""A ListState holds the current key's appends in memory and writes the list once per key (issue 64: a
processor appending row by row rewrote the whole list per row). A model of many ops on several keys in one
batch, keys revisited (as a key's timers revisit it after its input), reads between writes, with and without
a TTL: what the processor reads, what the store holds after the commit and the row counts must be those of
writing every op through."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statekeeper.store.config import StoreConfig
from statekeeper.store.formats.typed_schema import ValueTypeError, parse_ddl
from statekeeper.store.spark.handle import StatefulProcessorHandle
from statekeeper.store.spark.state import StateContext
from statekeeper.store.state_store import StateStore

KEY = parse_ddl("k string")
_ops = st.lists(
    st.tuples(
        st.sampled_from(["append", "append_list", "put", "clear", "get", "value"]),
        st.sampled_from(["a", "b", "c"]),
        st.lists(st.integers(-9, 9), min_size=1, max_size=3),
    ),
    min_size=1,
    max_size=40,
)


def _store(tmp: Path) -> StateStore:
    return StateStore(str(tmp / "root"), "op", 0, config=StoreConfig(local_dir=str(tmp / "w")))


@given(batches=st.lists(_ops, min_size=1, max_size=3), ttl=st.sampled_from([None, 60_000]))
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_held_appends_read_and_commit_as_written_through(
    tmp_path_factory: Any, batches: list[list[tuple[str, str, list[int]]]], ttl: int | None
) -> None:
    tmp = tmp_path_factory.mktemp("held")
    store = _store(tmp)
    model: dict[str, list[int]] = {}
    counted: set[str] = set()  # keys with a row of the value variable
    version, ckpt = 0, None
    try:
        for ops in batches:
            store.load(version, ckpt)
            ctx = StateContext(store, 1_000, KEY)
            handle = StatefulProcessorHandle(ctx)
            lists, counter = handle.getListState("l", "v int", ttl), handle.getValueState("n", "n long")
            updates = 0
            for op, key, values in ops:
                if ctx.key != (key,):
                    ctx.set_key((key,))
                if op == "append":
                    lists.appendValue((values[0],))
                    model.setdefault(key, []).append(values[0])
                elif op == "append_list":
                    lists.appendList([(v,) for v in values])
                    model.setdefault(key, []).extend(values)
                elif op == "put":
                    lists.put([(v,) for v in values])
                    model[key] = list(values)
                elif op == "clear":
                    lists.clear()
                    model.pop(key, None)
                elif op == "value":  # another variable's write between appends
                    counter.update((len(model.get(key, [])),))
                    counted.add(key)
                    updates += 1
                updates += op in ("append", "append_list", "put")
                got = [t[0] for t in lists.get()]
                assert got == model.get(key, []) and lists.exists() == bool(got)
            assert ctx.save_rows_total() == len(model) + len(counted)  # numTotalStateRows
            assert ctx.rows_updated == updates
            result = store.commit()  # no clear_key: the commit itself writes what is held
            version, ckpt = result.version, result.checkpoint_id
        store.load(version, ckpt)
        ctx = StateContext(store, 1_000, KEY)
        lists = StatefulProcessorHandle(ctx).getListState("l", "v int", ttl)
        for key in ("a", "b", "c"):
            ctx.set_key((key,))
            assert [t[0] for t in lists.get()] == model.get(key, [])
        store.abort()
    finally:
        store.close()


def test_an_append_the_schema_cannot_hold_fails_its_call(tmp_path: Path) -> None:
    """Held appends are still encoded at the call: a wrong value raises there, and the held list is intact."""
    store = _store(tmp_path)
    store.load(0)
    ctx = StateContext(store, 0, KEY)
    lists = StatefulProcessorHandle(ctx).getListState("l", "v int")
    ctx.set_key(("a",))
    lists.appendValue((1,))
    with pytest.raises(ValueTypeError, match="cannot hold 'x'"):
        lists.appendValue(("x",))
    lists.appendValue((2,))
    ctx.clear_key()
    result = store.commit()
    store.load(result.version, result.checkpoint_id)
    ctx = StateContext(store, 0, KEY)
    ctx.set_key(("a",))
    assert list(StatefulProcessorHandle(ctx).getListState("l", "v int").get()) == [(1,), (2,)]
    store.abort()
    store.close()


def test_held_elements_read_back_as_stored(tmp_path: Path) -> None:
    """A held append reads back as a stored one would (a struct as a Row, an array as a list) and keeps what
    was passed: the caller changing its object afterwards changes nothing, as PySpark serializes at the call."""
    store = _store(tmp_path)
    store.load(0)
    ctx = StateContext(store, 0, KEY)
    lists = StatefulProcessorHandle(ctx).getListState("l", "s struct<a: int, b: string>, arr array<int>")
    ctx.set_key(("a",))
    arr = [1, 2]
    lists.appendValue(({"b": "x", "a": 1}, arr))
    arr.append(99)
    held = list(lists.get())
    ctx.clear_key()
    result = store.commit()
    store.load(result.version, result.checkpoint_id)
    ctx = StateContext(store, 0, KEY)
    ctx.set_key(("a",))
    stored = list(StatefulProcessorHandle(ctx).getListState("l", "s struct<a: int, b: string>, arr array<int>").get())
    assert held == stored == [((1, "x"), [1, 2])]
    assert held[0][0].b == "x"  # a Row, as PySpark reads a struct back
    store.abort()
    store.close()
