"""The caps every reader applies to what a checkpoint file claims (DESIGN invariant 12).

A length, a size or a nesting depth read from a file is a claim, not a fact: each is checked against
the cap here before anything is allocated, decompressed or recursed into, so hostile content costs at
most a bounded amount of memory, time and temp disk. docs/formats.md ("Limits") gives each value and why.
"""

from __future__ import annotations

MiB = 1 << 20

MAX_FRAME_PAYLOAD = 64 * MiB
"""A commit record's, manifest's or changelog header's JSON payload. The largest real ones are manifests
(small RocksDB files inlined, each kept under 8 KiB by `rocks.MAX_MANIFEST_BYTES`, plus ~150 bytes per SST)."""

MAX_WHOLE_FILE = 256 * MiB
"""A file read into memory whole (`read_bytes`): the small files (frames, JSON records) and nothing else."""

MAX_JSON_DEPTH = 32
"""Nesting of any JSON a reader parses; the formats nest at most 4 deep, and Python's parser recurses."""

MAX_KEY_BYTES = 16 * MiB
"""A key (a record's, a range delete's end): checked at `put`, refused as corruption in a changelog."""

MAX_VALUE_BYTES = 128 * MiB
"""A value: checked at `put` (naming the key), refused as corruption in a changelog. The format's own
field would hold 2 GiB; the cap keeps one block, which a reader holds decoded, small."""

MAX_BLOCK_BYTES = 256 * MiB
"""A record block's decoded size (its lengths, keys and values). The writer splits any larger batch into
several blocks (one record always fits: 8 + `MAX_KEY_BYTES` + `MAX_VALUE_BYTES` is below it); a reader
refuses a block claiming more before decompressing it, so a zstd bomb cannot make it allocate more."""

MAX_COLUMN_FAMILY_BYTES = 255
"""A column family name, UTF-8 (its length is one byte in a changelog block)."""

MAX_SCHEMA_DEPTH = 64
"""Types nested in a state schema (a struct in an array in a struct: 3). The typed codec recurses per level, so a
schema from a checkpoint nested a few hundred deep would exhaust Python's stack; real schemas nest a few levels.
Declared schemas are held to it too, so nothing written is refused on reading."""

MAX_SCHEMA_VERSIONS = 1024
"""Schemas recorded for one state variable (each declared change of its value schema adds one)."""

MAX_COLUMN_FAMILIES = 4096
"""Column families of one store. Each is a RocksDB column family, created on first use: a changelog or snapshot
naming more would cost a load unbounded time and memory."""

MAX_STATE_VARIABLES = 4000
"""State variables recorded in a typed state's ``__meta``: each has a column family, and the state a few more
of its own (timers, TTL index, ``__meta``), all within `MAX_COLUMN_FAMILIES`."""

MAX_SCHEMA_BYTES = 1 * MiB
"""One recorded schema's JSON (a state variable's value schema, its map key's, the grouping key's) and a
variable's record: ~15,000 fields. A wider schema is refused where it is declared."""

MAX_SCHEMAS_BYTES = 16 * MiB
"""All the schema JSON a typed state records for its variables (every variable's record and schemas): a
reader (the state reader, maintenance's typed check) holds it all decoded, about ten times its bytes (~180 MB). A
declaration that would record more is refused; 4,000 variables of 1 KiB schemas record 4 MiB."""

__all__ = [
    "MAX_BLOCK_BYTES",
    "MAX_COLUMN_FAMILIES",
    "MAX_COLUMN_FAMILY_BYTES",
    "MAX_FRAME_PAYLOAD",
    "MAX_JSON_DEPTH",
    "MAX_KEY_BYTES",
    "MAX_SCHEMAS_BYTES",
    "MAX_SCHEMA_BYTES",
    "MAX_SCHEMA_DEPTH",
    "MAX_SCHEMA_VERSIONS",
    "MAX_STATE_VARIABLES",
    "MAX_VALUE_BYTES",
    "MAX_WHOLE_FILE",
    "MiB",
]
