"""The snapshot manifest: the full state of one committed (version, checkpoint id) of a store.

A snapshot is a RocksDB checkpoint: its SST files are uploaded under content-derived names (shared
between snapshots, so a new snapshot uploads only new SSTs), and the small RocksDB metadata files
(CURRENT, MANIFEST-*, OPTIONS-*) travel inside this manifest, which is written last.
"""

from __future__ import annotations

import base64
import re
import time
from dataclasses import dataclass, field
from typing import Any

from statekeeper.store.errors import CorruptFileError
from statekeeper.store.formats.framing import created_at, decode_whole_frame, encode_frame, require
from statekeeper.store.formats.names import Shape, column_family_from_file, name_from_file, shown

MAGIC = b"SKSM"
FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class SstFile:
    local_name: str  # the RocksDB file name the DB's MANIFEST refers to, e.g. 000012.sst
    remote_name: str  # content-derived name under the store's sst/ directory
    size: int
    sha256: str


@dataclass(frozen=True)
class SnapshotManifest:
    operator: str
    partition: int
    version: int
    checkpoint_id: str
    sst_files: tuple[SstFile, ...]
    db_files: dict[str, bytes]
    column_families: tuple[str, ...]
    num_keys: int
    """RocksDB's estimate at build time (a statistic, not a check)."""
    created_at: float = field(default_factory=time.time)
    key_count: int | None = None
    """The exact number of keys of every column family, counted when the snapshot was built from its own
    files (None: a manifest written before the field existed)."""
    content_sha256: str | None = None
    """SHA-256 over every column family's sorted items (`statekeeper.store.snapshot.snapshot_content`), taken
    with `key_count`: maintenance proves a snapshot by opening it and finding both again (DESIGN invariant 14)."""

    @property
    def total_sst_bytes(self) -> int:
        return sum(f.size for f in self.sst_files)

    def to_bytes(self) -> bytes:
        payload: dict[str, Any] = {
            "operator": self.operator,
            "partition": self.partition,
            "version": self.version,
            "checkpoint_id": self.checkpoint_id,
            "created_at": self.created_at,
            "column_families": list(self.column_families),
            "num_keys": self.num_keys,
            "sst_files": [[f.local_name, f.remote_name, f.size, f.sha256] for f in self.sst_files],
            "db_files": {k: base64.b64encode(v).decode() for k, v in sorted(self.db_files.items())},
        }
        if self.key_count is not None and self.content_sha256 is not None:  # optional: older readers ignore them
            payload["key_count"] = self.key_count
            payload["content_sha256"] = self.content_sha256
        return encode_frame(MAGIC, FORMAT_VERSION, payload)

    @classmethod
    def from_bytes(cls, data: bytes, name: str) -> SnapshotManifest:
        """Parse a manifest; every name in it is checked against its shape (`names`), and no two files
        of the snapshot share a local name, so restoring it writes only the files it names, in its directory."""
        p = decode_whole_frame(data, MAGIC, FORMAT_VERSION, name)
        ssts: list[SstFile] = []
        try:
            for entry in require(p, "sst_files", list, name):
                local, remote, size, digest = entry
                if (
                    type(size) is not int
                    or not 0 <= size <= MAX_COUNT
                    or type(digest) is not str
                    or not _SHA256.fullmatch(digest)
                ):
                    raise ValueError("an SST entry's size or SHA-256 is malformed")
                ssts.append(
                    SstFile(
                        name_from_file(local, Shape.SST_LOCAL, name, "'sst_files' local name"),
                        name_from_file(remote, Shape.SST_REMOTE, name, "'sst_files' remote name"),
                        size,
                        digest,
                    )
                )
            db_files = {
                name_from_file(k, Shape.DB_FILE, name, "'db_files'"): base64.b64decode(v, validate=True)
                for k, v in require(p, "db_files", dict, name).items()
            }
            cfs = tuple(
                column_family_from_file(c, name, "'column_families'") for c in require(p, "column_families", list, name)
            )
        except (TypeError, ValueError):
            raise CorruptFileError("malformed file list in snapshot manifest", name) from None
        if sum(f.size for f in ssts) > MAX_COUNT:
            raise CorruptFileError(f"its SST files claim more than {MAX_COUNT} bytes", name)
        local_names = [f.local_name for f in ssts] + list(db_files)
        if len(set(local_names)) != len(local_names):
            raise CorruptFileError("two files of the snapshot share a local name", name)
        created = created_at(p, name)
        return cls(
            operator=name_from_file(require(p, "operator", str, name), Shape.OPERATOR, name, "'operator'"),
            partition=require(p, "partition", int, name),
            version=require(p, "version", int, name),
            checkpoint_id=name_from_file(
                require(p, "checkpoint_id", str, name), Shape.CHECKPOINT_ID, name, "'checkpoint_id'"
            ),
            sst_files=tuple(ssts),
            db_files=db_files,
            column_families=cfs,
            num_keys=_count(p, "num_keys", name),
            created_at=created,
            **_content(p, name),
        )


def _content(p: dict[str, Any], name: str) -> dict[str, Any]:
    """The optional `key_count` and `content_sha256` (both or neither; absent in older manifests)."""
    count, digest = p.get("key_count"), p.get("content_sha256")
    if count is None and digest is None:
        return {}
    if (
        type(count) is not int
        or not 0 <= count <= MAX_COUNT
        or type(digest) is not str
        or not _SHA256.fullmatch(digest)
    ):
        raise CorruptFileError("malformed key_count or content_sha256 in snapshot manifest", name)
    return {"key_count": count, "content_sha256": digest}


def _count(p: dict[str, Any], key: str, name: str) -> int:
    value = require(p, key, int, name)
    if not 0 <= value <= MAX_COUNT:
        raise CorruptFileError(f"field {key!r} holds {shown(value)}, not a count of 0 to {MAX_COUNT}", name)
    return int(value)


_SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_COUNT = (1 << 63) - 1
"""A count or size in a manifest (keys, an SST's bytes, all of them): a signed 64-bit long, as the catalog holds
each; 2**64 made its insert raise OverflowError."""
