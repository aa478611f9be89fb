"""The one rule for every name read from a checkpoint file (DESIGN invariant 12).

A name taken from file content (a checkpoint id, an operator, an SST's local or remote name, a small
RocksDB file's name, a column family) is checked here against the exact shape docs/formats.md gives it
before anything uses it: a path component only if it is that shape (so one component, never `..`,
`/abs` or empty), and a join only if the result stays in its directory. Anything else is a
`CorruptFileError` naming the file and the field. Readers call these; they never join names themselves.
"""

from __future__ import annotations

import enum
import os
import re

from statekeeper.store.errors import ConfigurationError, CorruptFileError
from statekeeper.store.formats.limits import MAX_COLUMN_FAMILY_BYTES

_SHOWN = 80
"""How much of a refused value an error message repeats (a hostile one may be megabytes)."""


class Shape(enum.Enum):
    """The shapes of names docs/formats.md defines, each a full-match pattern and what it is called."""

    CHECKPOINT_ID = (r"[0-9a-f]{32}", "checkpoint id (32 lowercase hex digits)")
    OPERATOR = (r"(?!.*\.\.)[A-Za-z0-9_][A-Za-z0-9_.=+-]{0,199}", "operator name (1-200 of A-Z a-z 0-9 _ . = + -)")
    SST_LOCAL = (r"[0-9]{1,20}\.sst", "RocksDB SST file name (<number>.sst)")
    SST_REMOTE = (r"[0-9a-f]{40}\.sst|[0-9a-f]{64}\.sst", "content-derived SST name (<sha256[:40] or sha256>.sst)")
    DB_FILE = (
        r"CURRENT|IDENTITY|rocksdict-config\.json|(?:MANIFEST|OPTIONS)-[0-9]{1,20}|[0-9]{1,20}\.(?:log|blob)",
        "RocksDB file name (CURRENT, IDENTITY, MANIFEST-<n>, OPTIONS-<n>, <n>.log, rocksdict-config.json)",
    )

    def __init__(self, pattern: str, what: str) -> None:
        self.regex = re.compile(pattern)
        self.what = what


def shown(value: object) -> str:
    """`value`'s repr, cut short: what an error message may quote of untrusted content."""
    try:
        text = repr(value) if isinstance(value, str | bytes | int | float | bool | type(None)) else type(value).__name__
    except (ValueError, RecursionError):  # an int too long to print
        text = type(value).__name__
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(text)} characters)"


def name_from_file(value: object, shape: Shape, file: str, field: str) -> str:
    """`value` if it is a str of `shape`, else `CorruptFileError` naming `file` and `field`."""
    if type(value) is str and shape.regex.fullmatch(value):
        return value
    raise CorruptFileError(f"field {field} holds {shown(value)}, which is not a {shape.what}", file)


def join_inside(directory: str, name: str, shape: Shape, file: str, field: str) -> str:
    """`directory`/`name` for a `name` read from `file`: checked by `name_from_file`, then the joined path
    must still lie directly in `directory` (the only route by which such a name becomes a local path)."""
    name_from_file(name, shape, file, field)
    path = os.path.join(directory, name)
    if os.path.dirname(os.path.normpath(path)) != os.path.normpath(directory):
        raise CorruptFileError(f"field {field} holds {shown(name)}, which leaves its directory", file)
    return path


def _column_family_problem(name: object) -> str | None:
    if type(name) is not str:
        return "is not a string"
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if not 0 < size <= MAX_COLUMN_FAMILY_BYTES:
        return f"has {size} bytes (1-{MAX_COLUMN_FAMILY_BYTES})"
    if "\x00" in name:
        return "contains a NUL byte"
    return None


def column_family_from_file(raw: bytes | str, file: str, field: str) -> str:
    """A column family name read from `file` (bytes are UTF-8); `CorruptFileError` if not a valid one."""
    try:
        name = raw.decode() if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise CorruptFileError(f"field {field} holds {shown(raw)}, which is not UTF-8", file) from None
    problem = _column_family_problem(name)
    if problem is not None:
        raise CorruptFileError(f"field {field}: column family name {shown(name)} {problem}", file)
    return name


def validate_column_family(name: object) -> str:
    """A column family name given to the API: what a changelog block and a manifest can hold."""
    problem = _column_family_problem(name)
    if problem is not None:
        raise ConfigurationError(f"invalid column family name {shown(name)}: it {problem}")
    return name  # type: ignore[return-value]


__all__ = ["Shape", "column_family_from_file", "join_inside", "name_from_file", "shown", "validate_column_family"]
