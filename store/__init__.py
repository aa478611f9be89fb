"""statekeeper's state store: the library PySpark jobs import.

from statekeeper.store import StateStore
s = StateStore("file:///tmp/ckpt", "agg", partition=0).load(0)
s.put(b"k", b"v"); result = s.commit()           # version 1, fresh checkpoint id
CommitLog(s.fm).commit(1, {"agg": [result.checkpoint_id]})   # the driver's commit record
"""

if __name__ != "statekeeper.store":  # one path per module: a bare `store` would be a second copy
    raise ImportError(f"import statekeeper.store, not {__name__}: the folders import only as statekeeper.*")

from statekeeper.store.column_family import ColumnFamily
from statekeeper.store.commit_log import CommitLog
from statekeeper.store.config import StoreConfig
from statekeeper.store.errors import (
    CheckpointError,
    CheckpointFileExistsError,
    CheckpointFileNotFoundError,
    ConfigurationError,
    CorruptFileError,
    LineageError,
    StatekeeperError,
    StoreStateError,
    UnsupportedFormatError,
    VersionExpiredError,
)
from statekeeper.store.files import CheckpointFileManager, FileInfo, open_file_manager
from statekeeper.store.layout import StoreId
from statekeeper.store.loading import LoadMetrics
from statekeeper.store.rocks import MemoryLimits, configure_memory
from statekeeper.store.state_store import CommitMetrics, CommitResult, StateStore

__all__ = [
    "CheckpointError",
    "CheckpointFileExistsError",
    "CheckpointFileManager",
    "CheckpointFileNotFoundError",
    "ColumnFamily",
    "CommitLog",
    "CommitMetrics",
    "CommitResult",
    "ConfigurationError",
    "CorruptFileError",
    "FileInfo",
    "LineageError",
    "LoadMetrics",
    "MemoryLimits",
    "StateStore",
    "StatekeeperError",
    "StoreConfig",
    "StoreId",
    "StoreStateError",
    "UnsupportedFormatError",
    "VersionExpiredError",
    "configure_memory",
    "open_file_manager",
]
