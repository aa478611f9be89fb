"""Turning maintenance reports into Dagster metadata: numbers the UI plots and a table of what was done."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from statistics import fmean
from typing import TYPE_CHECKING, Any, Protocol

from dagster import MetadataValue, TableColumn, TableRecord, TableSchema

from statekeeper.sql import StoreChain

if TYPE_CHECKING:
    from statekeeper.maintenance.health import StoreHealth

MAX_TABLE_ROWS = 200
"""Rows shown in a table; the count of all rows is reported beside it."""
MAX_STORE_SERIES = 100
"""Stores (in operator/partition order) that get their own plotted chain length and snapshot lag."""


class Report(Protocol):
    """What every maintenance report offers (maintenance.snapshots / expiry / orphans / verify)."""

    def metadata(self) -> dict[str, int | float]: ...

    def rows(self) -> list[dict[str, Any]]: ...


def numeric(values: Mapping[str, Any], prefix: str = "") -> dict[str, MetadataValue]:
    """int and float values as Dagster metadata (plotted over materializations); others dropped."""
    out: dict[str, MetadataValue] = {}
    for key, value in values.items():
        if isinstance(value, bool):
            out[prefix + key] = MetadataValue.int(int(value))
        elif isinstance(value, int):
            out[prefix + key] = MetadataValue.int(value)
        elif isinstance(value, float):
            out[prefix + key] = MetadataValue.float(value)
    return out


def _cell(value: Any) -> str | int | float | bool | None:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple | set):
        return ", ".join(str(v) for v in value)
    return str(value)


def _column_type(values: Iterable[Any]) -> str:
    kinds = {type(v) for v in values if v is not None}
    if kinds and kinds <= {int}:
        return "int"
    if kinds and kinds <= {int, float}:
        return "float"
    if kinds and kinds <= {bool}:
        return "bool"
    return "string"


def table(rows: list[dict[str, Any]], limit: int = MAX_TABLE_ROWS) -> MetadataValue:
    """A table of `rows` (the first `limit`), columns in first-seen order."""
    shown = [{k: _cell(v) for k, v in row.items()} for row in rows[:limit]]
    columns: list[str] = []
    for row in shown:
        columns.extend(k for k in row if k not in columns)
    if not columns:
        columns = ["result"]
        shown = [{"result": "nothing to do"}]
    schema = TableSchema(columns=[TableColumn(name=c, type=_column_type(r.get(c) for r in shown)) for c in columns])
    records = [TableRecord(data={c: row.get(c) for c in columns}) for row in shown]
    return MetadataValue.table(records=records, schema=schema)


def chain_stats(chains: list[StoreChain], threshold: int) -> dict[str, MetadataValue]:
    """Chain lengths of a root's stores: the longest, the mean, how many reach the threshold."""
    lengths = [c.chain_length for c in chains]
    return {
        "stores": MetadataValue.int(len(chains)),
        "max_chain_length": MetadataValue.int(max(lengths, default=0)),
        "mean_chain_length": MetadataValue.float(round(fmean(lengths), 3) if lengths else 0.0),
        "stores_at_or_over_threshold": MetadataValue.int(sum(1 for n in lengths if n >= threshold)),
        "snapshot_threshold": MetadataValue.int(threshold),
    }


def health_metadata(health: list[StoreHealth], limit: int = MAX_STORE_SERIES) -> dict[str, MetadataValue]:
    """Chain length and snapshot lag: percentiles over the stores, and one plotted series per store
    (``chain_length/<op>/<partition>``, ``snapshot_lag_seconds/<op>/<partition>``) for the first `limit`."""
    from statekeeper.maintenance.health import summarize

    md = numeric(summarize(health).metadata())
    for h in health[:limit]:
        md[f"chain_length/{h.store}"] = MetadataValue.int(h.chain_length)
        md[f"snapshot_lag_seconds/{h.store}"] = MetadataValue.float(round(h.lag_seconds, 3))
    md["stores_with_series"] = MetadataValue.int(min(limit, len(health)))
    return md


def chain_rows(chains: list[StoreChain]) -> list[dict[str, Any]]:
    return [c.to_json() for c in sorted(chains, key=lambda c: (-c.chain_length, c.operator, c.partition))]


def report_metadata(report: Report) -> dict[str, MetadataValue]:
    """A report's numbers plus its table (`details`) and the row count."""
    rows = report.rows()
    md = numeric(report.metadata())
    md["rows"] = MetadataValue.int(len(rows))
    md["details"] = table(rows)
    return md


def report_errors(report: Any) -> list[str]:
    errors = getattr(report, "errors", None) or []
    if isinstance(errors, Mapping):
        return [f"{k}: {v}" for k, v in errors.items()]
    if isinstance(errors, int):
        return [f"{errors} error(s)"] if errors else []
    return [str(e) for e in errors]


__all__ = ["chain_rows", "chain_stats", "health_metadata", "numeric", "report_errors", "report_metadata", "table"]
