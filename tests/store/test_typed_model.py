"""Model-based test of typed state: random batches of ValueState / ListState / MapState updates,
commits, fresh-process reloads (changelog replay) and schema evolutions, against a dict model.

After every step the state read through the handle and through the read-only view (what the state
reader uses) equals the model, and map entries come back in the order of their typed keys.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from statekeeper.store import CommitLog, StateStore, StoreConfig
from statekeeper.store.formats.typed_schema import parse_ddl
from statekeeper.store.spark.handle import StatefulProcessorHandle
from statekeeper.store.spark.spark_errors import StateValueError
from statekeeper.store.spark.state import StateContext
from statekeeper.store.spark.state_view import StateView
from tests.model_steps import CountedSteps, scaled

KEY = parse_ddl("user string, n int")
SCHEMAS = ["a long, b string", "a long, b string, c double", "b string, c double, a long"]
"""Value schemas in the order restarts adopt them (each readable from all before it)."""
user_keys = st.tuples(st.sampled_from(["", "a", "a\x00", "b", "é"]), st.integers(-3, 3))
map_keys = st.integers(-(2**40), 2**40)
longs = st.none() | st.integers(-(2**63), 2**63 - 1)
texts = st.none() | st.text(max_size=5)


class TypedStateMachine(CountedSteps, RuleBasedStateMachine):
    model_name = "typed store"

    @initialize()
    def start(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="typed-model-")
        self.root = f"file://{self.dir}/root"
        self.log = CommitLog(StateStore(self.root, "op", 0, config=StoreConfig(local_dir=f"{self.dir}/x")).fm)
        self.schema = 0
        self.values: dict[tuple[str, int], dict[str, Any]] = {}
        self.lists: dict[tuple[str, int], list[int]] = {}
        self.maps: dict[tuple[str, int], dict[int, str | None]] = {}
        self.loads = 0
        self.version = 0
        self.store: StateStore | None = None
        self._open()

    def _open(self) -> None:
        self.loads += 1
        self.store = StateStore(self.root, "op", 0, config=StoreConfig(local_dir=f"{self.dir}/l{self.loads}"))
        self.store.load(self.version)
        self.ctx = StateContext(self.store, 0, KEY)
        handle = StatefulProcessorHandle(self.ctx)
        self.value = handle.getValueState("v", SCHEMAS[self.schema])
        self.list = handle.getListState("l", "x long")
        self.map = handle.getMapState("m", "k long", "s string")

    def _row(self, fields: dict[str, Any]) -> tuple[Any, ...]:
        names = [f.name for f in parse_ddl(SCHEMAS[self.schema]).fields]
        return tuple(fields.get(n) for n in names)

    @rule(key=user_keys, a=longs, b=texts, c=st.none() | st.floats(allow_nan=False))
    def update_value(self, key: tuple[str, int], a: int | None, b: str | None, c: float | None) -> None:
        self.ctx.set_key(key)
        fields = {"a": a, "b": b, "c": c if self.schema else None}
        self.value.update(self._row(fields))
        self.values[key] = fields

    @rule(key=user_keys)
    def clear_value(self, key: tuple[str, int]) -> None:
        self.ctx.set_key(key)
        self.value.clear()
        self.values.pop(key, None)

    @rule(key=user_keys, items=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3))
    def append_list(self, key: tuple[str, int], items: list[int]) -> None:
        self.ctx.set_key(key)
        if not items:  # as PySpark: an empty list is not stored, and the list stays as it was
            with pytest.raises(StateValueError, match="EMPTY_LIST_VALUE"):
                self.list.appendList([])
            return
        self.list.appendList([(x,) for x in items])
        self.lists[key] = self.lists.get(key, []) + items

    @rule(key=user_keys, k=map_keys, s=texts)
    def update_map(self, key: tuple[str, int], k: int, s: str | None) -> None:
        self.ctx.set_key(key)
        self.map.updateValue((k,), (s,))
        self.maps.setdefault(key, {})[k] = s

    @rule(key=user_keys, k=map_keys)
    def remove_map(self, key: tuple[str, int], k: int) -> None:
        self.ctx.set_key(key)
        self.map.removeKey((k,))
        self.maps.get(key, {}).pop(k, None)

    @rule(evolve=st.booleans())
    def commit_and_restart(self, evolve: bool) -> None:
        """Commit, then a fresh process loads the version (changelog replay), maybe with a new schema."""
        assert self.store is not None
        result = self.store.commit()
        self.log.commit(result.version, {"op": [result.checkpoint_id]})
        self.version = result.version
        self.store.close()
        if evolve and self.schema + 1 < len(SCHEMAS):
            self.schema += 1
        self._open()

    @invariant()
    def matches_the_model(self) -> None:
        if not hasattr(self, "store") or self.store is None:
            return
        for key, fields in self.values.items():
            self.ctx.set_key(key)
            assert self.value.get() == self._row(fields)
        for key, items in self.lists.items():
            self.ctx.set_key(key)
            assert list(self.list.get()) == [(x,) for x in items]
        for key, entries in self.maps.items():
            self.ctx.set_key(key)
            got = list(self.map.iterator())
            # as PySpark iterates: by the little-endian bytes of each key's row
            spark_order = sorted(entries, key=lambda k: k.to_bytes(8, "little", signed=True))
            assert got == [((k,), (entries[k],)) for k in spark_order]
        view = StateView(self.store)
        assert {k: v for k, _, v, _ in view.rows("v")} == {k: self._row(f) for k, f in self.values.items()}
        assert sum(1 for _ in view.rows("m")) == sum(len(e) for e in self.maps.values())
        self.ctx.clear_key()

    def teardown(self) -> None:
        store = getattr(self, "store", None)
        if store is not None:
            store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


TypedStateMachine.TestCase.settings = settings(
    max_examples=scaled(15), stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_typed_state_model = TypedStateMachine.TestCase
