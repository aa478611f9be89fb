"""What do the maintainer's caches of parsed files cost to keep true as a fleet grows (no writers, no I/O)?

What the maintainer's caches of parsed files cost to keep true as a fleet grows (no writers, no I/O).

After listing a store again (`Inventory.rescan_store`: a store new to the cycle, one whose lease was busy,
each store of a run without cycle leases), the maintainer drops what its caches hold of that store and the
listing lacks (`ParsedFiles.keep_listed`). Kept by root alone, that pass read every cached path of the root,
so a rescan of every store cost O(stores x files); kept by scope (a store's own entries) it is O(files).
This fills the kinds cache as a root of S stores fills it (per store: 30 changelogs, 12 SSTs, 3 manifests)
and times one `keep_listed` per store. After expiry deletes a batch of a store's files (`Inventory.deleted`),
the caches drop those files alone, O(batch), not the store's whole view; the second table times the
bookkeeping of deleting a large store's changelogs in batches of 1,000 (the deletion's own I/O apart)::

    python -m bench.fleet caches [--stores 128 1000] [--store-files 10000 100000]
"""

from __future__ import annotations

import argparse
import tempfile
import time

from statekeeper.maintenance.file_kinds import FileEntry
from statekeeper.maintenance.inventory import Inventory, clear_caches
from statekeeper.maintenance.parsed_cache import ParsedFiles
from statekeeper.store.files import LocalFileManager
from statekeeper.store.layout import StoreId


def rescan_every_store(stores: int) -> float:
    """CPU seconds of the cache upkeep of one rescan of each of `stores` stores."""
    cache: ParsedFiles[str] = ParsedFiles()
    listed: dict[str, set[str]] = {}
    for p in range(stores):
        prefix = f"{StoreId('agg', p).prefix}/"
        paths = [f"{prefix}changelogs/{v}.changelog" for v in range(30)]
        paths += [f"{prefix}sst/{i}.sst" for i in range(12)] + [f"{prefix}snapshots/{i}.manifest" for i in range(3)]
        listed[prefix] = set(paths)
        for path in paths:
            cache.put("root", FileEntry(path, "", 1, 0.0), "kind")
    t0 = time.process_time()
    for prefix, kept in listed.items():
        cache.keep_listed("root", [prefix], kept)
    return time.process_time() - t0


def delete_a_large_store(files: int, batch: int = 1_000) -> float:
    """CPU seconds of the inventory's and caches' bookkeeping of deleting `files` changelogs of one store, in
    batches of `batch` (no I/O: the entries are made as a listing makes them)."""
    store = StoreId("agg", 0)
    with tempfile.TemporaryDirectory() as root:
        inv = Inventory(LocalFileManager(root))
        entries = [
            inv._entry(FileEntry(store.changelog(v, f"{v:032x}"), "", 1, 0.0), temp_listing=False) for v in range(files)
        ]
        view = inv.files_of(store)
        for e in entries:
            view.add(e)
        t0 = time.process_time()
        for i in range(0, files, batch):
            inv.deleted(entries[i : i + batch], entries[i : i + batch], failed=False)
        seconds = time.process_time() - t0
        clear_caches()
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet caches", description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", type=int, nargs="+", default=[128, 1000])
    parser.add_argument("--store-files", type=int, nargs="+", default=[10_000, 100_000])
    args = parser.parse_args(argv)
    print("| stores | cached paths | cache upkeep of a rescan of every store (CPU s) |\n|---|---|---|")
    for n in args.stores:
        print(f"| {n:,} | {45 * n:,} | {rescan_every_store(n):.4f} |")
    print("\n| files in the store | bookkeeping of deleting them in batches of 1,000 (CPU s) |\n|---|---|")
    for n in args.store_files:
        print(f"| {n:,} | {delete_a_large_store(n):.4f} |")
    return 0
