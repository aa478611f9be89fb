"""Small self-describing files: magic, format version, length, JSON payload, CRC32.

Commit records, snapshot manifests and changelog headers share this frame, so one reader detects
truncation, corruption, a wrong kind of file and an unknown format version, and names the file.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

from statekeeper.store.errors import CorruptFileError, UnsupportedFormatError

# magic(4) format_version(u16) reserved(u16) payload_len(u32)
FRAME_HEAD = struct.Struct("<4sHHI")
CRC = struct.Struct("<I")


def encode_frame(magic: bytes, format_version: int, payload: dict[str, Any]) -> bytes:
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    head = FRAME_HEAD.pack(magic, format_version, 0, len(body))
    return head + body + CRC.pack(zlib.crc32(body, zlib.crc32(head)))


def check_magic_and_version(head: bytes, magic: bytes, supported: int, name: str) -> int:
    """Validate a frame head; returns the payload length."""
    if len(head) < FRAME_HEAD.size:
        raise CorruptFileError(f"file is truncated ({len(head)} bytes, no complete header)", name)
    got_magic, version, _reserved, length = FRAME_HEAD.unpack_from(head)
    if got_magic != magic:
        raise CorruptFileError(f"wrong magic {got_magic!r} (expected {magic!r}); not a file of this kind", name)
    if version > supported or version == 0:
        raise UnsupportedFormatError(
            f"format version {version} is not supported (this release reads up to {supported})", name
        )
    return int(length)


def decode_frame(data: bytes, magic: bytes, supported: int, name: str) -> tuple[dict[str, Any], int]:
    """Parse one frame at the start of `data`; returns (payload, bytes consumed)."""
    length = check_magic_and_version(data[: FRAME_HEAD.size], magic, supported, name)
    end = FRAME_HEAD.size + length
    if len(data) < end + CRC.size:
        raise CorruptFileError(f"file is truncated (header says {length} payload bytes)", name)
    body = data[FRAME_HEAD.size : end]
    (crc,) = CRC.unpack_from(data, end)
    if crc != zlib.crc32(body, zlib.crc32(data[: FRAME_HEAD.size])):
        raise CorruptFileError("checksum mismatch in header", name)
    try:
        payload = json.loads(body)
    except ValueError as e:
        raise CorruptFileError(f"header is not valid JSON ({e})", name) from None
    if not isinstance(payload, dict):
        raise CorruptFileError("header is not a JSON object", name)
    return payload, end + CRC.size


def decode_whole_frame(data: bytes, magic: bytes, supported: int, name: str) -> dict[str, Any]:
    payload, used = decode_frame(data, magic, supported, name)
    if used != len(data):
        raise CorruptFileError(f"{len(data) - used} unexpected bytes after the payload", name)
    return payload


def require(payload: dict[str, Any], key: str, kind: type, name: str) -> Any:
    """Fetch a typed field from a decoded payload, naming the file and field when it is wrong."""
    value = payload.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CorruptFileError(f"field {key!r} is missing or not {kind.__name__}", name)
    return value
