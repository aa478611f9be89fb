"""Turning maintenance reports into Dagster metadata: numbers the UI plots and a table of what was done.

The same keys on every materialization of an asset, so that Dagster plots each as a series per root
(docs/orchestration.md, "Metadata reference"): chain lengths before and after a run under their own names
(``max_chain_length_before`` / ``_after``, never one key the run overwrites), the root's size
(``checkpoint_bytes``), snapshot lag percentiles and a ``worst_stores`` table. Durations are rounded
(`SECONDS_DECIMALS`): a plot and a reader need milliseconds at most, not 16 decimals.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from statistics import fmean
from typing import TYPE_CHECKING, Any, Protocol

from dagster import MetadataValue, TableColumn, TableRecord, TableSchema

from statekeeper.maintenance.health import chain_bound
from statekeeper.sql import Catalog, NotInCatalogError, StoreChain

if TYPE_CHECKING:
    from statekeeper.maintenance.health import StoreHealth

MAX_TABLE_ROWS = 200
"""Rows shown in a table; the count of all rows is reported beside it."""
MAX_STORE_SERIES = 100
"""Stores (in operator/partition order) that get their own plotted chain length and snapshot lag."""
WORST_STORES = 10
"""Rows of the ``worst_stores`` table: the stores with the longest chains (then the longest lag)."""
SECONDS_DECIMALS = 2
"""Decimals of a duration (a key naming seconds); other floats keep `FLOAT_DECIMALS`."""
FLOAT_DECIMALS = 3


class Report(Protocol):
    """What every maintenance report offers (maintenance.snapshot_builds / expiry / orphans / verify)."""

    def metadata(self) -> dict[str, int | float]: ...

    def rows(self) -> list[dict[str, Any]]: ...


def rounded(key: str, value: float) -> float:
    """`value` rounded for display: seconds to `SECONDS_DECIMALS`, other floats to `FLOAT_DECIMALS`."""
    return round(value, SECONDS_DECIMALS if "seconds" in key else FLOAT_DECIMALS)


def numeric(values: Mapping[str, Any], prefix: str = "") -> dict[str, MetadataValue]:
    """int and float values as Dagster metadata (plotted over materializations), floats `rounded`; others dropped."""
    out: dict[str, MetadataValue] = {}
    for key, value in values.items():
        if isinstance(value, bool):
            out[prefix + key] = MetadataValue.int(int(value))
        elif isinstance(value, int):
            out[prefix + key] = MetadataValue.int(value)
        elif isinstance(value, float):
            out[prefix + key] = MetadataValue.float(rounded(key, value))
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


def chain_stats(chains: list[StoreChain], threshold: int, suffix: str = "") -> dict[str, MetadataValue]:
    """Chain lengths of a root's stores: the longest, the mean, how many reach the threshold and how many pass
    twice it (`chain_bound`), each key ending in `suffix` (``_before`` / ``_after`` a run, none for the catalog's
    view); with the root's store count, the threshold and the bound."""
    lengths = [c.chain_length for c in chains]
    limit = chain_bound(threshold)
    return {
        "stores": MetadataValue.int(len(chains)),
        f"max_chain_length{suffix}": MetadataValue.int(max(lengths, default=0)),
        f"mean_chain_length{suffix}": MetadataValue.float(round(fmean(lengths), FLOAT_DECIMALS) if lengths else 0.0),
        f"stores_at_or_over_threshold{suffix}": MetadataValue.int(sum(1 for n in lengths if n >= threshold)),
        f"stores_over_twice_threshold{suffix}": MetadataValue.int(sum(1 for n in lengths if n > limit)),
        "snapshot_threshold": MetadataValue.int(threshold),
        "chain_length_limit": MetadataValue.int(limit),
    }


def worst_stores(
    chains: list[StoreChain], before: list[StoreChain] | None = None, limit: int = WORST_STORES
) -> MetadataValue:
    """The `limit` stores with the longest chains (then the longest snapshot lag): the fleet's view of a root,
    with each store's chain before the run when `before` is given."""
    from statekeeper.maintenance.health import health_from_chains

    found = {(c.operator, c.partition): c.chain_length for c in before or []}

    def lag(h: StoreHealth) -> float:
        return 0.0 if math.isnan(h.lag_seconds) else h.lag_seconds  # unknown (not synced yet): not ranked by it

    health = sorted(health_from_chains(chains), key=lambda h: (-h.chain_length, -lag(h), str(h.store)))
    rows: list[dict[str, Any]] = []
    for h in health[:limit]:
        row: dict[str, Any] = {"store": str(h.store), "chain_length": h.chain_length}
        if before is not None:
            row["chain_length_before"] = found.get((h.store.operator, h.store.partition), 0)
        row["snapshot_lag_seconds"] = round(lag(h), SECONDS_DECIMALS)
        row["latest_version"] = h.latest
        row["snapshot_version"] = h.snapshot_version
        rows.append(row)
    return table(rows, limit)


def root_size(catalog: Catalog, root: str) -> dict[str, MetadataValue]:
    """``checkpoint_bytes`` and ``checkpoint_files``: what the root holds now, as the catalog knows it (one
    aggregate query, no listing); zeros for a root the catalog does not know."""
    try:
        summary = catalog.summary(root)
    except NotInCatalogError:
        summary = {}
    return {
        "checkpoint_bytes": MetadataValue.int(int(summary.get("present_bytes", 0))),
        "checkpoint_files": MetadataValue.int(int(summary.get("present_files", 0))),
    }


def chains_of(catalog: Catalog, root: str) -> list[StoreChain]:
    """The chain of every store of `root` in the catalog (none for a root it does not know)."""
    try:
        return catalog.chain_lengths(root)
    except NotInCatalogError:
        return []


def health_metadata(health: list[StoreHealth], limit: int = MAX_STORE_SERIES) -> dict[str, MetadataValue]:
    """Chain length and snapshot lag: percentiles over the stores, and one plotted series per store
    (``chain_length/<op>/<partition>``, ``snapshot_lag_seconds/<op>/<partition>``) for the first `limit`."""
    from statekeeper.maintenance.health import summarize

    md = numeric(summarize(health).metadata())
    for h in health[:limit]:
        md[f"chain_length/{h.store}"] = MetadataValue.int(h.chain_length)
        md[f"snapshot_lag_seconds/{h.store}"] = MetadataValue.float(round(h.lag_seconds, SECONDS_DECIMALS))
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


__all__ = [
    "chain_rows",
    "chain_stats",
    "chains_of",
    "health_metadata",
    "numeric",
    "report_errors",
    "report_metadata",
    "root_size",
    "rounded",
    "table",
    "worst_stores",
]
