"""Schemas of typed state: the type model, Spark DDL / JSON parsing, inference and evolution rules.

State variables are declared as PySpark declares them (a ``StructType``, a ``DataType`` or a DDL
string such as ``"count long, total long"``). Executors have no JVM to parse DDL, so this module
parses it itself and keeps its own small immutable type model; a schema is persisted as Spark's
JSON form (``StructType.jsonValue()``), so PySpark can read it back with ``StructType.fromJson``.

Evolution (old schema -> new schema, the rules of ``transformWithState``): struct fields may be added
(nullable), removed or reordered, matched by name; ``byte -> short -> int -> long``, ``float -> double``
and ``not null -> nullable`` widen. Anything else is refused with a :class:`SchemaEvolutionError`
naming the state variable, the field and both types. No pyspark import: the codec runs anywhere.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import numbers
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from statekeeper.store.errors import ConfigurationError
from statekeeper.store.formats.framing import json_depth
from statekeeper.store.formats.limits import MAX_SCHEMA_DEPTH

RowFactory = Callable[[tuple[str, ...]], Callable[[tuple[Any, ...]], Any]]
"""``names -> (values tuple -> row)``: how nested structs decode (e.g. as ``pyspark.sql.Row``); None: tuples."""

ATOMIC = (
    "boolean",
    "byte",
    "short",
    "integer",
    "long",
    "float",
    "double",
    "string",
    "binary",
    "date",
    "timestamp",
    "timestamp_ntz",
)
INTEGRAL = ("byte", "short", "integer", "long")
_WIDENS = {
    "byte": ("short", "integer", "long"),
    "short": ("integer", "long"),
    "integer": ("long",),
    "float": ("double",),
}
_DDL_ALIASES = {
    "bool": "boolean",
    "tinyint": "byte",
    "smallint": "short",
    "int": "integer",
    "bigint": "long",
    "real": "float",
    "str": "string",
    "text": "string",
    "varchar": "string",
    "char": "string",
    "bytes": "binary",
    "timestamp_ltz": "timestamp",
}
_DECIMAL_RE = re.compile(r"decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)")


class SchemaError(ConfigurationError):
    """A schema cannot be parsed, inferred, or does not hold a value; the message names the field."""


class ValueTypeError(SchemaError, TypeError):
    """A value that its schema cannot hold (wrong shape, a field of the wrong type); a ``TypeError`` too, as
    PySpark's own state clients raise for a value that is not a tuple of the schema's fields."""


class SchemaEvolutionError(SchemaError):
    """A state variable's declared schema cannot read the values written under its recorded schema."""


@dataclass(frozen=True)
class DataType:
    """An atomic type (``name`` as in Spark's JSON: long, string, decimal(10,2), ...) or a container."""

    name: str
    element: DataType | None = None
    """The element type of an ``array``."""
    contains_null: bool = True
    fields: tuple[Field, ...] = ()
    """The fields of a ``struct``."""
    key: DataType | None = None
    """The key type of a ``map`` (its value type is ``element``, its value nullability ``contains_null``)."""
    depth: int = field(init=False, repr=False, compare=False)
    """Types nested in this one, itself included (an atomic type: 1); at most `MAX_SCHEMA_DEPTH`."""

    def __post_init__(self) -> None:
        inner = [f.type for f in self.fields]
        inner += [t for t in (self.element, self.key) if t is not None]
        depth = 1 + max((t.depth for t in inner), default=0)
        if depth > MAX_SCHEMA_DEPTH:
            raise SchemaError(_too_deep(depth))
        object.__setattr__(self, "depth", depth)

    @property
    def is_struct(self) -> bool:
        return self.name == "struct"

    @property
    def decimal(self) -> tuple[int, int] | None:
        m = _DECIMAL_RE.fullmatch(self.name)
        return (int(m.group(1)), int(m.group(2))) if m else None

    def json_value(self) -> Any:
        if self.name == "array":
            assert self.element is not None
            return {"type": "array", "elementType": self.element.json_value(), "containsNull": self.contains_null}
        if self.name == "map":
            assert self.key is not None and self.element is not None
            return {
                "type": "map",
                "keyType": self.key.json_value(),
                "valueType": self.element.json_value(),
                "valueContainsNull": self.contains_null,
            }
        if self.name == "struct":
            return {"type": "struct", "fields": [f.json_value() for f in self.fields]}
        return self.name

    def to_json(self) -> str:
        return json.dumps(self.json_value(), sort_keys=True, separators=(",", ":"))

    def simple_string(self) -> str:
        """DDL-like text for error messages: ``struct<count:long,total:long>``."""
        if self.name == "array":
            assert self.element is not None
            return f"array<{self.element.simple_string()}>"
        if self.name == "map":
            assert self.key is not None and self.element is not None
            return f"map<{self.key.simple_string()},{self.element.simple_string()}>"
        if self.name == "struct":
            return "struct<" + ",".join(f"{f.name}:{f.type.simple_string()}" for f in self.fields) + ">"
        return self.name


@dataclass(frozen=True)
class Field:
    name: str
    type: DataType
    nullable: bool = True

    def json_value(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type.json_value(), "nullable": self.nullable, "metadata": {}}


def struct(*fields: Field) -> DataType:
    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        raise SchemaError(f"duplicate field names in struct<{', '.join(names)}>")
    return DataType("struct", fields=tuple(fields))


def map_of(key: DataType, value: DataType, value_contains_null: bool = True) -> DataType:
    """A ``map<key, value>`` (value side only: a map cannot be a grouping or map-state key, as in Spark)."""
    return DataType("map", element=value, contains_null=value_contains_null, key=key)


def atomic(name: str) -> DataType:
    name = _DDL_ALIASES.get(name.lower(), name.lower())
    if name == "decimal":
        name = "decimal(10,0)"
    if name in ATOMIC:
        return DataType(name)
    m = _DECIMAL_RE.fullmatch(name)
    if m:
        precision, scale = int(m.group(1)), int(m.group(2))
        if not 1 <= precision <= 38 or scale > precision:
            raise SchemaError(f"decimal({precision},{scale}): precision must be 1..38 and scale <= precision")
        return DataType(f"decimal({precision},{scale})")
    raise SchemaError(f"unsupported type {name!r} in a state schema (supported: {', '.join(ATOMIC)}, decimal(p,s))")


def _too_deep(depth: int) -> str:
    return f"a state schema nests {depth} types deep, above the limit of {MAX_SCHEMA_DEPTH}"


# -- Spark JSON --------------------------------------------------------------------------------
_JSON_LEVELS_PER_TYPE = 3
"""JSON nesting a struct level takes (its object, its fields array, a field's object); arrays and maps take 1."""


def from_json_value(value: Any) -> DataType:
    """Our type from Spark's JSON form (``DataType.jsonValue()``): past `MAX_SCHEMA_DEPTH`, the `DataType` it builds
    refuses it (the walk recurses at most as deep as the JSON, which `from_json` counts first)."""
    if isinstance(value, str):
        return atomic(value)
    if isinstance(value, Mapping):
        kind = value.get("type")
        if kind == "struct":
            return struct(
                *(
                    Field(str(f["name"]), from_json_value(f["type"]), bool(f.get("nullable", True)))
                    for f in value.get("fields", ())
                )
            )
        if kind == "array":
            return DataType(
                "array",
                element=from_json_value(value["elementType"]),
                contains_null=bool(value.get("containsNull", True)),
            )
        if kind == "map":
            return map_of(
                from_json_value(value["keyType"]),
                from_json_value(value["valueType"]),
                bool(value.get("valueContainsNull", True)),
            )
        if kind == "udt" and "sqlType" in value:
            return from_json_value(value["sqlType"])
    raise SchemaError(f"unsupported schema {value!r} (atomic types, decimals, arrays, maps and structs are supported)")


def from_json(text: str | bytes) -> DataType:
    """A schema record (Spark's JSON form) read from a checkpoint: untrusted, its nesting counted before parsing."""
    data = text.encode() if isinstance(text, str) else text
    limit = _JSON_LEVELS_PER_TYPE * MAX_SCHEMA_DEPTH + 1
    try:
        if json_depth(data, limit) > limit:
            raise ValueError(f"it nests more than {MAX_SCHEMA_DEPTH} types deep")
        return from_json_value(json.loads(data))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:  # stored bytes: untrusted
        raise SchemaError(f"unreadable schema record {text[:200]!r}: {str(e)[:200]}") from e


# -- DDL ---------------------------------------------------------------------------------------
_TOKEN = re.compile(r"\s*(?:(`(?:[^`]|``)*`)|([A-Za-z_][A-Za-z0-9_]*)|(\d+)|(.))")


class _Tokens:
    def __init__(self, text: str) -> None:
        self.text = text
        self.items: list[str] = []
        for m in _TOKEN.finditer(text):
            quoted, word, number, sym = m.groups()
            if quoted is not None:
                self.items.append("`" + quoted[1:-1].replace("``", "`"))
            elif word is not None or number is not None:
                self.items.append(word or number)
            elif sym is not None and not sym.isspace():
                self.items.append(sym)
        self.pos = 0

    def peek(self, ahead: int = 0) -> str | None:
        i = self.pos + ahead
        return self.items[i] if i < len(self.items) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok.lower() != expected):
            want = f"{expected!r}" if expected else "more"
            raise SchemaError(f"cannot parse schema {self.text!r}: expected {want}, found {tok!r}")
        self.pos += 1
        return tok


def _name(tok: str) -> str:
    if tok.startswith("`"):
        return tok[1:]
    if not (tok[0].isalnum() or tok[0] == "_"):
        raise SchemaError(f"expected a field name, found {tok!r}")
    return tok


def _ddl_type(t: _Tokens, depth: int = 1) -> DataType:
    if depth > MAX_SCHEMA_DEPTH:
        raise SchemaError(f"cannot parse schema {t.text[:200]!r}: {_too_deep(depth)}")
    word = t.take().lower()
    if word == "array":
        t.take("<")
        element = _ddl_type(t, depth + 1)
        t.take(">")
        return DataType("array", element=element)
    if word == "map":
        t.take("<")
        key = _ddl_type(t, depth + 1)
        t.take(",")
        value = _ddl_type(t, depth + 1)
        t.take(">")
        return map_of(key, value)
    if word == "struct":
        t.take("<")
        fields = []
        while t.peek() != ">":
            name = _name(t.take())
            if t.peek() == ":":
                t.take(":")
            fields.append(_ddl_field_rest(t, name, depth + 1))
            if t.peek() == ",":
                t.take(",")
        t.take(">")
        return struct(*fields)
    if word == "decimal" and t.peek() == "(":
        t.take("(")
        precision = t.take()
        t.take(",")
        scale = t.take()
        t.take(")")
        return atomic(f"decimal({precision},{scale})")
    return atomic(word)


def _ddl_field_rest(t: _Tokens, name: str, depth: int = 2) -> Field:
    typ = _ddl_type(t, depth)
    nullable = True
    if (t.peek() or "").lower() == "not" and (t.peek(1) or "").lower() == "null":
        t.take()
        t.take()
        nullable = False
    return Field(name, typ, nullable)


def parse_ddl(text: str) -> DataType:
    """A DDL schema: ``"a int, b string not null"`` (a struct) or a single type (``"long"``, ``"struct<...>"``)."""
    try:
        return _parse_ddl(text)
    except SchemaError as e:
        if "cannot parse schema" in str(e):
            raise
        raise SchemaError(f"cannot parse schema {text!r}: {e}") from None


def _parse_ddl(text: str) -> DataType:
    t = _Tokens(text)
    if not t.items:
        raise SchemaError("empty schema string")
    first = (t.peek() or "").lower()
    second = t.peek(1)
    single = second is None or (first in ("array", "map", "struct", "decimal") and second in ("<", "("))
    if single:
        typ = _ddl_type(t)
    else:
        fields = []
        while t.peek() is not None:
            name = _name(t.take())
            if t.peek() == ":":
                t.take(":")
            fields.append(_ddl_field_rest(t, name))
            if t.peek() is not None:
                t.take(",")
        typ = struct(*fields)
    if t.peek() is not None:
        raise SchemaError(f"cannot parse schema {text!r}: unexpected {t.peek()!r}")
    return typ


def to_schema(schema: Any, what: str) -> DataType | None:
    """Our type from what a handle accepts: None, a DDL string, a pyspark DataType, or our DataType."""
    if schema is None or isinstance(schema, DataType):
        return schema
    if isinstance(schema, str):
        try:
            return parse_ddl(schema)
        except SchemaError as e:
            raise SchemaError(f"{what}: {e}") from None
    json_value = getattr(schema, "jsonValue", None)
    if callable(json_value):
        try:
            return from_json_value(json_value())
        except SchemaError as e:
            raise SchemaError(f"{what}: {e}") from None
        except RecursionError:  # PySpark's own jsonValue recurses per level
            raise SchemaError(f"{what}: it nests more than {MAX_SCHEMA_DEPTH} types deep") from None
    raise SchemaError(f"{what}: a schema must be a StructType, DataType or DDL string, got {type(schema).__name__}")


def from_arrow(typ: Any, what: str) -> DataType:
    """Our type of a pyarrow type (the grouping-key columns arrive as Arrow)."""
    import pyarrow as pa

    simple = {
        pa.bool_(): "boolean",
        pa.int8(): "byte",
        pa.int16(): "short",
        pa.int32(): "integer",
        pa.int64(): "long",
        pa.float32(): "float",
        pa.float64(): "double",
        pa.string(): "string",
        pa.large_string(): "string",
        pa.binary(): "binary",
        pa.large_binary(): "binary",
        pa.date32(): "date",
    }
    name = simple.get(typ)
    if name is not None:
        return DataType(name)
    if pa.types.is_timestamp(typ):
        return DataType("timestamp" if typ.tz is not None else "timestamp_ntz")
    if pa.types.is_decimal(typ):
        return atomic(f"decimal({typ.precision},{typ.scale})")
    if pa.types.is_struct(typ):
        return struct(*(Field(typ.field(i).name, from_arrow(typ.field(i).type, what)) for i in range(typ.num_fields)))
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return DataType("array", element=from_arrow(typ.value_type, what))
    if pa.types.is_map(typ):
        return map_of(from_arrow(typ.key_type, what), from_arrow(typ.item_type, what))
    raise SchemaError(f"{what}: Arrow type {typ} is not supported in state")


# -- inference ---------------------------------------------------------------------------------
def infer(value: Any, what: str, depth: int = 1) -> DataType:
    """The type of the first value written to a variable declared without a schema."""
    if depth > MAX_SCHEMA_DEPTH:
        raise SchemaError(f"{what}: {_too_deep(depth)}")
    if isinstance(value, tuple):
        names = getattr(value, "__fields__", None) or getattr(value, "_fields", None)
        if not names:
            names = [f"_{i + 1}" for i in range(len(value))]
        pairs = zip(names, value, strict=True)
        return struct(*(Field(str(n), infer(v, f"{what}, field {n!r}", depth + 1)) for n, v in pairs))
    if value is None:
        raise SchemaError(f"{what}: cannot infer a type from None; declare the schema")
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return DataType("boolean")
    if isinstance(value, numbers.Integral):
        return DataType("long")
    if isinstance(value, float | numbers.Real) and not isinstance(value, decimal.Decimal):
        return DataType("double")
    if isinstance(value, str):
        return DataType("string")
    if isinstance(value, bytes | bytearray | memoryview):
        return DataType("binary")
    if isinstance(value, dt.datetime):
        return DataType("timestamp")
    if isinstance(value, dt.date):
        return DataType("date")
    if isinstance(value, decimal.Decimal):
        return DataType("decimal(38,18)")
    if isinstance(value, list):
        first = next((v for v in value if v is not None), None)
        if first is None:
            raise SchemaError(f"{what}: cannot infer an element type from {value!r}; declare the schema")
        return DataType("array", element=infer(first, f"{what}, element", depth + 1))
    if isinstance(value, Mapping):
        item = next(((k, v) for k, v in value.items() if v is not None), None)
        if item is None:
            raise SchemaError(f"{what}: cannot infer the types of map {value!r}; declare the schema")
        return map_of(infer(item[0], f"{what}, map key", depth + 1), infer(item[1], f"{what}, map value", depth + 1))
    raise SchemaError(f"{what}: cannot store a {type(value).__name__}; declare a schema of supported types")


# -- evolution ---------------------------------------------------------------------------------
def check_evolution(old: DataType, new: DataType, variable: str, path: str = "value") -> None:
    """Raise unless every value of `old` reads as a value of `new` (add / remove / reorder / widen)."""
    if old == new:
        return
    if old.is_struct and new.is_struct:
        before = {f.name: f for f in old.fields}
        for f in new.fields:
            prev = before.get(f.name)
            where = f"{path}.{f.name}"
            if prev is None:
                if not f.nullable:
                    raise SchemaEvolutionError(
                        f"state variable {variable!r}: field {where!r} ({f.type.simple_string()} not null) is new, "
                        "so old values have no value for it; declare it nullable"
                    )
                continue
            if prev.nullable and not f.nullable:
                raise SchemaEvolutionError(
                    f"state variable {variable!r}: field {where!r} was nullable ({prev.type.simple_string()}) and "
                    f"is declared not null ({f.type.simple_string()}) now"
                )
            check_evolution(prev.type, f.type, variable, where)
        return
    if old.name == "array" and new.name == "array":
        assert old.element is not None and new.element is not None
        check_evolution(old.element, new.element, variable, f"{path}[]")
        return
    if old.name == "map" and new.name == "map":
        assert old.key is not None and new.key is not None and old.element is not None and new.element is not None
        if not key_compatible(old.key, new.key):
            raise SchemaEvolutionError(
                f"state variable {variable!r}: the keys of map {path!r} were {old.key.simple_string()} in the "
                f"checkpoint and are declared {new.key.simple_string()} now; map keys cannot change"
            )
        check_evolution(old.element, new.element, variable, f"{path}{{}}")
        return
    if new.name in _WIDENS.get(old.name, ()):
        return
    raise SchemaEvolutionError(
        f"state variable {variable!r}: field {path!r} was {old.simple_string()} in the checkpoint and is declared "
        f"{new.simple_string()} now; that change is incompatible (allowed: add nullable fields, remove or reorder "
        "fields, byte->short->int->long, float->double)"
    )


def projector(
    old: DataType, new: DataType, rows: RowFactory | None = None, *, nested: bool = False
) -> Callable[[Any], Any] | None:
    """A function turning a decoded `old` value into a `new` one (None when the values are the same).

    A projected struct is a tuple at the top (PySpark's state values are tuples) and, with `rows`, a row of
    the new field names when nested (as the new schema's own decoder gives it: ``pyspark.sql.Row``)."""
    if old == new or not (old.is_struct or old.name in ("array", "map")):
        return None  # widening needs no conversion of Python values
    if old.name == "map":
        assert old.element is not None and new.element is not None
        values = projector(old.element, new.element, rows, nested=True)
        if values is None:
            return None
        return lambda v: None if v is None else {k: None if e is None else values(e) for k, e in v.items()}
    if old.name == "array":
        assert old.element is not None and new.element is not None
        inner = projector(old.element, new.element, rows, nested=True)
        if inner is None:
            return None
        return lambda v: None if v is None else [None if e is None else inner(e) for e in v]
    index = {f.name: i for i, f in enumerate(old.fields)}
    plan: list[tuple[int, Callable[[Any], Any] | None]] = []
    for f in new.fields:
        i = index.get(f.name, -1)
        plan.append((i, projector(old.fields[i].type, f.type, rows, nested=True) if i >= 0 else None))
    if (
        all(i == n for n, (i, p) in enumerate(plan))
        and len(plan) == len(old.fields)
        and all(p is None for _, p in plan)
    ):
        return None
    make = rows(tuple(f.name for f in new.fields)) if rows is not None and nested else tuple

    def project(v: Any) -> Any:
        if v is None:
            return None
        return make(tuple(None if i < 0 or v[i] is None else (v[i] if p is None else p(v[i])) for i, p in plan))

    return project


def key_compatible(old: DataType, new: DataType) -> bool:
    """Whether keys of `old` have the same bytes as keys of `new` (integers and floats widen)."""
    if old.is_struct != new.is_struct:
        return False
    if old.is_struct:
        return len(old.fields) == len(new.fields) and all(
            a.name == b.name and key_compatible(a.type, b.type) for a, b in zip(old.fields, new.fields, strict=True)
        )
    return old == new or new.name in _WIDENS.get(old.name, ())


__all__ = [
    "DataType",
    "Field",
    "RowFactory",
    "SchemaError",
    "SchemaEvolutionError",
    "ValueTypeError",
    "atomic",
    "check_evolution",
    "from_arrow",
    "from_json",
    "from_json_value",
    "infer",
    "key_compatible",
    "map_of",
    "parse_ddl",
    "projector",
    "struct",
    "to_schema",
]
