"""The resources' process-wide state: one open catalog per database, and syncs an asset's checks reuse."""

from __future__ import annotations

from pathlib import Path

from statekeeper.orchestration.assets import sync_lineage
from statekeeper.orchestration.resources import CatalogDatabase, CheckpointStorage
from tests.orchestration.helpers import CheckpointWriter


def test_sessions_of_one_database_share_its_engine_and_others_do_not(tmp_path: Path) -> None:
    """One engine per database per process (its pool and compiled statements outlive a run or a tick)."""
    a = CatalogDatabase(url=f"sqlite:///{tmp_path / 'a.db'}")
    with a.session() as first, CatalogDatabase(url=f"sqlite:///{tmp_path / 'a.db'}").session() as again:
        assert again is first and again.engine is first.engine
        assert first.roots() == []  # migrated on first use
    with CatalogDatabase(url=f"sqlite:///{tmp_path / 'b.db'}").session() as other:
        assert other is not first and other.engine.url != first.engine.url


def test_a_sync_younger_than_fresh_within_is_reused_and_an_older_one_is_not(tmp_path: Path) -> None:
    root = (tmp_path / "ckpt").as_uri()
    writer = CheckpointWriter(root)
    storage = CheckpointStorage(roots=[root])
    try:
        writer.commit(2)
        with CatalogDatabase(url=f"sqlite:///{tmp_path / 'c.db'}").session() as cat:
            assert sync_lineage(cat, storage.file_manager(root)) is not None
            writer.commit(1)
            assert sync_lineage(cat, storage.file_manager(root), fresh_within=60.0) is None  # the sync just made stands
            assert {c.latest_version for c in cat.chain_lengths(root)} == {2}
            assert sync_lineage(cat, storage.file_manager(root), fresh_within=1e-9) is not None
            assert {c.latest_version for c in cat.chain_lengths(root)} == {3}
    finally:
        writer.close()
