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
from statekeeper.store.layout import STORE_PREFIX_DEPTH, StoreId

V = TypeVar("V")


def scope_of(path: str) -> str:
    """The directory a path is kept under: its first `STORE_PREFIX_DEPTH` directories (a store's
    ``state/<op>/<partition>``), or fewer if it has fewer (``commits``). A listing covers whole scopes (the
    root, the commit records, one store), so dropping what it did not list touches only its own scopes'
    entries, not the root's."""
    parts = path.split("/", STORE_PREFIX_DEPTH)  # one C call: a listing computes this for every file it lists
    return "/".join(parts[:STORE_PREFIX_DEPTH] if len(parts) > STORE_PREFIX_DEPTH else parts[:-1])


class ParsedFiles(Generic[V]):
    """Root -> scope (`scope_of`) -> path -> (size, mtime, parsed content); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._roots: dict[str, dict[str, dict[str, tuple[int, float, V]]]] = {}

    def get(self, root: str, entry: FileEntry) -> V | None:
        with self._lock:
            found = self._roots.get(root, {}).get(scope_of(entry.path), {}).get(entry.path)
        if found is None or found[:2] != (entry.size, entry.mtime):
            return None
        return found[2]

    def put(self, root: str, entry: FileEntry, value: V) -> None:
        with self._lock:
            scopes = self._roots.setdefault(root, {})
            scopes.setdefault(scope_of(entry.path), {})[entry.path] = (entry.size, entry.mtime, value)

    def keep_listed(self, root: str, prefixes: Iterable[str], listed: Collection[str]) -> None:
        """Drop the entries of `root` under `prefixes` (`""`: all of them) whose path is not in `listed`.

        A store's prefix costs what its scope holds; any other prefix a pass over the root's scopes."""
        with self._lock:
            scopes = self._roots.get(root)
            if not scopes:
                return
            for prefix in prefixes:
                if prefix.endswith("/") and prefix.count("/") == STORE_PREFIX_DEPTH:  # a store's: one scope
                    if prefix[:-1] in scopes:
                        self._keep(scopes, prefix[:-1], listed, "")
                    continue
                for name in list(scopes):
                    if f"{name}/".startswith(prefix):
                        self._keep(scopes, name, listed, "")
                    elif prefix.startswith(f"{name}/"):
                        self._keep(scopes, name, listed, prefix)

    def discard(self, root: str, paths: Iterable[str]) -> None:
        """Drop the entries of `root` at `paths` (files this process deleted): O(paths), not O(scope)."""
        with self._lock:
            scopes = self._roots.get(root)
            if not scopes:
                return
            for path in paths:
                name = scope_of(path)
                if (entries := scopes.get(name)) is not None and entries.pop(path, None) is not None and not entries:
                    del scopes[name]

    @staticmethod
    def _keep(
        scopes: dict[str, dict[str, tuple[int, float, V]]], name: str, listed: Collection[str], under: str
    ) -> None:
        entries = scopes[name]
        for path in [p for p in entries if p not in listed and p.startswith(under)]:
            del entries[path]
        if not entries:
            del scopes[name]

    def __len__(self) -> int:
        with self._lock:
            return sum(len(entries) for scopes in self._roots.values() for entries in scopes.values())

    def clear(self) -> None:
        with self._lock:
            self._roots.clear()


class KnownSsts:
    """(root, store) -> names of the store's files (SSTs, or manifests) this process found one way (sound, or
    corrupt); thread-safe."""

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
            for store, kept in listed.items():
                if names := self._stores.get((root, store)):
                    names.intersection_update(kept)
            if whole_root:
                for (r, store), names in self._stores.items():
                    if r == root and store not in listed:
                        names.clear()

    def discard(self, root: str, store: StoreId, names: Iterable[str]) -> None:
        """Forget `names` of `store` (SSTs this process deleted)."""
        with self._lock:
            if known := self._stores.get((root, store)):
                known.difference_update(names)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(names) for names in self._stores.values())

    def clear(self) -> None:
        with self._lock:
            self._stores.clear()


SOUND_SSTS = KnownSsts()
"""SSTs whose content matched its checksum in this process (`statekeeper.maintenance.snapshot_checks`)."""
CORRUPT_SSTS = KnownSsts()
"""SSTs whose content did not match: a fresh snapshot must not reuse their names (snapshot repair)."""
PROVEN_SNAPSHOTS = KnownSsts()
"""Manifest paths of snapshots this process opened and found holding what they recorded at build time (or
wrote itself from files it opened): only these become an expiry base (DESIGN invariant 14)."""
UNOPENABLE_SNAPSHOTS = KnownSsts()
"""Manifest paths of snapshots that did not open, or opened to other content: bad snapshots (invariant 10)."""
UNOPENABLE_WHY: dict[tuple[str, str], str] = {}
"""(root, manifest path) -> why it is in `UNOPENABLE_SNAPSHOTS` (the file at fault, for reports)."""


__all__ = [
    "CORRUPT_SSTS",
    "PROVEN_SNAPSHOTS",
    "SOUND_SSTS",
    "UNOPENABLE_SNAPSHOTS",
    "KnownSsts",
    "ParsedFiles",
    "scope_of",
]
