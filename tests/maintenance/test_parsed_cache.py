"""The maintainer's caches of parsed files and known SSTs against flat models: kept by scope, they must forget
exactly what a flat map of paths would forget, whatever the prefixes and paths (foreign ones nested at any depth)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from statekeeper.maintenance.file_kinds import FileEntry
from statekeeper.maintenance.parsed_cache import KnownSsts, ParsedFiles, scope_of
from statekeeper.store.layout import StoreId

_PARTS = st.sampled_from(["state", "commits", "op", "00001", "00002", "sst", "x"])
_PATHS = st.lists(_PARTS, min_size=1, max_size=6).map("/".join)
_PREFIXES = st.one_of(st.just(""), st.lists(_PARTS, min_size=1, max_size=5).map(lambda p: "/".join(p) + "/"))
_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), _PATHS),
        st.tuples(st.just("keep"), st.lists(_PREFIXES, min_size=1, max_size=3), st.sets(_PATHS, max_size=8)),
        st.tuples(st.just("discard"), st.lists(_PATHS, max_size=4)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(_STEPS)
def test_keep_listed_and_discard_forget_what_a_flat_map_forgets(steps: list[tuple]) -> None:  # type: ignore[type-arg]
    cache: ParsedFiles[str] = ParsedFiles()
    model: dict[str, str] = {}
    for step in steps:
        if step[0] == "put":
            path = step[1]
            cache.put("root", FileEntry(path, "", 1, 2.0), path.upper())
            model[path] = path.upper()
        elif step[0] == "discard":
            cache.discard("root", step[1])
            for path in step[1]:
                model.pop(path, None)
        else:
            prefixes, listed = step[1], step[2]
            cache.keep_listed("root", prefixes, listed)
            model = {p: v for p, v in model.items() if p in listed or not p.startswith(tuple(prefixes))}
        assert len(cache) == len(model)
        for path, value in model.items():
            assert cache.get("root", FileEntry(path, "", 1, 2.0)) == value
    cache.keep_listed("other-root", [""], set())  # another root's listing forgets nothing here
    assert len(cache) == len(model)


def test_a_store_is_one_scope() -> None:
    assert scope_of("state/op/00001/changelogs/1.changelog") == "state/op/00001"
    assert scope_of("state/op/00001/x") == "state/op/00001"
    assert scope_of("commits/0001.json") == "commits"
    assert scope_of("top-level-file") == ""
    store = StoreId("op", 1)
    assert scope_of(store.sst("a.sst")) == store.prefix  # the depth follows the layout


_STORES = st.sampled_from([StoreId("op", 0), StoreId("op", 1), StoreId("other", 0)])
_NAMES = st.sets(st.sampled_from(["a.sst", "b.sst", "c.sst"]), max_size=3)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.sampled_from(["r1", "r2"]), _STORES, _NAMES),
            st.tuples(st.just("discard"), st.sampled_from(["r1", "r2"]), _STORES, _NAMES),
            st.tuples(
                st.just("keep"),
                st.sampled_from(["r1", "r2"]),
                st.dictionaries(_STORES, _NAMES, max_size=3),
                st.booleans(),
            ),
        ),
        max_size=30,
    )
)
def test_known_ssts_keep_what_was_listed(steps: list[tuple]) -> None:  # type: ignore[type-arg]
    known = KnownSsts()
    model: dict[tuple[str, StoreId], set[str]] = {}
    for step in steps:
        if step[0] == "add":
            _, root, store, names = step
            known.add(root, store, names)
            model.setdefault((root, store), set()).update(names)
        elif step[0] == "discard":
            _, root, store, names = step
            known.discard(root, store, names)
            model.get((root, store), set()).difference_update(names)
        else:
            _, root, listed, whole_root = step
            known.keep_listed(root, listed, whole_root=whole_root)
            for (r, store), names in model.items():
                if r == root and (store in listed or whole_root):
                    names.intersection_update(listed.get(store, ()))
        for (root, store), names in model.items():
            assert known.names(root, store) == names
        assert len(known) == sum(len(n) for n in model.values())
