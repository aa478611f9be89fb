"""What a process learnt of a root's immutable files, kept while their files exist: parsed commit records and
snapshot manifests (`ParsedFiles`), and the SSTs found sound or corrupt (`KnownSsts`).

Commit records and manifests never change once written (DESIGN invariant 2), so a maintainer that runs
every few seconds reads only the new ones. An entry is found by root and path and trusted only for the
same size and mtime (a file damaged in place gets a new mtime). Each listing that read a prefix of a
root drops the entries under that prefix it did not list: what expiry deleted leaves the cache with its
files, so a long-running maintainer holds what its roots hold, not everything it ever read (a manifest
inlines its RocksDB metadata files, several KiB each). The inventory's listings do this for every kind
(`statekeeper.maintenance.inventory`), whichever operation listed.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable, Mapping
from typing import Generic, TypeVar

from statekeeper.maintenance.file_kinds import FileEntry
from statekeeper.store.layout import StoreId

V = TypeVar("V")


class ParsedFiles(Generic[V]):
    """Root -> path -> (size, mtime, parsed content); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._roots: dict[str, dict[str, tuple[int, float, V]]] = {}

    def get(self, root: str, entry: FileEntry) -> V | None:
        with self._lock:
            found = self._roots.get(root, {}).get(entry.path)
        if found is None or found[:2] != (entry.size, entry.mtime):
            return None
        return found[2]

    def put(self, root: str, entry: FileEntry, value: V) -> None:
        with self._lock:
            self._roots.setdefault(root, {})[entry.path] = (entry.size, entry.mtime, value)

    def keep_listed(self, root: str, prefixes: Iterable[str], listed: Collection[str]) -> None:
        """Drop the entries of `root` under `prefixes` (`""`: all of them) whose path is not in `listed`."""
        scopes = tuple(prefixes)
        with self._lock:
            entries = self._roots.get(root)
            if not entries:
                return
            gone = [p for p in entries if p not in listed and p.startswith(scopes)]
            for path in gone:
                del entries[path]

    def __len__(self) -> int:
        with self._lock:
            return sum(len(entries) for entries in self._roots.values())

    def clear(self) -> None:
        with self._lock:
            self._roots.clear()


class KnownSsts:
    """(root, store) -> names of the store's SSTs this process found one way (sound, or corrupt); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stores: dict[tuple[str, StoreId], set[str]] = {}

    def __contains__(self, key: tuple[str, StoreId, str]) -> bool:
        root, store, name = key
        with self._lock:
            return name in self._stores.get((root, store), ())

    def add(self, root: str, store: StoreId, names: Iterable[str]) -> None:
        with self._lock:
            self._stores.setdefault((root, store), set()).update(names)

    def names(self, root: str, store: StoreId) -> frozenset[str]:
        with self._lock:
            return frozenset(self._stores.get((root, store), ()))

    def keep_listed(self, root: str, listed: Mapping[StoreId, Collection[str]], *, whole_root: bool) -> None:
        """Keep, of each store of `root` in `listed`, the SSTs listed; `whole_root`: the listing covered every
        store, so a store it did not list has none left."""
        with self._lock:
            for (r, store), names in self._stores.items():
                if r != root:
                    continue
                if store in listed:
                    names.intersection_update(listed[store])
                elif whole_root:
                    names.clear()

    def __len__(self) -> int:
        with self._lock:
            return sum(len(names) for names in self._stores.values())

    def clear(self) -> None:
        with self._lock:
            self._stores.clear()


SOUND_SSTS = KnownSsts()
"""SSTs whose content matched its checksum in this process (`statekeeper.maintenance.snapshot_health`)."""
CORRUPT_SSTS = KnownSsts()
"""SSTs whose content did not match: a fresh snapshot must not reuse their names (snapshot repair)."""


__all__ = ["CORRUPT_SSTS", "SOUND_SSTS", "KnownSsts", "ParsedFiles"]
