"""Compiled structs per null pattern of a fixed-width value row (the typed codec's null fast path).

A value row of fixed-width fields is ``bitmap | slots`` (store/formats/typed_codec.py). A row with
nulls keeps zeros in the null fields' slots; a ``struct`` format with pad bytes (``x``, written as
zeros) in those slots packs the non-null fields in one call with exactly the bytes the checked path
writes. Each null combination seen gets its own compiled struct, found by the row's null flags when
encoding and by its header bytes when decoding; the cache is bounded, past it rows take the checked
path.
"""

from __future__ import annotations

import itertools
import operator
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

MAX_NULL_PATTERNS = 256
"""Null patterns a codec keeps compiled structs for (a wide row with many patterns falls back past it)."""


@dataclass(frozen=True, slots=True)
class NullPattern:
    """One combination of null fields of a fixed-width row, compiled."""

    row: struct.Struct
    """Header (fixed prefix and bitmap) then the non-null slots; each null slot is pad (zero) bytes."""
    header: bytes
    keep: tuple[bool, ...]
    """Which fields are not null (for ``itertools.compress``)."""
    spread: tuple[int, ...]
    """Per field, its index in the fully unpacked row (nulls: -1, the None appended to it)."""


class NullPatterns:
    """Compiled structs per null pattern of a fixed-width row behind a fixed `head` (bounded cache)."""

    def __init__(self, formats: Sequence[str], nbytes: int, head: bytes, not_null: int) -> None:
        self.formats = list(formats)
        self.nbytes = nbytes
        self.head = head
        self.not_null = not_null
        self._nones = (None,) * len(self.formats)
        self._by_flags: dict[tuple[bool, ...], NullPattern | None] = {}
        self._by_header: dict[bytes, NullPattern | None] = {}
        self.spreads: dict[bytes, tuple[int, ...]] = {}
        """Header -> `NullPattern.spread` of the patterns compiled so far (read it first, then `spread`)."""
        self.singles: list[tuple[Callable[..., bytes], bytes] | None] = []
        """Per field, (pack, header) of the row where only that field is null (None: not nullable)."""
        for i in range(len(self.formats)):
            one = self._compile(1 << i)
            self.singles.append(None if one is None else (one.row.pack, one.header))

    def _compile(self, nulls: int) -> NullPattern | None:
        if nulls & self.not_null or nulls >> len(self.formats):
            return None  # a null in a non-nullable field, or bits of no field: the checked paths say which
        keep = tuple(not nulls >> i & 1 for i in range(len(self.formats)))
        fmt = "".join(f if k else f"{struct.calcsize('<' + f)}x" for f, k in zip(self.formats, keep, strict=True))
        header = self.head + nulls.to_bytes(self.nbytes, "little")
        spread = tuple(i + 1 if k else -1 for i, k in enumerate(keep))
        return NullPattern(struct.Struct(f"<{len(header)}s{fmt}"), header, keep, spread)

    def _remember(self, flags: tuple[bool, ...], header: bytes, nulls: int) -> NullPattern | None:
        pattern = self._compile(nulls)
        if len(self._by_flags) < MAX_NULL_PATTERNS:  # racing threads store equal values: harmless
            self._by_flags[flags] = pattern
            self._by_header[header] = pattern
            if pattern is not None:
                self.spreads[header] = pattern.spread
        return pattern

    def pack(self, row: tuple[Any, ...]) -> bytes | None:
        """The bytes of a row with nulls (None: a case for the checked path, which names the problem)."""
        if row.count(None) == 1:
            i = row.index(None)
            single = self.singles[i]
            return None if single is None else single[0](single[1], *row[:i], *row[i + 1 :])
        flags = tuple(map(operator.is_, row, self._nones))
        pattern = self._by_flags.get(flags)
        if pattern is None:
            if flags in self._by_flags:
                return None
            nulls = sum(1 << i for i, f in enumerate(flags) if f)
            pattern = self._remember(flags, self.head + nulls.to_bytes(self.nbytes, "little"), nulls)
            if pattern is None:
                return None
        return pattern.row.pack(pattern.header, *itertools.compress(row, pattern.keep))

    def spread(self, header: bytes) -> tuple[int, ...] | None:
        """Where each field of a row with this header sits in its full unpacking (None: not a null header)."""
        pattern = self._by_header.get(header)
        if pattern is None:
            if header in self._by_header or not header.startswith(self.head):
                return None
            nulls = int.from_bytes(header[len(self.head) :], "little")
            flags = tuple(bool(nulls >> i & 1) for i in range(len(self.formats)))
            pattern = self._remember(flags, header, nulls)
            if pattern is None:
                return None
        return pattern.spread


__all__ = ["MAX_NULL_PATTERNS", "NullPattern", "NullPatterns"]
