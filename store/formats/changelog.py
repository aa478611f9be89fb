"""The changelog: one commit attempt's updates to one store, streamed in compressed columnar blocks.

Layout (all integers little-endian; docs/formats.md has the full table)::

    frame   magic "SKCL", format version, JSON header (identity, version, checkpoint id, lineage, codec)
    block*  0x01, cf name, record count, raw and compressed sizes, CRC32, zstd payload
            payload = key lengths u32[n] | value lengths i32[n] (-1: delete) | keys | values
            or 0x02, cf name, record count, size, CRC32, an SST file (a bulk load: ingested on replay)
            or 0x03, cf name, start and end keys, CRC32 (a range delete: one tombstone on replay)
    footer  0xFF, block count u32, record count u64, CRC32, end magic "SKCE"

The writer never holds more than one block per column family in memory; the reader streams blocks
and checks each CRC, and a missing footer (truncation) is detected before any record is applied.
"""

from __future__ import annotations

import functools
import io
import os
import struct
import sys
import time
import zlib
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, chain, pairwise
from typing import Any, BinaryIO

import zstandard

from statekeeper.store.errors import CorruptFileError
from statekeeper.store.formats.framing import (
    FRAME_HEAD,
    check_magic_and_version,
    created_at,
    decode_frame,
    encode_frame,
    require,
)
from statekeeper.store.formats.limits import MAX_BLOCK_BYTES, MAX_KEY_BYTES, MAX_VALUE_BYTES
from statekeeper.store.formats.names import Shape, column_family_from_file, name_from_file, shown

MAGIC = b"SKCL"
END_MAGIC = b"SKCE"
FORMAT_VERSION = 1
BLOCK_DATA = 0x01
BLOCK_SST = 0x02
BLOCK_RANGE_DELETE = 0x03
BLOCK_END = 0xFF
_BLOCK_HEAD = struct.Struct("<IIII")  # records, raw_len, comp_len, crc32
_SST_HEAD = struct.Struct("<QQI")  # records, size, crc32
_COPY_BYTES = 1 << 20
DELETED = -1
"""The value length that marks a delete in a record block; any other negative length is corruption."""
_FIELD_CF = "column family of a block"
_FOOTER = struct.Struct("<BIQI4s")  # kind, blocks, records, crc32(blocks, records), end magic
FOOTER_SIZE = _FOOTER.size
_LITTLE = sys.byteorder == "little"

Lineage = tuple[tuple[int, str], ...]
"""Ancestors of a version, newest first: ((version - 1, id), (version - 2, id), ...)."""


@dataclass(frozen=True)
class ChangelogHeader:
    operator: str
    partition: int
    version: int
    checkpoint_id: str
    lineage: Lineage
    """Committed ancestors back to (at least) the newest snapshot the writer knew of, or to version 1."""
    codec: str = "zstd"
    created_at: float = field(default_factory=time.time)

    def to_payload(self) -> dict[str, Any]:
        return {
            "operator": self.operator,
            "partition": self.partition,
            "version": self.version,
            "checkpoint_id": self.checkpoint_id,
            "lineage": [[v, i] for v, i in self.lineage],
            "codec": self.codec,
            "created_at": self.created_at,
        }

    @classmethod
    def from_payload(cls, p: dict[str, Any], name: str) -> ChangelogHeader:
        raw_lineage = require(p, "lineage", list, name)
        lineage = []
        for entry in raw_lineage:
            if not isinstance(entry, list) or len(entry) != 2 or type(entry[0]) is not int or entry[0] < 0:
                raise CorruptFileError(f"malformed lineage entry {shown(entry)} in changelog header", name)
            lineage.append((entry[0], name_from_file(entry[1], Shape.CHECKPOINT_ID, name, "'lineage'")))
        codec = require(p, "codec", str, name)
        if codec not in ("zstd", "none"):
            raise CorruptFileError(f"unknown codec {shown(codec)}", name)
        created = created_at(p, name)
        return cls(
            operator=name_from_file(require(p, "operator", str, name), Shape.OPERATOR, name, "'operator'"),
            partition=require(p, "partition", int, name),
            version=require(p, "version", int, name),
            checkpoint_id=name_from_file(
                require(p, "checkpoint_id", str, name), Shape.CHECKPOINT_ID, name, "'checkpoint_id'"
            ),
            lineage=tuple(lineage),
            codec=codec,
            created_at=created,
        )


def _u32(values: Sequence[int], typecode: str) -> bytes:
    arr = array(typecode, values)
    if not _LITTLE:
        arr.byteswap()
    return arr.tobytes()


def encode_block_parts(
    keys: Sequence[bytes], values: Sequence[bytes | None], deletes: bool | None = None
) -> tuple[bytes, ...]:
    """The columnar payload as its four parts; `None` values are deletes (`deletes`: whether there are any,
    if the caller knows).

    Kept as parts (not joined) so the compressor and the file take them one by one: joining them
    into one fresh megabyte per block costs more than the rest of the encoding (page faults).
    """
    if None in values if deletes is None else deletes:
        vlens = _u32([DELETED if v is None else len(v) for v in values], "i")
        vdata = b"".join([v for v in values if v is not None])
    else:
        vlens = _u32(list(map(len, values)), "i")  # type: ignore[arg-type]
        vdata = b"".join(values)  # type: ignore[arg-type]
    return _u32(list(map(len, keys)), "I"), vlens, b"".join(keys), vdata


_RUN = 256
"""Fixed-width pieces are cut `_RUN` at a time by one cached `Struct` per width."""


@functools.lru_cache(maxsize=64)
def _run_of(width: int) -> struct.Struct:
    return struct.Struct(f"{width}s" * _RUN)


def _split(raw: bytes, start: int, lengths: array[int], name: str) -> tuple[list[bytes], int]:
    """`raw` from `start` cut into pieces of `lengths` (all >= 0); returns them and where they end.

    Fixed-width pieces (typed keys, fixed-width values: most blocks) are cut in C by `struct`, ~4x faster
    than slicing in a Python loop: runs of `_RUN` by a `Struct` cached per width (~8 KB each), the rest by
    one of its own. Not by a format of the block's whole record count: the module functions cache the last
    100 formats, ~36 bytes per record each, which kept a process replaying changelogs tens to hundreds of
    MB larger.
    """
    n = len(lengths)
    first = lengths[0] if n else 0
    if n and lengths.count(first) == n:
        end = start + first * n
        if end > len(raw):
            raise CorruptFileError("block payload sizes do not add up", name)
        if first == 0:
            return [b""] * n, end
        runs = n // _RUN
        cut = start + first * _RUN * runs
        pieces = list(chain.from_iterable(_run_of(first).iter_unpack(memoryview(raw)[start:cut]))) if runs else []
        if rest := n - runs * _RUN:
            pieces.extend(struct.Struct(f"{first}s" * rest).unpack_from(raw, cut))
        return pieces, end
    offsets = list(accumulate(lengths, initial=start))
    return [raw[a:b] for a, b in pairwise(offsets)], offsets[-1]


def decode_block_payload(raw: bytes, n: int, name: str) -> tuple[list[bytes], list[bytes | None]]:
    klens = array("I")
    vlens = array("i")
    try:
        klens.frombytes(raw[: 4 * n])
        vlens.frombytes(raw[4 * n : 8 * n])
    except ValueError:
        raise CorruptFileError("block payload shorter than its record count", name) from None
    if not _LITTLE:
        klens.byteswap()
        vlens.byteswap()
    if len(klens) != n or len(vlens) != n:
        raise CorruptFileError("block payload shorter than its record count", name)
    keys, vstart = _split(raw, 8 * n, klens, name)
    values: list[bytes | None]
    lowest = min(vlens, default=0)
    if lowest >= 0:
        values, end = _split(raw, vstart, vlens, name)  # type: ignore[assignment]
    elif lowest < DELETED:
        raise CorruptFileError(f"a value length is {lowest}: only {DELETED} (a delete) may be negative", name)
    else:
        values = []
        pos = vstart
        for ln in vlens:
            if ln == DELETED:
                values.append(None)
            else:
                values.append(raw[pos : pos + ln])
                pos += ln
        end = pos
    if end != len(raw) or len(keys) != n:
        raise CorruptFileError("block payload sizes do not add up", name)
    # the caps a writer holds every record to (a key past its cap made a later range delete through it unreadable);
    # only a block holding that many key or value bytes in all is looked at record by record
    if vstart - 8 * n > MAX_KEY_BYTES and max(klens) > MAX_KEY_BYTES:
        raise CorruptFileError(f"a key of {max(klens)} bytes, above the {MAX_KEY_BYTES}-byte limit", name)
    if end - vstart > MAX_VALUE_BYTES and max(vlens) > MAX_VALUE_BYTES:
        raise CorruptFileError(f"a value of {max(vlens)} bytes, above the {MAX_VALUE_BYTES}-byte limit", name)
    return keys, values


@dataclass(frozen=True)
class SstFile:
    """A bulk-loaded block: `records` sorted puts of column family `cf` as one SST file (RocksDB's
    external-file format, written by `SstFileWriter`), replayed by ingesting it."""

    cf: str
    path: str
    """The local copy the reader wrote, owned by the consumer ("" when the reader only checked it)."""
    records: int


@dataclass(frozen=True)
class RangeDelete:
    """A range-delete block: every key of column family `cf` in ``[start, end)`` is deleted."""

    cf: str
    start: bytes
    end: bytes


def _range_body(start: bytes, end: bytes) -> bytes:
    return struct.pack("<I", len(start)) + start + struct.pack("<I", len(end)) + end


class ChangelogWriter:
    """Streams blocks to a local file; `finish` seals it with the footer and fsyncs."""

    def __init__(self, local_path: str, header: ChangelogHeader, *, level: int = 1) -> None:
        self.path = local_path
        self.header = header
        self._file: BinaryIO | None = open(local_path, "wb")  # noqa: SIM115 - closed in finish/abandon
        self._cctx = zstandard.ZstdCompressor(level=level) if header.codec == "zstd" else None
        self._file.write(encode_frame(MAGIC, FORMAT_VERSION, header.to_payload()))
        self.blocks = 0
        self.records = 0

    def append_block(
        self, cf: str, keys: Sequence[bytes], values: Sequence[bytes | None], parts: tuple[bytes, ...] | None = None
    ) -> None:
        """Append one block of `keys` / `values` (None: a delete); `parts`: their `encode_block_parts`, if the
        caller has it already."""
        n = len(keys)
        if n == 0:
            return
        f = self._open_file()
        if parts is None:
            parts = encode_block_parts(keys, values)
        raw_len = sum(map(len, parts))
        if raw_len > MAX_BLOCK_BYTES and n > 1:  # rare (one huge put_batch): blocks a reader may hold
            half = n // 2
            self.append_block(cf, keys[:half], values[:half])
            self.append_block(cf, keys[half:], values[half:])
            return
        if self._cctx is not None:
            stream = self._cctx.compressobj(size=raw_len)
            payload = [stream.compress(p) for p in parts]
            payload.append(stream.flush())
        else:
            payload = list(parts)
        name = cf.encode()
        head = bytes((BLOCK_DATA, len(name))) + name
        sizes = (n, raw_len, sum(map(len, payload)))
        crc = zlib.crc32(head + struct.pack("<III", *sizes))
        for p in payload:
            crc = zlib.crc32(p, crc)
        f.write(head)
        f.write(_BLOCK_HEAD.pack(*sizes, crc))
        for p in payload:
            f.write(p)
        self.blocks += 1
        self.records += n

    def append_sst(self, cf: str, path: str, records: int) -> None:
        """Append the SST file at `path` (sorted puts of `cf`, not compressed again: its blocks are)."""
        f = self._open_file()
        name = cf.encode()
        head = bytes((BLOCK_SST, len(name))) + name
        size = os.path.getsize(path)
        crc = zlib.crc32(head + struct.pack("<QQ", records, size))
        with open(path, "rb") as src:
            while chunk := src.read(_COPY_BYTES):
                crc = zlib.crc32(chunk, crc)
            f.write(head)
            f.write(_SST_HEAD.pack(records, size, crc))
            src.seek(0)
            while chunk := src.read(_COPY_BYTES):
                f.write(chunk)
        self.blocks += 1
        self.records += records

    def append_range_delete(self, cf: str, start: bytes, end: bytes) -> None:
        """Append a range delete of ``[start, end)`` in `cf` (counted as one record)."""
        f = self._open_file()
        name = cf.encode()
        block = bytes((BLOCK_RANGE_DELETE, len(name))) + name + _range_body(start, end)
        f.write(block)
        f.write(struct.pack("<I", zlib.crc32(block)))
        self.blocks += 1
        self.records += 1

    def _open_file(self) -> BinaryIO:
        if self._file is None:
            raise CorruptFileError("changelog already finished", self.path)
        return self._file

    def finish(self) -> int:
        """Write the footer, fsync and close; returns the file size."""
        f = self._open_file()
        self._file = None
        body = struct.pack("<IQ", self.blocks, self.records)
        f.write(_FOOTER.pack(BLOCK_END, self.blocks, self.records, zlib.crc32(body), END_MAGIC))
        f.flush()
        os.fsync(f.fileno())
        size = f.tell()
        f.close()
        return size

    def abandon(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if os.path.exists(self.path):
            os.unlink(self.path)


def _read_exact(f: BinaryIO, n: int, name: str, what: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise CorruptFileError(f"file is truncated in {what}", name)
    return data


def read_header(f: BinaryIO, name: str) -> ChangelogHeader:
    """Read just the header frame (the O(1) metadata read that gives the lineage)."""
    head = f.read(FRAME_HEAD.size)
    length = check_magic_and_version(head, MAGIC, FORMAT_VERSION, name)
    rest = _read_exact(f, length + 4, name, "the header")
    payload, _ = decode_frame(head + rest, MAGIC, FORMAT_VERSION, name)
    return ChangelogHeader.from_payload(payload, name)


class ChangelogReader:
    """Streams the blocks of one changelog, validating every checksum and the footer."""

    def __init__(self, f: BinaryIO, name: str) -> None:
        self._f = f
        self.name = name
        self.header = read_header(f, name)
        self._dctx = zstandard.ZstdDecompressor() if self.header.codec == "zstd" else None
        self._cf_names: dict[bytes, str] = {}
        self.block_bytes = 0
        """The decoded size of the last record block `entries` yielded (its keys, values and their lengths)."""
        self.size: int | None = None
        """The file's size in bytes, once `check_footer` has read it."""

    def check_footer(self) -> tuple[int, int]:
        """On a seekable file, validate the footer before reading blocks; returns (blocks, records)."""
        f = self._f
        pos = f.tell()
        end = self.size = f.seek(0, io.SEEK_END)
        if end - pos < FOOTER_SIZE:
            raise CorruptFileError("file is truncated (no footer)", self.name)
        f.seek(end - FOOTER_SIZE)
        blocks, records = self._parse_footer(f.read(FOOTER_SIZE))
        f.seek(pos)
        return blocks, records

    def _parse_footer(self, data: bytes) -> tuple[int, int]:
        kind, blocks, records, crc, magic = _FOOTER.unpack(data)
        if kind != BLOCK_END or magic != END_MAGIC:
            raise CorruptFileError("file is truncated or corrupt (no valid footer)", self.name)
        if crc != zlib.crc32(struct.pack("<IQ", blocks, records)):
            raise CorruptFileError("checksum mismatch in footer", self.name)
        return int(blocks), int(records)

    def blocks(self) -> Iterator[tuple[str, list[bytes], list[bytes | None]]]:
        """The record blocks; a changelog holding a bulk-loaded SST block is refused (use `entries`)."""
        for entry in self.entries(None):
            if isinstance(entry, (SstFile, RangeDelete)):
                what = "a bulk-loaded SST file" if isinstance(entry, SstFile) else "a range delete"
                raise CorruptFileError(
                    f"a block of column family {entry.cf!r} is {what}, not records: read it with entries()", self.name
                )
            yield entry

    def entries(
        self, sst_dir: str | None
    ) -> Iterator[tuple[str, list[bytes], list[bytes | None]] | SstFile | RangeDelete]:
        """Every block in order: record blocks as (cf, keys, values), SST blocks as `SstFile` copied into
        `sst_dir` (None: checked and skipped), range deletes as `RangeDelete`, each checked against its
        CRC before it is yielded."""
        f, name = self._f, self.name
        seen_blocks = seen_records = 0
        while True:
            kind_b = f.read(1)
            if not kind_b:
                raise CorruptFileError("file is truncated (no footer)", name)
            if kind_b[0] == BLOCK_END:
                blocks, records = self._parse_footer(kind_b + _read_exact(f, FOOTER_SIZE - 1, name, "the footer"))
                if (blocks, records) != (seen_blocks, seen_records):
                    raise CorruptFileError(
                        f"footer counts {blocks} blocks / {records} records, file holds {seen_blocks} / {seen_records}",
                        name,
                    )
                if f.read(1):
                    raise CorruptFileError("unexpected bytes after the footer", name)
                return
            if kind_b[0] not in (BLOCK_DATA, BLOCK_SST, BLOCK_RANGE_DELETE):
                raise CorruptFileError(f"unknown block kind 0x{kind_b[0]:02x}", name)
            name_len = _read_exact(f, 1, name, "a block header")[0]
            cf_b = _read_exact(f, name_len, name, "a block header")
            head = kind_b + bytes((name_len,)) + cf_b
            cf = self._cf_names.get(cf_b) or self._cf_name(cf_b)
            entry: tuple[str, list[bytes], list[bytes | None]] | SstFile | RangeDelete
            if kind_b[0] == BLOCK_SST:
                entry = self._sst(head, cf, sst_dir, seen_blocks)
                n = entry.records
            elif kind_b[0] == BLOCK_RANGE_DELETE:
                entry = self._range_delete(head, cf, seen_blocks)
                n = 1
            else:
                n, raw_len, comp_len, crc = _BLOCK_HEAD.unpack(_read_exact(f, _BLOCK_HEAD.size, name, "a block header"))
                if raw_len > MAX_BLOCK_BYTES or comp_len > MAX_BLOCK_BYTES + (MAX_BLOCK_BYTES >> 4):
                    raise CorruptFileError(
                        f"block {seen_blocks} claims {raw_len} bytes ({comp_len} compressed), above the "
                        f"{MAX_BLOCK_BYTES}-byte limit of a block",
                        name,
                    )
                payload = _read_exact(f, comp_len, name, "a block")
                head += struct.pack("<III", n, raw_len, comp_len)
                if zlib.crc32(payload, zlib.crc32(head)) != crc:
                    raise CorruptFileError(f"checksum mismatch in block {seen_blocks}", name)
                raw = payload if self._dctx is None else self._decompress(payload, raw_len, seen_blocks)
                if len(raw) != raw_len:
                    raise CorruptFileError(f"block {seen_blocks} has {len(raw)} bytes, header says {raw_len}", name)
                keys, values = decode_block_payload(raw, n, name)
                entry = (cf, keys, values)
                self.block_bytes = raw_len
            seen_blocks += 1
            seen_records += n
            yield entry

    def _cf_name(self, raw: bytes) -> str:
        """A block's column family name, checked once per name and file (`names.column_family_from_file`)."""
        cf = self._cf_names[raw] = column_family_from_file(raw, self.name, _FIELD_CF)
        return cf

    def _decompress(self, payload: bytes, raw_len: int, index: int) -> bytes:
        """A block's payload decompressed into at most `raw_len` bytes (its header's claim, capped before):
        zstd trusts a frame's own content size over any output limit, so a frame claiming another size is
        refused before it is decompressed."""
        assert self._dctx is not None
        try:
            claimed = zstandard.frame_content_size(payload)
            if claimed not in (raw_len, -1):
                raise CorruptFileError(
                    f"block {index} holds a zstd frame of {claimed} bytes, its header says {raw_len}", self.name
                )
            return self._dctx.decompress(payload, max_output_size=raw_len)
        except zstandard.ZstdError as e:
            raise CorruptFileError(f"block {index} does not decompress ({e})", self.name) from None

    def _range_delete(self, head: bytes, cf: str, index: int) -> RangeDelete:
        f, name = self._f, self.name
        keys = []
        for what in ("start", "end"):
            (length,) = struct.unpack("<I", _read_exact(f, 4, name, f"the {what} key of a range delete"))
            if length > MAX_KEY_BYTES + 1:  # an end key is at most one byte past the last key
                raise CorruptFileError(f"range delete in block {index} has a {length}-byte {what} key", name)
            keys.append(_read_exact(f, length, name, f"the {what} key of a range delete"))
        (crc,) = struct.unpack("<I", _read_exact(f, 4, name, "a block header"))
        if zlib.crc32(head + _range_body(*keys)) != crc:
            raise CorruptFileError(f"checksum mismatch in block {index} (a range delete)", name)
        if keys[1] < keys[0]:  # RocksDB refuses it; no writer of ours logs one
            raise CorruptFileError(f"range delete in block {index} ends before it starts", name)
        return RangeDelete(cf, keys[0], keys[1])

    def _sst(self, head: bytes, cf: str, sst_dir: str | None, index: int) -> SstFile:
        """Stream an SST block's file into `sst_dir` (or nowhere), checking its CRC; the copy is bounded by
        the changelog's own bytes (a block claiming more than is left is a truncation)."""
        f, name = self._f, self.name
        records, size, crc = _SST_HEAD.unpack(_read_exact(f, _SST_HEAD.size, name, "a block header"))
        if records > size:  # each record takes bytes of the file: a count past its size would reach the load's metrics
            raise CorruptFileError(f"SST block {index} claims {records} records in a file of {size} bytes", name)
        running = zlib.crc32(head + struct.pack("<QQ", records, size))
        path = "" if sst_dir is None else os.path.join(sst_dir, f"replay-{index}-{os.getpid()}-{id(self):x}.sst")
        out = open(path, "wb") if path else None  # noqa: SIM115 - closed below
        try:
            left = size
            while left:
                chunk = f.read(min(left, _COPY_BYTES))
                if not chunk:
                    raise CorruptFileError(f"file is truncated in the SST file of block {index}", name)
                running = zlib.crc32(chunk, running)
                if out is not None:
                    out.write(chunk)
                left -= len(chunk)
            if running != crc:
                raise CorruptFileError(f"checksum mismatch in block {index} (an SST file)", name)
        except BaseException:
            if out is not None:
                out.close()
                os.unlink(path)
            raise
        if out is not None:
            out.close()
        return SstFile(cf, path, records)
