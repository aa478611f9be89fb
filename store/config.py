"""`StoreConfig`: the tunables of one store instance."""

from __future__ import annotations

from dataclasses import dataclass

from statekeeper.store.errors import ConfigurationError
from statekeeper.store.files.read_ahead import READ_AHEAD


@dataclass(frozen=True)
class StoreConfig:
    """Tunables of one store instance; the defaults suit a streaming micro-batch."""

    local_dir: str | None = None
    """Working directory for the local RocksDB and changelog; default: a per-process temp dir."""
    block_bytes: int = 1 << 20
    """Changelog records buffered per column family before a block is compressed and written."""
    compression_level: int = 1
    max_lineage: int = 1000
    """Lineage entries a changelog carries at most; beyond it a load reads one more header per cap."""
    snapshot_check_interval: int = 50
    """Every this many commits, look for newer snapshots to shorten the lineage (one listing)."""
    replay_batch_bytes: int = 32 << 20
    """A load's replay writes the records it merged at least every this many bytes (and every 8 MiB:
    `statekeeper.store.loading.ChangelogReplay`)."""
    read_ahead: int = READ_AHEAD
    """A load's replay fetches up to this many changelogs ahead of the one it applies (S3 GETs or disk reads in
    flight at once: `statekeeper.store.files.read_ahead`); 0 reads each in turn."""
    verify_commit: bool = True
    """On a rebuild, check that the requested id is the committed one (one small read)."""
    bulk_replay: bool = False
    """A store whose loads are scanned, not served (a rescale's sources): its load replays into vector memtables
    (an append per record: about half the loading thread's CPU, under the GIL, of a skip list) and flushes them
    once at its end (the sort, outside the GIL). A point read of a write made after the load sorts its memtable:
    never for a streaming task's store (`statekeeper.store.rocks.db_options`)."""

    def __post_init__(self) -> None:
        if self.block_bytes < 1024:
            raise ConfigurationError(f"block_bytes={self.block_bytes} is below 1024")
        if self.max_lineage < 1:
            raise ConfigurationError(f"max_lineage={self.max_lineage} must be >= 1")
        if self.read_ahead < 0:
            raise ConfigurationError(f"read_ahead={self.read_ahead} must be >= 0")


__all__ = ["StoreConfig"]
