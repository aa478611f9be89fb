"""Arrow <-> pandas for ``input_format="pandas"``, the way PySpark's ``transformWithStateInPandas`` converts.

A processor written for PySpark computes on the frames it is given (``ts.astype("int64") // 10**9``,
``df.at[0, "col"]``), so the frames must be PySpark's, not pyarrow's defaults:

- timestamps are ``datetime64[ns]`` (pyarrow keeps Spark's microseconds: ``int64`` would be µs);
  with a zone (Spark's ``TIMESTAMP``) they are converted to the session time zone and made naive, as
  PySpark's ``_check_series_localize_timestamps`` does; ``TIMESTAMP_NTZ`` stays naive;
- dates are ``datetime.date`` objects, decimals ``decimal.Decimal``, binaries ``bytes``;
- maps are ``dict`` (nested ones too), structs ``dict``, arrays NumPy arrays; integers inside them stay ``int``
  beside nulls, timestamps inside them are naive ``pandas.Timestamp`` (a ``TIMESTAMP`` in the session time zone);
- PySpark builds each frame from Python values (``pd.DataFrame(rows)``), so every integer column is ``int64``
  and every floating one ``float64``, whatever the Spark type's width; a null in an integer column makes it
  ``float64`` (a boolean one ``object``) for the keys of its Arrow batch in PySpark, of its chunk here;
- every frame is indexed from 0 (one key's slice of a chunk is re-indexed);
- a key's rows come in frames of at most ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows and about
  ``maxBytesPerBatch`` bytes (`PandasSettings`), as PySpark cuts its Arrow batches.

Output frames go back through the output schema's Arrow types; a column that pandas' inference cannot
cast (a ``dict`` column meant as a ``MapType``: inferred as a struct) is converted with the target type. A naive
timestamp for a ``TIMESTAMP`` field (nested ones too) is a wall time in the session time zone, as PySpark takes it:
an input timestamp handed back unchanged keeps its instant.
"""

from __future__ import annotations

import datetime as dt
import importlib
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa

from statekeeper.store.errors import ConfigurationError, StoreStateError

try:
    from pyspark.errors import PySparkValueError as _PySparkValueError
except ImportError:  # pragma: no cover - an install without the [spark] extra
    _PySparkValueError = ValueError  # type: ignore[assignment,misc]


class OutputConversionError(StoreStateError, _PySparkValueError):
    """An output column or value that PySpark would not convert to its field's type either; a ``PySparkValueError``
    too (where PySpark is installed), as a processor's own tests may expect."""


def to_pandas(table: pa.Table, time_zone: str | None = "UTC") -> Any:
    """`table` as PySpark hands it to a pandas processor (see the module docstring)."""
    columns = [_widened(c) for c in table.columns]
    return _to_pandas(pa.Table.from_arrays(columns, names=table.column_names), time_zone)


def _widened(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """An integer column as int64, a floating one as float64: PySpark boxes each value as a Python ``int`` /
    ``float`` and infers the frame's dtype from those, whatever the Spark type's width."""
    t = column.type
    if pa.types.is_integer(t) and t != pa.int64():
        return column.cast(pa.int64())
    if pa.types.is_floating(t) and t != pa.float64():
        return column.cast(pa.float64())
    return column


def _to_pandas(table: pa.Table, time_zone: str | None) -> Any:
    options: dict[str, Any] = {"date_as_object": True, "coerce_temporal_nanoseconds": True, "maps_as_pydicts": "strict"}
    nested = [i for i, field in enumerate(table.schema) if pa.types.is_nested(field.type)]
    if not nested:
        pdf = table.to_pandas(**options)
    else:  # integers inside structs, arrays and maps stay ints beside nulls (PySpark's integer_object_nulls)
        flat = sorted(set(range(table.num_columns)) - set(nested))
        pdf = table.select(flat).to_pandas(**options)
        for i in nested:
            column = table.column(i).to_pandas(integer_object_nulls=True, **options)
            convert = _nested_timestamps(table.schema.field(i).type, time_zone or "UTC")
            if convert is not None:
                column = column.map(convert, na_action="ignore")
            pdf.insert(i, table.schema.field(i).name, column, allow_duplicates=True)
    for field in table.schema:
        if pa.types.is_timestamp(field.type) and field.type.tz is not None:
            column = pdf[field.name]
            pdf[field.name] = column.dt.tz_convert(time_zone or "UTC").dt.tz_localize(None)
    return pdf


def _nested_timestamps(t: pa.DataType, zone: str) -> Callable[[Any], Any] | None:
    """The conversion of a nested value of type `t` whose timestamps PySpark makes ``pandas.Timestamp`` (naive, in
    the session time zone for Spark's ``TIMESTAMP``), as its ``_create_converter_to_pandas`` does; None: none in it."""
    if pa.types.is_timestamp(t):
        timestamp: Callable[[Any], Any] = importlib.import_module("pandas").Timestamp
        if t.tz is None:
            return timestamp

        def zoned(v: Any) -> Any:
            ts = timestamp(v)
            return (ts if ts.tzinfo is not None else ts.tz_localize("UTC")).tz_convert(zone).tz_localize(None)

        return zoned
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        element = _nested_timestamps(t.value_type, zone)
        if element is None:
            return None
        return lambda v: np.array([None if x is None else element(x) for x in v])
    if pa.types.is_map(t):
        key, item = _nested_timestamps(t.key_type, zone), _nested_timestamps(t.item_type, zone)
        if key is None and item is None:
            return None
        k, i = key or (lambda x: x), item or (lambda x: x)
        return lambda v: {k(a): None if b is None else i(b) for a, b in v.items()}
    if pa.types.is_struct(t):
        fields = [(f.name, _nested_timestamps(f.type, zone)) for f in t]
        if all(c is None for _, c in fields):
            return None
        return lambda v: {n: v.get(n) if c is None or v.get(n) is None else c(v[n]) for n, c in fields}
    return None


@dataclass(frozen=True)
class PandasSettings:
    """The session settings PySpark's pandas conversions follow (their defaults here).

    ``spark.sql.execution.arrow.maxRecordsPerBatch`` / ``maxBytesPerBatch``: PySpark hands a key's rows to a pandas
    processor in frames cut at these limits, and processors may count the frames.
    ``spark.sql.execution.pythonUDF.pandas.intToDecimalCoercionEnabled``: whether an integer output column may fill
    a decimal one (else the conversion fails, as PySpark's)."""

    max_records: int = 10_000
    """<= 0: no limit."""
    max_bytes: int = 2**31 - 1
    int_to_decimal: bool = False

    RECORDS_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"
    BYTES_CONF = "spark.sql.execution.arrow.maxBytesPerBatch"
    INT_TO_DECIMAL_CONF = "spark.sql.execution.pythonUDF.pandas.intToDecimalCoercionEnabled"

    @classmethod
    def of(cls, conf: Any) -> PandasSettings:
        """The settings a Spark session's `conf` holds (read before a job overrides them for its own batches)."""
        records, size = conf.get(cls.RECORDS_CONF, None), conf.get(cls.BYTES_CONF, None)
        coerce = str(conf.get(cls.INT_TO_DECIMAL_CONF, None) or "false").strip().lower()
        if coerce not in ("true", "false"):
            raise ConfigurationError(f"{cls.INT_TO_DECIMAL_CONF}={coerce!r} is not true or false")
        return cls(
            cls.max_records if records is None else _setting(cls.RECORDS_CONF, records, _RECORDS),
            cls.max_bytes if size is None else _setting(cls.BYTES_CONF, size, _BYTES),
            coerce == "true",
        )

    def rows(self, table: pa.Table) -> int:
        """Rows per frame for `table` (its mean row size against `max_bytes`, at least 1); 0: no limit."""
        rows = max(self.max_records, 0)
        if table.num_rows and 0 < self.max_bytes < table.nbytes:
            by_size = max(1, self.max_bytes * table.num_rows // table.nbytes)
            rows = min(rows, by_size) if rows else by_size
        return rows


_RECORDS = re.compile(r"\s*(-?\d+)\s*()")
_BYTES = re.compile(r"\s*(\d+)\s*([kmgtp]?)b?\s*", re.IGNORECASE)


def _setting(name: str, text: str, shape: re.Pattern[str]) -> int:
    """A Spark count or byte size (``"2"``, ``"256m"``, ``"1g"``); ConfigurationError naming the setting."""
    m = shape.fullmatch(text)
    if m is None:
        raise ConfigurationError(f"{name}={text!r} is not a {'byte size' if shape is _BYTES else 'whole number'}")
    return int(m.group(1)) << (10 * "_kmgtp".index(m.group(2).lower() or "_"))


def key_frames(
    pdf: Any, sizes: list[tuple[tuple[Any, ...], int]], rows_per_frame: int = 0
) -> Iterator[tuple[tuple[Any, ...], Iterator[Any]]]:
    """(key, frames) per run of `sizes` rows of `pdf`: positional slices of at most `rows_per_frame` rows
    (0: one), each indexed from 0 as PySpark's are, and each cut only when the processor reaches it."""
    cut = _slicer(pdf)
    start = 0
    for key, size in sizes:
        end = start + size
        yield key, _Frames(cut, start, end, rows_per_frame if 0 < rows_per_frame < size else size)
        start = end


class _Frames:
    """One key's frames, cut from the chunk's frame as they are iterated: a chunk's keys are all grouped at
    once, and a frame costs a few KiB of pandas objects (~0.5 GiB for 200k keys), so only the frames of the
    key being processed exist."""

    __slots__ = ("_at", "_cut", "_end", "_step")

    def __init__(self, cut: Callable[[int, int], Any], start: int, end: int, step: int) -> None:
        self._cut, self._at, self._end, self._step = cut, start, end, step

    def __iter__(self) -> _Frames:
        return self

    def __next__(self) -> Any:
        start = self._at
        if start >= self._end:
            raise StopIteration
        self._at = end = min(self._end, start + self._step)
        return self._cut(start, end)


def _slicer(pdf: Any) -> Callable[[int, int], Any]:
    """``cut(start, end)``: rows [start, end) of `pdf` as a frame of its own, indexed from 0.

    A view of `pdf`'s blocks with a fresh RangeIndex, built on pandas' block manager: the cost of a bare
    ``iloc`` slice, where ``iloc[s:e].reset_index(drop=True)`` copied every block (~3x the time a key).
    Like a frame PySpark hands over, it is no ``iloc`` slice (no SettingWithCopyWarning on writes); a
    write into it reaches only its own rows of `pdf`, which no other frame holds (under pandas'
    copy-on-write mode it copies instead). Without those internals: the copy.
    """
    try:
        get_slice, from_mgr = pdf._mgr.get_slice, type(pdf)._from_mgr
    except AttributeError:  # pragma: no cover - pandas outside the supported versions
        return lambda s, e: pdf.iloc[s:e].reset_index(drop=True)

    range_index = importlib.import_module("pandas").RangeIndex

    def cut(start: int, end: int) -> Any:
        mgr = get_slice(slice(start, end), axis=1)  # axis 1 of a frame's manager: the rows
        mgr.set_axis(1, range_index(end - start))
        return from_mgr(mgr, axes=mgr.axes)

    return cut


def gather_columns(frames: list[Any], names: list[str]) -> dict[str, np.ndarray] | None:
    """Columns `names` of `frames`, each concatenated into one NumPy array, as ``pandas.concat`` gives them
    when every frame holds the column as a plain NumPy array of one dtype (else None: concat's alignment
    and type promotion are needed). ~5x cheaper than concat for many small frames (one per key)."""
    parts: list[list[Any]] = [[] for _ in names]
    labels: list[Any] | None = None
    positions: list[int] = []
    try:
        for frame in frames:
            mgr = frame._mgr
            have = mgr.items._values.tolist()
            if have != labels:  # the usual case: every frame has the same columns, in the same order
                if not any(isinstance(label, str) for label in have):  # unnamed: in order, as PySpark takes them
                    if len(have) < len(names):
                        return None
                    labels, positions = have, list(range(len(names)))
                else:
                    at = {label: i for i, label in enumerate(have)}
                    if len(at) != len(have) or any(n not in at for n in names):
                        return None
                    labels, positions = have, [at[n] for n in names]
            for part, i in zip(parts, positions, strict=True):
                part.append(mgr.iget_values(i))
    except AttributeError:  # pragma: no cover - pandas outside the supported versions
        return None
    out: dict[str, np.ndarray] = {}
    for name, part in zip(names, parts, strict=True):
        if set(map(type, part)) != {np.ndarray} or len({a.dtype for a in part}) != 1:
            return None  # extension arrays (tz-aware, nullable, categorical) or mixed dtypes: concat's rules
        out[name] = np.concatenate(part)
    return out


def _convert(column: Any, target: pa.DataType) -> pa.Array | pa.ChunkedArray:
    try:
        return pa.Array.from_pandas(column).cast(target)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
        # e.g. dicts meant as a map: inferred as a struct, which does not cast to a map
        return pa.array(column.tolist(), type=target, from_pandas=True)


def check_decimals(values: Sequence[Any], field: pa.Field, int_to_decimal: bool) -> None:
    """Output rows' values for a decimal field, as PySpark's row conversion takes them: `Decimal` or None (and
    integers with `int_to_decimal`); else `OutputConversionError` naming the column."""
    allowed = (Decimal, int) if int_to_decimal else Decimal
    bad = next((v for v in values if v is not None and (not isinstance(v, allowed) or isinstance(v, bool))), None)
    if bad is not None:
        raise OutputConversionError(
            f"output column '{field.name}' of type {field.type} got {bad!r} ({type(bad).__name__}): PySpark takes a "
            f"decimal.Decimal there (an int too with {PandasSettings.INT_TO_DECIMAL_CONF}=true)"
        )


def named_columns(pdf: Any, names: list[str]) -> Any:
    """An output frame's columns as PySpark assigns them: by name when any label is a string, else the first
    ``len(names)`` columns in order (``pd.DataFrame([[key, n]])``)."""
    labels = pdf.columns
    if any(isinstance(label, str) for label in labels):
        return pdf
    if len(labels) < len(names):
        raise OutputConversionError(
            f"an output frame has {len(labels)} unnamed columns; the output schema has {len(names)}"
        )
    return pdf.iloc[:, : len(names)].set_axis(names, axis=1)


def _zoned_output(t: pa.DataType, zone: str) -> Callable[[Any], Any] | None:
    """The conversion of an output value of type `t` that localizes its naive timestamps for Spark's ``TIMESTAMP``
    to `zone` (``TIMESTAMP_NTZ`` stays naive); None: `t` holds none."""
    if pa.types.is_timestamp(t):
        if t.tz is None:
            return None
        timestamp: Callable[[Any], Any] = importlib.import_module("pandas").Timestamp

        def zoned(v: Any) -> Any:
            if isinstance(v, dt.datetime) and v.tzinfo is None:  # a pandas.Timestamp is a datetime too
                return timestamp(v).tz_localize(zone, ambiguous=False)
            return v

        return zoned
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        element = _zoned_output(t.value_type, zone)
        if element is None:
            return None
        return lambda v: [None if x is None else element(x) for x in v]
    if pa.types.is_map(t):
        key, item = _zoned_output(t.key_type, zone), _zoned_output(t.item_type, zone)
        if key is None and item is None:
            return None
        k, i = key or (lambda x: x), item or (lambda x: x)
        return lambda v: [(k(a), None if b is None else i(b)) for a, b in (v.items() if isinstance(v, dict) else v)]
    if pa.types.is_struct(t):
        fields = [(f.name, _zoned_output(f.type, zone)) for f in t]
        if all(c is None for _, c in fields):
            return None

        def struct(v: Any) -> Any:
            if not isinstance(v, dict):  # a Row or tuple: its fields in order
                v = dict(zip((n for n, _ in fields), v, strict=False))
            return {n: v.get(n) if c is None or v.get(n) is None else c(v[n]) for n, c in fields}

        return struct
    return None


def _localized(pdf: Any, fields: list[pa.Field], zone: str) -> Any:
    """`pdf` with the naive timestamps of its ``TIMESTAMP`` fields taken as wall times in `zone` (the session time
    zone), as PySpark's conversion takes them (standard time where a wall time is ambiguous); Arrow alone would take
    them as UTC."""
    changed: dict[str, Any] = {}
    for f in fields:
        convert = _zoned_output(f.type, zone)
        if convert is None:
            continue
        column = pdf[f.name]
        if column.dtype.kind == "M":
            if getattr(column.dtype, "tz", None) is None:
                changed[f.name] = column.dt.tz_localize(zone, ambiguous=False)
        elif column.dtype == object:
            changed[f.name] = column.map(convert, na_action="ignore")
    return pdf.assign(**changed) if changed else pdf


def from_pandas(
    pdf: Any, fields: list[pa.Field], int_to_decimal: bool = False, time_zone: str = "UTC"
) -> list[pa.Array | pa.ChunkedArray]:
    """The columns of `fields` from an output frame, each of its field's type. An integer column fills a decimal
    field only with `int_to_decimal` (PySpark's ``intToDecimalCoercionEnabled``), else it fails as in PySpark. Naive
    timestamps are wall times in `time_zone` (the session's), as PySpark takes them."""
    if time_zone != "UTC":
        pdf = _localized(pdf, fields, time_zone)
    for f in fields:
        if pa.types.is_decimal(f.type) and pdf[f.name].dtype.kind in "iu":
            if int_to_decimal:  # a nullable integer column (Int64) keeps its nulls
                column = pdf[f.name]
                values = [None if na else Decimal(int(v)) for v, na in zip(column, column.isna(), strict=True)]
                pdf = pdf.assign(**{f.name: values})
                continue
            try:  # PySpark's cast: only a decimal wide enough for every value of the integer type
                pa.Array.from_pandas(pdf[f.name]).cast(f.type)
            except pa.ArrowInvalid:
                raise OutputConversionError(
                    f"Failed to convert the value of the column '{f.name}' with type '{pdf[f.name].dtype}' to Arrow "
                    f"type '{f.type}' (set {PandasSettings.INT_TO_DECIMAL_CONF}=true to convert integers to decimals)"
                ) from None
    try:
        table = pa.Table.from_pandas(pdf, preserve_index=False)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
        return [_convert(pdf[f.name], f.type) for f in fields]
    out: list[pa.Array | pa.ChunkedArray] = []
    for f in fields:
        try:
            out.append(table.column(f.name).cast(f.type))
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
            out.append(pa.array(pdf[f.name].tolist(), type=f.type, from_pandas=True))
    return out


__all__ = [
    "OutputConversionError",
    "PandasSettings",
    "check_decimals",
    "from_pandas",
    "gather_columns",
    "key_frames",
    "named_columns",
    "to_pandas",
]
