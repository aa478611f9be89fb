"""The hostile-content matrix's classes, readers and outcomes (DESIGN invariant 12), shared by its test
(tests/reliability/test_hostile_matrix.py, which checks every cell it runs against `EXPECTED` and can write
what it saw as JSON) and `python -m bench reliability` (which turns that JSON into docs/reliability.md's
table, `rows`)."""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

from statekeeper.store.formats import changelog as cl
from statekeeper.store.formats.framing import CRC, FRAME_HEAD

CLASSES = {
    "path names": "a manifest naming an SST `<outside>/evil.sst` and a file `../../../evil`",
    "lineage": "the newest changelog, well framed, extending an attempt no commit record names",
    "unopenable snapshot": "the newest snapshot's CURRENT names a MANIFEST that is not there (every checksum right)",
    "special or oversized file": "a FIFO where the newest manifest belongs (local); a manifest past the whole-file "
    "cap (S3, the cap lowered to 64 KiB for the test)",
    "malformed frame": "the newest changelog's header, checksum right, nested 100,000 deep",
}
"""Each hostile class and what the matrix plants in the first of two stores (written by the product's encoders)."""

READERS = [
    "load",
    "reader",
    "change feed",
    "inspect",
    "verify",
    "verify --rebuild",
    "catalog sync",
    "clean-orphans",
    "expire",
    "snapshot",
]
"""In the order the matrix runs them on one planted root (later ones see what earlier ones wrote)."""
TYPED_READERS = ("reader", "change feed")
"""The state data source's typed read and its change feed (`readChangeFeed`): they read typed state, so the
matrix runs them on a root of their own (a typed operator), with the same class planted the same way."""

BACKENDS = ["local", "s3"]

_LOCAL = {
    "path names": {
        "load": "repaired",
        "reader": "repaired",
        "change feed": "repaired",
        "inspect": "exit 1, file named",
        "verify": "exit 1, file named",
        "verify --rebuild": "exit 1, file named",
        "catalog sync": "exit 1, file named",
        "clean-orphans": "exit 1, file named",
        "expire": "exit 1, file named",
        "snapshot": "exit 0",
    },
    "lineage": {
        "load": "repaired",
        "reader": "repaired",
        "change feed": "refused (LineageError), file named",
        "inspect": "exit 0",
        "verify": "exit 1, file named",
        "verify --rebuild": "exit 1, file named",
        "catalog sync": "exit 0",
        "clean-orphans": "exit 0",
        "expire": "exit 0",
        "snapshot": "exit 1, file named",
    },
    "unopenable snapshot": {
        "load": "repaired",
        "reader": "repaired",
        "change feed": "repaired",
        "inspect": "exit 0",
        "verify": "exit 1, file named",
        "verify --rebuild": "exit 1, file named",
        "catalog sync": "exit 0",
        "clean-orphans": "exit 1, file named",
        "expire": "exit 1, file named",
        "snapshot": "exit 0",
    },
    "special or oversized file": {
        "load": "loaded",
        "reader": "read exactly, file named",
        "change feed": "read exactly, file named",
        "inspect": "exit 1, file named",
        "verify": "exit 1, file named",
        "verify --rebuild": "exit 1, file named",
        "catalog sync": "exit 0, file named",
        "clean-orphans": "exit 1, file named",
        "expire": "exit 1, file named",
        "snapshot": "exit 0",
    },
    "malformed frame": {
        "load": "refused (CorruptFileError), file named",
        "reader": "refused (CorruptFileError), file named",
        "change feed": "refused (CorruptFileError), file named",
        "inspect": "exit 0",
        "verify": "exit 1, file named",
        "verify --rebuild": "exit 1, file named",
        "catalog sync": "exit 0",
        "clean-orphans": "exit 0",
        "expire": "exit 0",
        "snapshot": "exit 1, file named",
    },
}
_S3_DIFFERS: dict[str, dict[str, str]] = {
    "special or oversized file": {
        "load": "repaired",
        "reader": "repaired",
        "change feed": "repaired",
        "catalog sync": "exit 1, file named",
    }
}
"""Where S3 differs: no FIFO on S3, so its oversized manifest is read, refused and repaired around."""

EXPECTED: dict[str, dict[str, dict[str, str]]] = {
    "local": _LOCAL,
    "s3": {c: {**per, **_S3_DIFFERS.get(c, {})} for c, per in _LOCAL.items()},
}
"""backend -> class -> reader -> outcome. `refused (E), file named`: the reader raised E naming the file;
`repaired`: it loaded the exact state around the file, counted as a repair; `read exactly`: a typed reader gave
exactly the rows an undamaged copy of the root gives, without a repair (`, file named`: it warned of the file);
`loaded`: it never saw the file (a local listing does not list a FIFO) and loaded the exact state; `exit N, file
named`: the command exited N naming the file; a bare `exit 0`: the command reads no such file (inspect reads no
changelog, expire and clean-orphans plan from commit records and manifests) or worked around it (snapshot writes
a fresh one). Every cell also had 0 writes outside the root and work directory, canaries intact, no hang (each
reader under a minute), bounded RSS and temp disk, and every retained version the file is not part of loading
exactly."""


def rows(outcomes: dict[str, dict[str, dict[str, str]]]) -> list[list[str]]:
    """One row per (class, backend) the outcomes cover: the class, the backend, then each reader's outcome."""
    return [
        [cls, backend, *[per[cls].get(r, "not run") for r in READERS]]
        for cls in CLASSES
        for backend, per in sorted(outcomes.items())
        if cls in per
    ]


def framed(payload: bytes, magic: bytes, version: int) -> bytes:
    """`payload` in a frame of the format `magic` / `version`, its checksum right."""
    head = FRAME_HEAD.pack(magic, version, 0, len(payload))
    return head + payload + CRC.pack(zlib.crc32(payload, zlib.crc32(head)))


def reframed_changelog(header: cl.ChangelogHeader, original: bytes) -> bytes:
    """`original`'s blocks behind a new header frame (the blocks' own framing untouched): a changelog, every
    checksum right, that claims what `header` says."""
    old_len = FRAME_HEAD.unpack_from(original)[3]
    blocks = original[FRAME_HEAD.size + old_len + CRC.size :]
    payload = json.dumps(header.to_payload(), separators=(",", ":"), sort_keys=True).encode()
    return framed(payload, cl.MAGIC, cl.FORMAT_VERSION) + blocks


__all__ = [
    "BACKENDS",
    "CLASSES",
    "EXPECTED",
    "READERS",
    "TYPED_READERS",
    "framed",
    "reframed_changelog",
    "rows",
    "tree_contents",
]


def tree_contents(top: Path, skip: tuple[Path, ...]) -> dict[str, bytes]:
    """Every file under `top` but under `skip` with its bytes (special files as ``<special>``, never opened): the
    canaries a hostile-content test compares before and after, to show nothing outside the root was written."""
    out = {}
    for dirpath, dirs, files in os.walk(top):
        if any(Path(dirpath).is_relative_to(s) for s in skip):
            dirs[:] = []
            continue
        for f in files:
            p = Path(dirpath) / f
            out[str(p)] = p.read_bytes() if p.is_file() and not p.is_symlink() else b"<special>"
    return out
