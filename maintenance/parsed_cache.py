"""Parsed commit records and snapshot manifests, kept per process while their files exist.

Commit records and manifests never change once written (DESIGN invariant 2), so a maintainer that runs
every few seconds reads only the new ones. An entry is found by root and path and trusted only for the
same size and mtime (a file damaged in place gets a new mtime). Each listing that read a prefix of a
root drops the entries under that prefix it did not list: what expiry deleted leaves the cache with its
files, so a long-running maintainer holds what its roots hold, not everything it ever read (a manifest
inlines its RocksDB metadata files, several KiB each).
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable
from typing import Generic, TypeVar

from statekeeper.maintenance.file_kinds import FileEntry

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


__all__ = ["ParsedFiles"]
