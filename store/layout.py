"""File names under a checkpoint root (documented in docs/formats.md).

Versions are zero-padded to 20 digits so names sort in commit order within a prefix, which lets a
watcher list only what is new (`start_after`). Every state file name carries its checkpoint id, so
two attempts of one version never share a name.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from statekeeper.store.errors import ConfigurationError
from statekeeper.store.files.paths import validate_component

COMMITS_DIR = "commits"
STATE_DIR = "state"
CHANGELOG_DIR = "changelogs"
SNAPSHOT_DIR = "snapshots"
SST_DIR = "sst"
CHANGELOG_SUFFIX = ".changelog"
MANIFEST_SUFFIX = ".manifest"
COMMIT_SUFFIX = ".commit"
SPARK_DIR = "spark"
BATCHES_DIR = "batches"
BATCH_SUFFIX = ".json"
HEARTBEAT_DIR = "heartbeat"
EVENT_TIME_SUFFIX = ".event_time.json"
LEASES_DIR = "_leases"
LEASE_SUFFIX = ".lease"
DEPLOYMENT_FILE = "_deployment.json"
VERSION_DIGITS = 20
MAX_VERSION = (1 << 63) - 1
"""Versions, batch ids, epochs and times in names are below this, though 20 digits hold more: a signed 64-bit long
(Spark's batch ids, the catalog's BIGINT) holds each, and the version after a batch id. A name or record claiming
more is not one of ours (DESIGN invariant 12): 10**19 made the catalog's insert raise OverflowError."""
PARTITIONS = 100_000
"""Partitions of one operator: a partition has 5 digits in names."""

_ID = re.compile(r"^[0-9a-f]{32}\Z")
_VERSIONED = re.compile(r"^(\d{20})_([0-9a-f]{32})(\.changelog|\.manifest)\Z")
_COMMIT = re.compile(r"^(\d{20})\.commit\Z")
_BATCH = re.compile(r"^(\d{20})(?:\.event_time)?\.json\Z")
_HEARTBEAT = re.compile(r"^(\d{20})\.json\Z")
_LEASE = re.compile(r"^(\d{20})\.lease\Z")


def new_checkpoint_id() -> str:
    return uuid.uuid4().hex


def validate_checkpoint_id(checkpoint_id: str) -> str:
    if not isinstance(checkpoint_id, str) or not _ID.match(checkpoint_id):
        raise ConfigurationError(f"invalid checkpoint id {checkpoint_id!r}: expected 32 lowercase hex digits")
    return checkpoint_id


def validate_version(version: int) -> int:
    if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version < MAX_VERSION:
        raise ConfigurationError(f"invalid version {version!r}: expected an integer in [0, {MAX_VERSION})")
    return version


def _v(version: int) -> str:
    return f"{validate_version(version):0{VERSION_DIGITS}d}"


@dataclass(frozen=True, slots=True)
class StoreId:
    """One state store instance within a checkpoint root: (operator, partition)."""

    operator: str
    partition: int

    def __post_init__(self) -> None:
        validate_component(self.operator, "operator name")
        p = self.partition
        if not isinstance(p, int) or isinstance(p, bool) or not 0 <= p < PARTITIONS:
            raise ConfigurationError(f"invalid partition {self.partition!r}: expected an integer in [0, {PARTITIONS})")

    @property
    def prefix(self) -> str:
        return f"{STATE_DIR}/{self.operator}/{self.partition:05d}"

    def changelog_dir(self) -> str:
        return f"{self.prefix}/{CHANGELOG_DIR}/"

    def snapshot_dir(self) -> str:
        return f"{self.prefix}/{SNAPSHOT_DIR}/"

    def sst_dir(self) -> str:
        return f"{self.prefix}/{SST_DIR}/"

    def changelog(self, version: int, checkpoint_id: str) -> str:
        return f"{self.prefix}/{CHANGELOG_DIR}/{_v(version)}_{validate_checkpoint_id(checkpoint_id)}{CHANGELOG_SUFFIX}"

    def manifest(self, version: int, checkpoint_id: str) -> str:
        return f"{self.prefix}/{SNAPSHOT_DIR}/{_v(version)}_{validate_checkpoint_id(checkpoint_id)}{MANIFEST_SUFFIX}"

    def sst(self, content_name: str) -> str:
        return f"{self.prefix}/{SST_DIR}/{validate_component(content_name, 'SST file name')}"

    def __str__(self) -> str:
        return f"{self.operator}/{self.partition}"


STORE_PREFIX_DEPTH = StoreId("operator", 0).prefix.count("/") + 1
"""How many directories a store's prefix has (``state/<op>/<partition>``): every file of a store lies under that
many, so caches can be kept per store by a path's first directories alone."""


def commit_path(version: int) -> str:
    return f"{COMMITS_DIR}/{_v(version)}{COMMIT_SUFFIX}"


def parse_versioned_name(name: str) -> tuple[int, str, str] | None:
    """`<version>_<id>.changelog|.manifest` -> (version, id, suffix); None for any other name."""
    m = _VERSIONED.match(name.rpartition("/")[2])
    version = _number(m)
    return None if m is None or version is None else (version, m.group(2), m.group(3))


def _number(m: re.Match[str] | None) -> int | None:
    """The 20-digit number a name's match holds, if below `MAX_VERSION` (None: not a name of ours)."""
    number = int(m.group(1)) if m else MAX_VERSION
    return number if number < MAX_VERSION else None


def parse_commit_name(name: str) -> int | None:
    return _number(_COMMIT.match(name.rpartition("/")[2]))


def batch_path(operator: str, batch_id: int) -> str:
    """The Spark driver's record of batch `batch_id` of `operator` (it commits version `batch_id + 1`)."""
    return f"{SPARK_DIR}/{validate_component(operator, 'operator name')}/{BATCHES_DIR}/{_v(batch_id)}{BATCH_SUFFIX}"


def event_time_path(operator: str, batch_id: int) -> str:
    """The watermark batch `batch_id` ran with (beside its batch file; expires with it)."""
    return (
        f"{SPARK_DIR}/{validate_component(operator, 'operator name')}/{BATCHES_DIR}/{_v(batch_id)}{EVENT_TIME_SUFFIX}"
    )


def parse_batch_name(name: str) -> int | None:
    """`<batch>.json` or `<batch>.event_time.json` -> the batch id; None for any other name."""
    return _number(_BATCH.match(name.rpartition("/")[2]))


def heartbeat_dir(operator: str) -> str:
    """Where the running driver of `operator` keeps its heartbeat (store/spark/heartbeat.py)."""
    return f"{SPARK_DIR}/{validate_component(operator, 'operator name')}/{HEARTBEAT_DIR}/"


def heartbeat_path(operator: str, time_ms: int) -> str:
    """The heartbeat the driver published at `time_ms` (milliseconds since the epoch)."""
    return f"{heartbeat_dir(operator)}{_v(time_ms)}{BATCH_SUFFIX}"


def parse_heartbeat_name(name: str) -> int | None:
    """`<ms>.json` -> the time in milliseconds; None for any other name."""
    return _number(_HEARTBEAT.match(name.rpartition("/")[2]))


def lease_dir(store: StoreId) -> str:
    """Where the maintenance leases of `store` live (maintenance/root_leases.py): one file per epoch."""
    return f"{LEASES_DIR}/{store.operator}/{store.partition:05d}/"


def lease_path(store: StoreId, epoch: int) -> str:
    """Epoch `epoch` of `store`'s lease: created exclusively, so one maintainer wins each epoch."""
    return f"{lease_dir(store)}{_v(epoch)}{LEASE_SUFFIX}"


def parse_lease_name(name: str) -> int | None:
    """`<epoch>.lease` -> the epoch; None for any other name."""
    return _number(_LEASE.match(name.rpartition("/")[2]))
