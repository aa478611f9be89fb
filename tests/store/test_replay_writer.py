"""Replaying changelogs through `ReplayWriter` (each key's last write only) leaves the DB exactly as
writing every record in order would: model-based, over real changelogs with puts, deletes, range deletes
and SST blocks in several column families, with write batches small enough to flush mid-changelog."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import rocksdict as rd
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from statekeeper.store.formats.changelog import ChangelogHeader, ChangelogReader, ChangelogWriter
from statekeeper.store.loading import ReplayWriter
from statekeeper.store.rocks import DEFAULT_CF, db_options, open_db

CFS = [DEFAULT_CF, "timers"]
KEYS = st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f"])
VALUES = st.one_of(st.none(), st.binary(max_size=6))

Op = tuple[Any, ...]

ops = st.one_of(
    st.tuples(st.just("block"), st.sampled_from(CFS), st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=8)),
    st.tuples(st.just("range_delete"), st.sampled_from(CFS), st.lists(KEYS, min_size=2, max_size=2, unique=True)).map(
        lambda op: (*op[:2], *sorted(op[2]))
    ),
    st.tuples(st.just("sst"), st.sampled_from(CFS), st.dictionaries(KEYS, st.binary(max_size=6), min_size=1)),
)


def _model(changelogs: list[list[Op]]) -> dict[str, dict[bytes, bytes]]:
    state: dict[str, dict[bytes, bytes]] = {cf: {} for cf in CFS}
    for changelog in changelogs:
        for op in changelog:
            kind, cf = op[0], state[op[1]]
            if kind == "block":
                for k, v in op[2]:
                    if v is None:
                        cf.pop(k, None)
                    else:
                        cf[k] = v
            elif kind == "range_delete":
                for k in [k for k in cf if op[2] <= k < op[3]]:
                    del cf[k]
            else:
                cf.update(op[2])
    return state


def _write(path: Path, version: int, ops: list[Op]) -> None:
    writer = ChangelogWriter(str(path), ChangelogHeader("op", 0, version, f"id{version}", ()))
    for n, op in enumerate(ops):
        if op[0] == "block":
            writer.append_block(op[1], [k for k, _ in op[2]], [v for _, v in op[2]])
        elif op[0] == "range_delete":
            writer.append_range_delete(op[1], op[2], op[3])
        else:
            sst = str(path) + f".{n}.sst"
            sst_writer = rd.SstFileWriter(options=db_options())
            sst_writer.open(sst)
            for k in sorted(op[2]):
                sst_writer[k] = op[2][k]
            sst_writer.finish()
            writer.append_sst(op[1], sst, len(op[2]))
            os.unlink(sst)
    writer.finish()


@example(
    changelogs=[[("block", DEFAULT_CF, [(b"b", b"x")]), ("range_delete", DEFAULT_CF, b"a", b"c")]], batch_bytes=1 << 20
)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    changelogs=st.lists(st.lists(ops, max_size=6), min_size=1, max_size=5), batch_bytes=st.sampled_from([1, 1 << 20])
)
def test_replay_writes_what_every_record_in_order_would(
    tmp_path_factory: Any, changelogs: list[list[Op]], batch_bytes: int
) -> None:
    work = tmp_path_factory.mktemp("replay")
    db = open_db(str(work / "db"), CFS[1:], bulk_replay=True)
    try:
        handles = {cf: db.get_column_family_handle(cf) for cf in CFS}
        writer = ReplayWriter(db, handles.__getitem__, batch_bytes, str(work))
        for version, ops_ in enumerate(changelogs, 1):
            path = work / f"{version}.changelog"
            _write(path, version, ops_)
            with open(path, "rb") as f:
                reader = ChangelogReader(f, str(path))
                reader.check_footer()
                writer.apply(reader)
        writer.flush()
        got = {cf: dict((db if cf == DEFAULT_CF else db.get_column_family(cf)).items()) for cf in CFS}
        assert got == _model(changelogs)
    finally:
        db.close()
