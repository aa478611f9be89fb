"""What a maintainer's own inventory tells the catalog sync, so that the sync lists and reads nothing again.

A snapshot run tells the catalog about the snapshots it wrote with an incremental sync of those stores.
Listed from the location, that costs per store three listings (changelogs, manifests, SSTs) and a read of
the manifest just written, and the commit records are read again: on S3, three LISTs and a GET per store
per run, for what the run's `Inventory` already holds. An `InventoryView` serves those listings and reads
from the inventory instead:

- the commit records it parsed (`commits/` itself is still listed, from the sync's cursor on: one listing
  per sync, and a record the maintainer's expiry deleted is not told as present), up to its newest one, its
  *horizon*: a record committed after the inventory's listing is left for the next sync, because the view
  may lack its changelogs and the sync's changelog cursors would pass over them;
- the directories of the stores it `serves`: stores whose view in the inventory is what they hold (listed under
  the maintainer's lease, then kept true to what it deleted and wrote: `Inventory.deleted`,
  `Inventory.wrote_snapshot`), less what their writer added since the listing.

Anything else (a store whose snapshot another process wrote, a record the inventory could not read) is
listed and read from the location as before. What the view lacks (a writer's newer changelogs) is not
lost: the sync's cursors stop at what it was told, and the next sync lists from there.
"""

from __future__ import annotations

from collections.abc import Iterable

from statekeeper.maintenance.file_kinds import FileEntry
from statekeeper.maintenance.inventory import Inventory
from statekeeper.store.files import FileInfo
from statekeeper.store.formats.commit import CommitRecord
from statekeeper.store.formats.snapshot import SnapshotManifest
from statekeeper.store.layout import StoreId, parse_commit_name


class InventoryView:
    """Listings and parsed files of `inventory`: its commit records, and the files of the stores it `serves`."""

    def __init__(self, inventory: Inventory, serves: Iterable[StoreId]) -> None:
        self.inventory = inventory
        self.horizon = inventory.latest
        self._dirs: dict[str, Iterable[FileEntry]] = {}
        self._manifests: dict[str, SnapshotManifest] = {}
        for store in serves:
            files = inventory.files_of(store)
            self._dirs[store.changelog_dir()] = files.changelogs.values()
            self._dirs[store.snapshot_dir()] = files.manifests.values()
            self._dirs[store.sst_dir()] = files.ssts.values()
            for key, entry in files.manifests.items():
                manifest = files.manifest_data.get(key)
                if manifest is not None:
                    self._manifests[entry.path] = manifest

    def listing(self, prefix: str, start_after: str | None = None) -> list[FileInfo] | None:
        """The published files of directory `prefix` after `start_after`, in name order, as a listing gives
        them; None when the view does not hold that directory."""
        entries = self._dirs.get(prefix)
        if entries is None:
            return None
        after = start_after or ""
        return sorted(
            (FileInfo(e.path, e.size, e.mtime) for e in entries if e.path > after), key=lambda info: info.path
        )

    def within_horizon(self, listed: list[FileInfo]) -> list[FileInfo]:
        """Of a listing of `commits/` from the location, the records no newer than the view's horizon."""
        return [info for info in listed if (parse_commit_name(info.path) or 0) <= self.horizon]

    def commit_record(self, path: str) -> CommitRecord | None:
        """The record the inventory parsed from `path` (None: it has none, read it)."""
        version = parse_commit_name(path)
        if version is None:
            return None
        entry = self.inventory.commit_files.get(version)
        return self.inventory.records.get(version) if entry is not None and entry.path == path else None

    def manifest(self, path: str) -> SnapshotManifest | None:
        """The manifest the inventory parsed from `path` of a store it serves (None: read it)."""
        return self._manifests.get(path)


__all__ = ["InventoryView"]
