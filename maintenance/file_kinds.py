"""What each path under a checkpoint root is: its kind (the catalog's names), and the store, version and
attempt its name tells (`classify`), from the layout in docs/formats.md alone; one listed file as
`FileEntry`. The inventory (`statekeeper.maintenance.inventory`) sorts a listing with them."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from statekeeper.store.errors import ConfigurationError
from statekeeper.store.files.paths import validate_component
from statekeeper.store.files.s3.capabilities import PROBE_PREFIX
from statekeeper.store.layout import (
    BATCHES_DIR,
    CHANGELOG_DIR,
    CHANGELOG_SUFFIX,
    COMMITS_DIR,
    DEPLOYMENT_FILE,
    HEARTBEAT_DIR,
    LEASES_DIR,
    MANIFEST_SUFFIX,
    SNAPSHOT_DIR,
    SPARK_DIR,
    SST_DIR,
    STATE_DIR,
    StoreId,
    parse_batch_name,
    parse_commit_name,
    parse_heartbeat_name,
    parse_lease_name,
    parse_versioned_name,
)

# File kinds (the same names the catalog uses, plus "upload" for incomplete S3 multipart uploads).
COMMIT = "commit"
CHANGELOG = "changelog"
MANIFEST = "manifest"
SST = "sst"
TEMP = "temp"
UPLOAD = "upload"
BATCH = "batch"
"""The Spark driver's per-batch file; its `version` is the version the batch commits (batch + 1)."""
HEARTBEAT = "heartbeat"
"""A running Spark driver's heartbeat (store/spark/heartbeat.py); a stale one is an orphan."""
LEASE = "lease"
"""A maintenance lease epoch (maintenance/root_leases.py): kept and expired by the leases themselves, never an
orphan nor foreign, and not a catalog file."""
DEPLOYMENT = "deployment"
"""The root's deployment record (maintenance/deployment.py): which catalog the root's maintainers use."""
FOREIGN = "foreign"
NOT_CATALOGUED = frozenset({LEASE, DEPLOYMENT})
"""Kinds that are the maintainers' own coordination, not checkpoint data: no inventory, plan or catalog row."""

SST_NAME = re.compile(r"^[0-9a-f]{40}(?:[0-9a-f]{24})?\.sst\Z")  # 64 digits: re-uploaded after corruption
_TEMP_NAME = re.compile(r"^\.(.+)\.[0-9a-f]{32}\.tmp\Z")
_PROBE_NAME = re.compile(rf"^{PROBE_PREFIX}[0-9a-f]{{32}}\Z")
"""An S3 capability probe's object at the root: written and deleted at once, left only by a killed process."""


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One file (or incomplete upload) under the root; `path` is relative to the root."""

    path: str
    kind: str
    size: int
    mtime: float
    store: StoreId | None = None
    version: int | None = None
    checkpoint_id: str | None = None
    upload_id: str | None = None
    """Only for kind "upload": the multipart upload to abort."""

    @property
    def name(self) -> str:
        return self.path.rpartition("/")[2]


@dataclass(frozen=True, slots=True)
class Kind:
    """What `classify` tells of a path."""

    kind: str
    store: StoreId | None = None
    version: int | None = None
    checkpoint_id: str | None = None


@functools.lru_cache(maxsize=1 << 16)
def _store_of(operator: str, partition: str) -> StoreId | None:
    """The store a `state/<operator>/<partition>` prefix names (None: not a store prefix); cached, since
    every file of a store asks and a listing classifies thousands of files per cycle."""
    if len(partition) != 5 or not partition.isdigit():
        return None
    try:
        validate_component(operator, "operator name")
        return StoreId(operator, int(partition))
    except ConfigurationError:
        return None


def _owning_store(parts: list[str]) -> StoreId | None:
    """The store whose prefix (`state/<op>/<p>/`) holds a path, if any: its foreign files block it."""
    return _store_of(parts[1], parts[2]) if len(parts) >= 3 and parts[0] == STATE_DIR else None


def classify(path: str, *, temp_listing: bool = False) -> Kind:
    """What `path` is by the layout of docs/formats.md; anything else is foreign.

    Temp names are only ours when the local file manager's temp listing reports them and the name
    they would have been published under is itself a checkpoint file. Not cached here: the inventory
    keeps the kinds of the files its listings still see (a process-wide cache of every path ever
    classified would grow with everything a long-running maintainer ever listed).
    """
    parts = path.split("/")
    name = parts[-1]
    if len(parts) == 1 and _PROBE_NAME.match(name):
        return Kind(TEMP)
    if len(parts) == 1 and name == DEPLOYMENT_FILE:
        return Kind(DEPLOYMENT)
    if temp_listing:
        m = _TEMP_NAME.match(name)
        final = classify("/".join([*parts[:-1], m.group(1)])) if m is not None else None
        if final is None or final.kind == FOREIGN:
            return Kind(FOREIGN, _owning_store(parts))
        return Kind(TEMP, final.store, final.version, final.checkpoint_id)
    if parts[0] == LEASES_DIR:
        ok = len(parts) == 4 and _store_of(parts[1], parts[2]) is not None and parse_lease_name(name) is not None
        return Kind(LEASE if ok else FOREIGN)
    if len(parts) == 2 and parts[0] == COMMITS_DIR:
        v = parse_commit_name(name)
        if v is not None and name == f"{v:020d}.commit":
            return Kind(COMMIT, version=v)
        return Kind(FOREIGN)
    if len(parts) != 5 and parts[0] == STATE_DIR:
        return Kind(FOREIGN, _owning_store(parts))
    if len(parts) == 4 and parts[0] == SPARK_DIR and parts[2] == BATCHES_DIR:
        b = parse_batch_name(name)
        if b is not None and _store_of(parts[1], "00000") is not None:
            return Kind(BATCH, version=b + 1)
        return Kind(FOREIGN)
    if len(parts) == 4 and parts[0] == SPARK_DIR and parts[2] == HEARTBEAT_DIR:
        if parse_heartbeat_name(name) is not None and _store_of(parts[1], "00000") is not None:
            return Kind(HEARTBEAT)
        return Kind(FOREIGN)
    if len(parts) == 5 and parts[0] == STATE_DIR:
        store = _store_of(parts[1], parts[2])
        if store is None:
            return Kind(FOREIGN)
        sub = parts[3]
        if sub in (CHANGELOG_DIR, SNAPSHOT_DIR):
            parsed = parse_versioned_name(name)
            if parsed is not None:
                v, cid, suffix = parsed
                if sub == CHANGELOG_DIR and suffix == CHANGELOG_SUFFIX:
                    return Kind(CHANGELOG, store, v, cid)
                if sub == SNAPSHOT_DIR and suffix == MANIFEST_SUFFIX:
                    return Kind(MANIFEST, store, v, cid)
        elif sub == SST_DIR and SST_NAME.match(name):
            return Kind(SST, store)
        return Kind(FOREIGN, store)
    return Kind(FOREIGN)


__all__ = [
    "BATCH",
    "CHANGELOG",
    "COMMIT",
    "DEPLOYMENT",
    "FOREIGN",
    "HEARTBEAT",
    "LEASE",
    "MANIFEST",
    "NOT_CATALOGUED",
    "SST",
    "SST_NAME",
    "TEMP",
    "UPLOAD",
    "FileEntry",
    "Kind",
    "classify",
]
