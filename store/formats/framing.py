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
from statekeeper.store.formats.limits import MAX_FRAME_PAYLOAD, MAX_JSON_DEPTH
from statekeeper.store.formats.names import shown

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
    if length > MAX_FRAME_PAYLOAD:
        raise CorruptFileError(f"header claims a {length}-byte payload, above the {MAX_FRAME_PAYLOAD}-byte limit", name)
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
    payload = parse_json(body, name, "header")
    if not isinstance(payload, dict):
        raise CorruptFileError("header is not a JSON object", name)
    return payload, end + CRC.size


_NOT_STRUCTURAL = bytes(range(256)).translate(None, b'"[]{}')
_BRACES_AS_BRACKETS = bytes.maketrans(b"{}", b"[]")


def json_depth(data: bytes, limit: int = MAX_JSON_DEPTH) -> int:
    """How deep the arrays and objects of JSON text `data` nest, up to `limit + 1` (past it, or when its
    brackets do not match, it returns `limit + 1`): checked before parsing, as the parser recurses.

    In C, linear: escapes dropped, everything but quotes and brackets dropped (braces counted as brackets;
    the parser checks they match), strings holding no bracket dropped (adjacent quotes), then the innermost
    pairs removed once per level. Text whose strings hold
    brackets (rare: a column family named so) is parsed and the value walked instead, the parser stopping
    itself at the interpreter's recursion limit.
    """
    text = data.replace(b"\\\\", b"").replace(b'\\"', b"") if b"\\" in data else data
    marks = text.translate(_BRACES_AS_BRACKETS, _NOT_STRUCTURAL).replace(b'""', b"")
    if b'"' in marks:  # the original text: with its escapes dropped, two keys may become one
        return _value_depth(json.loads(data), limit)
    depth = 0
    while marks:
        if depth > limit:
            break
        shorter = marks.replace(b"[]", b"")
        if len(shorter) == len(marks):  # unbalanced brackets: not JSON
            return limit + 1
        marks, depth = shorter, depth + 1
    return depth


def _value_depth(value: Any, limit: int) -> int:
    containers = (list, dict)
    stack = [(value, 1)] if isinstance(value, containers) else []
    deepest = 0
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return depth
        deepest = max(deepest, depth)
        children = node.values() if isinstance(node, dict) else node
        stack.extend([(c, depth + 1) for c in children if isinstance(c, containers)])
    return deepest


def parse_json(data: bytes, name: str, what: str = "content") -> Any:
    """JSON read from file `name`, its nesting capped at `MAX_JSON_DEPTH` (checked before parsing); any
    failure to decode it (bad JSON or UTF-8, too deep, too large) is a `CorruptFileError` naming the file."""
    try:
        depth = json_depth(data)
        if depth <= MAX_JSON_DEPTH:
            return json.loads(data)
    except (ValueError, RecursionError, MemoryError, OverflowError, TypeError) as e:
        raise CorruptFileError(f"{what} is not valid JSON ({type(e).__name__}: {str(e)[:200]})", name) from None
    raise CorruptFileError(f"{what} nests {depth} deep, above the limit of {MAX_JSON_DEPTH}", name)


def decode_whole_frame(data: bytes, magic: bytes, supported: int, name: str) -> dict[str, Any]:
    payload, used = decode_frame(data, magic, supported, name)
    if used != len(data):
        raise CorruptFileError(f"{len(data) - used} unexpected bytes after the payload", name)
    return payload


MAX_TIMESTAMP = 253402300799.0
"""The last second of year 9999: the latest time a `datetime` holds (the catalog records times as one)."""


def created_at(payload: dict[str, Any], name: str) -> float:
    """A payload's optional `created_at` in seconds (0.0 when absent, as in records written before it). Anything
    but a number in ``[0, MAX_TIMESTAMP]`` is a `CorruptFileError` naming the file: a NaN, an infinity or an int
    past a float's range would fail (or defeat) every later use of it, an age check or the catalog's datetime."""
    value = payload.get("created_at", 0.0)
    if type(value) in (int, float) and 0 <= value <= MAX_TIMESTAMP:  # False for NaN
        return float(value)
    raise CorruptFileError(f"field 'created_at' holds {shown(value)}, not a time in seconds", name)


def require(payload: dict[str, Any], key: str, kind: type, name: str) -> Any:
    """Fetch a typed field from a decoded payload, naming the file and field when it is wrong."""
    value = payload.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CorruptFileError(f"field {key!r} is missing or not {kind.__name__}", name)
    return value
