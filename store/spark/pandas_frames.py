"""Arrow <-> pandas for ``input_format="pandas"``, the way PySpark's ``transformWithStateInPandas`` converts.

A processor written for PySpark computes on the frames it is given (``ts.astype("int64") // 10**9``,
``df.at[0, "col"]``), so the frames must be PySpark's, not pyarrow's defaults:

- timestamps are ``datetime64[ns]`` (pyarrow keeps Spark's microseconds: ``int64`` would be µs);
  with a zone (Spark's ``TIMESTAMP``) they are converted to the session time zone and made naive, as
  PySpark's ``_check_series_localize_timestamps`` does; ``TIMESTAMP_NTZ`` stays naive;
- dates are ``datetime.date`` objects, decimals ``decimal.Decimal``, binaries ``bytes``;
- maps are ``dict`` (nested ones too), structs ``dict``, arrays NumPy arrays;
- every frame is indexed from 0 (one key's slice of a chunk is re-indexed).

Output frames go back through the output schema's Arrow types; a column that pandas' inference cannot
cast (a ``dict`` column meant as a ``MapType``: inferred as a struct) is converted with the target type.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa


def to_pandas(table: pa.Table, time_zone: str | None = "UTC") -> Any:
    """`table` as PySpark hands it to a pandas processor (see the module docstring)."""
    pdf = table.to_pandas(date_as_object=True, coerce_temporal_nanoseconds=True, maps_as_pydicts="strict")
    for field in table.schema:
        if pa.types.is_timestamp(field.type) and field.type.tz is not None:
            column = pdf[field.name]
            pdf[field.name] = column.dt.tz_convert(time_zone or "UTC").dt.tz_localize(None)
    return pdf


def key_frames(pdf: Any, sizes: list[tuple[tuple[Any, ...], int]]) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """(key, frame) per run of `sizes` rows of `pdf`: a positional slice, indexed from 0 as PySpark's are."""
    start = 0
    for key, size in sizes:
        end = start + size
        yield key, pdf.iloc[start:end].reset_index(drop=True)
        start = end


def _convert(column: Any, target: pa.DataType) -> pa.Array | pa.ChunkedArray:
    try:
        return pa.Array.from_pandas(column).cast(target)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
        # e.g. dicts meant as a map: inferred as a struct, which does not cast to a map
        return pa.array(column.tolist(), type=target, from_pandas=True)


def from_pandas(pdf: Any, fields: list[pa.Field]) -> list[pa.Array | pa.ChunkedArray]:
    """The columns of `fields` from an output frame, each of its field's type."""
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


__all__ = ["from_pandas", "key_frames", "to_pandas"]
