"""Changelogs replayed as one (`ChangelogReplay`: record blocks merged per column family before they are written)
leave exactly the state that applying every operation in order leaves: a key's last write wins, a delete after a
put and a put after a delete both hold, a range delete or a bulk-loaded SST applies after everything before it,
whatever the buffer's size (so also when it is written out between blocks)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import rocksdict as rd
from hypothesis import given, settings
from hypothesis import strategies as st

from statekeeper.store.errors import CorruptFileError
from statekeeper.store.formats.changelog import ChangelogHeader, ChangelogReader, ChangelogWriter
from statekeeper.store.loading import ChangelogReplay
from statekeeper.store.rocks import DEFAULT_CF, db_options, open_db

KEYS = st.sampled_from([bytes([a, b]) for a in b"abcd" for b in b"abcd"])  # few keys: many rewrites
CFS = st.sampled_from([DEFAULT_CF, "other"])
VALUE = st.binary(max_size=8)

Op = tuple[Any, ...]
"""("block", cf, [(key, value or None)]), ("range", cf, start, end) or ("sst", cf, {key: value})."""

OPS = st.one_of(
    st.tuples(st.just("block"), CFS, st.lists(st.tuples(KEYS, st.one_of(st.none(), VALUE)), min_size=1, max_size=12)),
    st.tuples(st.just("range"), CFS, KEYS, KEYS),  # an inverted one is hostile: refused naming its changelog
    st.tuples(st.just("sst"), CFS, st.dictionaries(KEYS, VALUE, min_size=1, max_size=6)),
)


def _apply(model: dict[str, dict[bytes, bytes]], op: Op) -> None:
    kind, cf = op[0], op[1]
    state = model.setdefault(cf, {})
    if kind == "block":
        for k, v in op[2]:
            if v is None:
                state.pop(k, None)
            else:
                state[k] = v
    elif kind == "range":  # an empty range deletes nothing
        for k in [k for k in state if op[2] <= k < op[3]]:
            del state[k]
    else:
        state.update(op[2])


def _write(path: Path, version: int, ops: list[Op], work: Path) -> None:
    writer = ChangelogWriter(str(path), ChangelogHeader("op", 0, version, f"{version:032x}", ()))
    for i, op in enumerate(ops):
        kind, cf = op[0], op[1]
        if kind == "block":
            writer.append_block(cf, [k for k, _ in op[2]], [v for _, v in op[2]])
        elif kind == "range":
            writer.append_range_delete(cf, op[2], op[3])
        else:
            sst = str(work / f"bulk-{version}-{i}.sst")
            sw = rd.SstFileWriter(options=db_options())
            sw.open(sst)
            for k in sorted(op[2]):
                sw[k] = op[2][k]
            sw.finish()
            writer.append_sst(cf, sst, len(op[2]))
            os.unlink(sst)
    writer.finish()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(OPS, max_size=6), min_size=1, max_size=5), st.sampled_from([1, 40, 1 << 20]))
def test_changelogs_replayed_as_one_leave_the_state_of_every_operation_in_order(
    tmp_path_factory: pytest.TempPathFactory, changelogs: list[list[Op]], batch_bytes: int
) -> None:
    base = tmp_path_factory.mktemp("replay")
    model: dict[str, dict[bytes, bytes]] = {}
    inverted = [any(op[0] == "range" and op[3] < op[2] for op in ops) for ops in changelogs]
    good = inverted.index(True) if True in inverted else len(changelogs)
    for version, ops in enumerate(changelogs, start=1):
        _write(base / f"{version}.changelog", version, ops, base)
        if version <= good:
            for op in ops:
                _apply(model, op)

    db = open_db(str(base / "db"), ["other"])
    try:
        handles = {cf: db.get_column_family_handle(cf) for cf in (DEFAULT_CF, "other")}
        replay = ChangelogReplay(db, handles.__getitem__, str(base), batch_bytes)
        records = 0
        for version in range(1, len(changelogs) + 1):
            with open(base / f"{version}.changelog", "rb") as f:
                reader = ChangelogReader(f, f"{version}.changelog")
                reader.check_footer()
                if version == good + 1:  # a range delete that ends before it starts: never applied, never raw
                    with pytest.raises(CorruptFileError, match="ends before it starts") as err:
                        replay.add(reader)
                    assert f"{version}.changelog" in str(err.value)
                    del handles
                    return
                records += replay.add(reader)
        replay.write()
        for cf in (DEFAULT_CF, "other"):
            view = db if cf == DEFAULT_CF else db.get_column_family(cf)
            assert dict(view.items()) == model.get(cf, {}), cf
        del handles, view
    finally:
        db.close()
    expected = sum(len(op[2]) if op[0] != "range" else 1 for ops in changelogs for op in ops)
    assert records == expected


def test_a_replay_buffers_no_more_than_its_limit(tmp_path: Path) -> None:
    """DESIGN, Memory: updates are never buffered unbounded in Python. Under the limit a replay holds a changelog's
    records until `write` (merged); past it, `add` writes them out itself."""
    ops: list[Op] = [("block", DEFAULT_CF, [(b"k%02d" % i, b"v" * 8) for i in range(10)])]
    _write(tmp_path / "1.changelog", 1, ops, tmp_path)
    for limit, written_by_add in ((1 << 20, False), (64, True)):
        db = open_db(str(tmp_path / f"db-{limit}"))
        try:
            handles = {DEFAULT_CF: db.get_column_family_handle(DEFAULT_CF)}
            replay = ChangelogReplay(db, handles.__getitem__, str(tmp_path), limit)
            with open(tmp_path / "1.changelog", "rb") as f:
                replay.add(ChangelogReader(f, "1.changelog"))
            assert (len(dict(db.items())) == 10) is written_by_add, limit
            replay.write()
            assert len(dict(db.items())) == 10
            del handles
        finally:
            db.close()
