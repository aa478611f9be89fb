"""Catalog history retention (`Catalog.prune_history`, expiry's `prune_catalog_history`): the rows of what is
gone are dropped past the horizon, and what is present stays exactly what a rebuild from the location gives."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict

import pytest

from statekeeper.maintenance.catalog_sync import rebuild_catalog, sync_catalog
from statekeeper.maintenance.expiry import expire_versions
from statekeeper.maintenance.orphans import clean_orphans
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.sql import Catalog
from tests.catalog_export import catalog_export
from tests.sql.histories import History
from tests.sql.test_sync import exports_equal

SETTINGS = MaintenanceSettings(snapshot_threshold=3, min_versions_to_retain=3, orphan_grace_seconds=0.0)


@pytest.fixture
def history(checkpoint_root: str) -> Iterator[History]:
    h = History(checkpoint_root)
    yield h
    h.close()


def maintain(catalog: Catalog, history: History, settings: MaintenanceSettings = SETTINGS) -> None:
    """Expiry and orphan cleanup as deployed (recorded runs, files marked deleted), then a full sync."""
    sync_catalog(catalog, history.fm)
    assert expire_versions(history.fm, settings, catalog=catalog).errors == []
    assert clean_orphans(history.fm, settings, catalog=catalog).errors == []
    sync_catalog(catalog, history.fm, full=True)


def as_rebuilt(export: dict[str, list[tuple[object, ...]]]) -> dict[str, list[tuple[object, ...]]]:
    """`export` with each store's lowest version's parent id unknown, as a rebuild finds it (its predecessor's
    changelog and commit record are gone); the catalog that saw them keeps the id, which is history too."""
    lowest: dict[object, tuple[object, ...]] = {}
    for row in export["versions"]:
        lowest.setdefault(row[:2], row)
    versions = [(*r[:4], None, r[5]) if lowest[r[:2]] is r else r for r in export["versions"]]
    return export | {"versions": versions}


def no_history(catalog: Catalog, uri: str) -> None:
    everything = catalog_export(catalog, uri, include_history=True)
    assert not [f for f in everything["files"] if f[-1] == "deleted"]
    assert not [s for s in everything["snapshots"] if s[-1]]
    present = catalog_export(catalog, uri)
    exports_equal(everything, present | {"files": everything["files"], "snapshots": everything["snapshots"]})


def test_pruning_drops_the_history_and_keeps_what_a_rebuild_gives(
    catalog: Catalog, catalog_factory: Callable[[], Catalog], history: History
) -> None:
    uri = history.fm.root_uri
    history.run(12, retry_every=3, snapshot_every=3)
    maintain(catalog, history)
    present = catalog_export(catalog, uri)
    kept = catalog_export(catalog, uri, include_history=True)
    assert sum(f[-1] == "deleted" for f in kept["files"]) > 10  # there is history to drop
    assert len(kept["versions"]) > len(present["versions"])

    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    assert catalog.prune_history(uri, long_ago).total == 0  # nothing is that old
    assert catalog_export(catalog, uri, include_history=True) == kept

    runs = len(catalog.runs(uri))
    pruned = catalog.prune_history(uri, dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1))
    assert all(n > 0 for n in asdict(pruned).values()), pruned
    assert pruned.runs == runs and catalog.runs(uri) == []  # every run had ended
    exports_equal(catalog_export(catalog, uri), present)  # nothing present was touched ...
    fresh = catalog_factory()
    rebuild_catalog(fresh, history.fm)
    # ... and the rest is what the location says
    exports_equal(as_rebuilt(catalog_export(catalog, uri)), catalog_export(fresh, uri))
    no_history(catalog, uri)
    assert catalog.layouts(uri) == fresh.layouts(uri)
    assert catalog.retention_plan(uri, SETTINGS.min_versions_to_retain) == fresh.retention_plan(
        uri, SETTINGS.min_versions_to_retain
    )

    # The catalog goes on from there: more batches, maintenance, pruning, and it still equals a rebuild.
    history.run(7, retry_every=2, snapshot_every=3)
    maintain(catalog, history)
    catalog.prune_history(uri, dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1))
    fresh = catalog_factory()
    rebuild_catalog(fresh, history.fm)
    exports_equal(as_rebuilt(catalog_export(catalog, uri)), catalog_export(fresh, uri))
    no_history(catalog, uri)
    assert catalog.layouts(uri) == fresh.layouts(uri)


def test_expiry_prunes_the_catalog_history_past_the_horizon(catalog: Catalog, history: History) -> None:
    uri = history.fm.root_uri
    history.run(9, retry_every=3, snapshot_every=3)
    maintain(catalog, history)  # the default horizon (a day): the history stays
    assert any(f[-1] == "deleted" for f in catalog_export(catalog, uri, include_history=True)["files"])
    time.sleep(0.05)
    short = MaintenanceSettings(**{**SETTINGS.to_json(), "catalog_history_seconds": 0.01})
    report = expire_versions(history.fm, short, catalog=catalog)
    assert report.errors == [] and report.catalog_rows_pruned > 0
    assert not [f for f in catalog_export(catalog, uri, include_history=True)["files"] if f[-1] == "deleted"]
    assert len(catalog.runs(uri)) <= 1  # this run's own row (it ends after the pruning)
