"""`ChainReplay` (a chain of changelogs written as the last update of each key) gives exactly the state
that applying every changelog in order gives (`apply_changelog`, the load path), on real RocksDB.

Hypothesis draws chains of changelogs over a few column families with puts, deletes, re-puts and empty
values, and buffer budgets small enough that the chain is written out mid-changelog.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import rocksdict as rd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statekeeper.maintenance.replica import content_digest
from statekeeper.store.formats.changelog import ChangelogHeader, ChangelogReader, ChangelogWriter
from statekeeper.store.loading import ChainReplay, apply_changelog
from statekeeper.store.rocks import DEFAULT_CF, db_options, open_db

CFS = (DEFAULT_CF, "counts", "timers")
KEYS = st.binary(min_size=1, max_size=3)  # few distinct keys: updates of one key across changelogs
VALUES = st.one_of(st.none(), st.binary(max_size=6))  # None: a delete
BLOCK = st.tuples(st.sampled_from(CFS), st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=12))
CHAIN = st.lists(st.lists(BLOCK, max_size=4), min_size=1, max_size=6)


def write_chain(directory: Path, chain: list[list[tuple[str, list[tuple[bytes, bytes | None]]]]]) -> list[str]:
    paths = []
    for v, blocks in enumerate(chain, start=1):
        path = str(directory / f"{v}.changelog")
        writer = ChangelogWriter(path, ChangelogHeader("op", 0, v, f"id{v}", ((v - 1, f"id{v - 1}"),)))
        for cf, records in blocks:
            writer.append_block(cf, [k for k, _ in records], [val for _, val in records])
        writer.finish()
        paths.append(path)
    return paths


class Db:
    def __init__(self, path: str, *, bulk_replay: bool) -> None:
        self.db = open_db(path, bulk_replay=bulk_replay)
        self.bulk_replay = bulk_replay

    def handle_of(self, cf: str) -> Any:
        if cf != DEFAULT_CF and cf not in rd.Rdict.list_cf(self.db.path(), db_options()):
            self.db.create_column_family(cf, db_options(bulk_replay=self.bulk_replay))
        return self.db.get_column_family_handle(cf)

    def digest(self) -> tuple[int, str]:
        self.db.flush(True)
        names = rd.Rdict.list_cf(self.db.path(), db_options())
        cfs = {n: (self.db if n == DEFAULT_CF else self.db.get_column_family(n)) for n in names}
        return content_digest({n: iter(cf.items()) for n, cf in cfs.items()})

    def close(self) -> None:
        self.db.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chain=CHAIN, batch_bytes=st.sampled_from([1, 40, 1 << 20]))
def test_chain_replay_equals_replaying_each_changelog(tmp_path: Path, chain: Any, batch_bytes: int) -> None:
    case = Path(os.path.join(tmp_path, os.urandom(6).hex()))
    case.mkdir()
    paths = write_chain(case, chain)
    seq, merged = Db(str(case / "seq"), bulk_replay=False), Db(str(case / "merged"), bulk_replay=True)
    try:
        seq_records = 0
        replay = ChainReplay(merged.db, merged.handle_of, batch_bytes)
        for path in paths:
            with open(path, "rb") as f:
                seq_records += apply_changelog(ChangelogReader(f, path), seq.db, seq.handle_of, batch_bytes)
            with open(path, "rb") as f:
                replay.add(ChangelogReader(f, path))
        assert replay.finish() == seq_records == sum(len(r) for blocks in chain for _, r in blocks)
        assert merged.digest() == seq.digest()
    finally:
        seq.close()
        merged.close()
