"""Layout history: which partition count and key groups each operator had over which versions.

The sync (`statekeeper.sql.ingest`) records every commit record's layout per operator (table
``layouts``); `LayoutQueries.layouts` folds consecutive versions with the same layout into spans, one
per layout, with the version and change (``rescale`` / ``rollback``) that started it. `layout_spans`
is the folding alone, so `statekeeper inspect` shows the same spans read from the checkpoint itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from sqlalchemy import select

from statekeeper.sql.base import CatalogBase
from statekeeper.sql.models import Layout


@dataclass(frozen=True, slots=True)
class LayoutRow:
    """An operator's layout at one version."""

    operator: str
    version: int
    partitions: int
    max_key_groups: int | None
    change: str | None = None


class KeyGroups(Protocol):
    """What a recorded layout tells the catalog (``statekeeper.store.key_groups.KeyGroupLayout`` has it)."""

    @property
    def max_key_groups(self) -> int: ...


def layout_rows(
    version: int,
    checkpoint_ids: Mapping[str, Sequence[str]],
    layouts: Mapping[str, KeyGroups],
    change: Mapping[str, str],
) -> list[LayoutRow]:
    """The layout of each operator a commit record of `version` names: as many partitions as ids, the
    key groups of its recorded layout (None: a legacy operator without one) and how the version changed it."""
    rows = []
    for op, ids in checkpoint_ids.items():
        lay = layouts.get(op)
        rows.append(LayoutRow(op, version, len(ids), lay.max_key_groups if lay else None, change.get(op)))
    return rows


@dataclass(frozen=True, slots=True)
class LayoutSpan:
    """Versions ``first..last`` of `operator` in one layout (``max_key_groups`` None: legacy)."""

    operator: str
    first_version: int
    last_version: int
    partitions: int
    max_key_groups: int | None
    change: str | None
    """How the span began: ``rescale``, ``rollback`` or None (the first batch, or a gap in the records)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def layout_spans(rows: Iterable[LayoutRow]) -> list[LayoutSpan]:
    """Fold rows into spans of consecutive versions with the same layout, by operator then version.

    A rollback starts a new span even when the layout is unchanged (it is a new branch of the lineage).
    """
    spans: list[LayoutSpan] = []
    for r in sorted(rows, key=lambda r: (r.operator, r.version)):
        last = spans[-1] if spans else None
        if (
            last is not None
            and last.operator == r.operator
            and last.last_version == r.version - 1
            and (last.partitions, last.max_key_groups) == (r.partitions, r.max_key_groups)
            and r.change is None
        ):
            spans[-1] = LayoutSpan(
                r.operator, last.first_version, r.version, r.partitions, r.max_key_groups, last.change
            )
        else:
            spans.append(LayoutSpan(r.operator, r.version, r.version, r.partitions, r.max_key_groups, r.change))
    return spans


class LayoutQueries(CatalogBase):
    """The layout history of `Catalog` (one root per call, identified by its URI)."""

    def layouts(self, uri: str, operator: str | None = None) -> list[LayoutSpan]:
        rid = self.root_id(uri)
        query = select(Layout.operator, Layout.version, Layout.partitions, Layout.max_key_groups, Layout.change).where(
            Layout.root_id == rid
        )
        if operator is not None:
            query = query.where(Layout.operator == operator)
        with self.read() as conn:
            rows = [LayoutRow(op, int(v), int(n), g, c) for op, v, n, g, c in conn.execute(query)]
        return layout_spans(rows)


__all__ = ["KeyGroups", "LayoutQueries", "LayoutRow", "LayoutSpan", "layout_rows", "layout_spans"]
