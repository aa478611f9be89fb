"""What a snapshot holds, as its manifest records it: the key count and a digest of every column family.

A manifest's checksums say its files arrived intact, not that RocksDB opens them to the state they were
built from: the embedded CURRENT, MANIFEST or OPTIONS, or an SST's local name, can be wrong while every
hash matches. So a snapshot is built from files that were opened and counted (`content_of` on the
checkpoint directory before upload), and maintenance trusts one as a base only once it restored it, opened
it and found the same count and digest again (`check_restored`; DESIGN invariant 14). A load only opens.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import cast

import rocksdict as rd

from statekeeper.store.errors import CorruptFileError
from statekeeper.store.formats.snapshot import SnapshotManifest
from statekeeper.store.rocks import DEFAULT_CF, db_options


def content_of(db_dir: str) -> tuple[int, str]:
    """(key count, SHA-256 over every non-empty column family's sorted items) of the DB at `db_dir`, opened
    read-only; the same digest as `statekeeper.maintenance.replica.content_digest`. Raises whatever RocksDB
    raises when it cannot open the files (rocksdict: a bare `Exception`)."""
    if not os.path.exists(os.path.join(db_dir, "CURRENT")):
        raise FileNotFoundError(f"no CURRENT file in {db_dir}")
    names = [n for n in rd.Rdict.list_cf(db_dir, db_options()) if n != DEFAULT_CF]
    db = rd.Rdict(
        db_dir,
        db_options(),
        column_families={n: db_options() for n in names},
        access_type=rd.AccessType.read_only(),
    )
    try:
        h = hashlib.sha256()
        keys = 0
        for cf in sorted([DEFAULT_CF, *names]):
            first = True
            items = cast(Iterator[tuple[bytes, bytes]], (db if cf == DEFAULT_CF else db.get_column_family(cf)).items())
            for k, v in items:
                if first:
                    h.update(b"\x00cf" + len(cf).to_bytes(2, "little") + cf.encode())
                    first = False
                h.update(len(k).to_bytes(4, "little") + k + len(v).to_bytes(4, "little") + v)
                keys += 1
        return keys, h.hexdigest()
    finally:
        db.close()


def check_restored(manifest: SnapshotManifest, db_dir: str, name: str) -> tuple[int, str]:
    """Open the snapshot restored at `db_dir` and compare it with what its manifest recorded at build time;
    returns (key count, digest). Raises `CorruptFileError` naming the manifest (`name`) when it does not open
    or holds something else. A manifest written before the fields existed is only opened and counted."""
    try:
        found = content_of(db_dir)
    except Exception as e:  # rocksdict has no exception classes: anything is a bad snapshot
        raise CorruptFileError(f"RocksDB cannot open the restored snapshot ({e})", name) from None
    if manifest.key_count is not None and found != (manifest.key_count, manifest.content_sha256):
        raise CorruptFileError(
            f"the snapshot opens to {found[0]} keys with another digest than the {manifest.key_count} keys it "
            "recorded when it was built",
            name,
        )
    return found


__all__ = ["check_restored", "content_of"]
