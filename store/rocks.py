"""RocksDB options and the process-wide memory limit shared by every open store instance.

All instances charge their memtables (write buffer manager) to one LRU block cache that also holds
index and filter blocks, so N open stores stay within one configured limit instead of N of them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import rocksdict as rd

from statekeeper.store.errors import ConfigurationError, CorruptFileError
from statekeeper.store.formats.limits import MAX_COLUMN_FAMILIES

log = logging.getLogger(__name__)

MEMORY_ENV = "STATEKEEPER_MEMORY_MB"
DEFAULT_CF = "default"
MAX_MANIFEST_BYTES = 8 << 10
"""RocksDB's MANIFEST appends an edit at every flush and compaction and, by default, starts a new one only past
1 GiB. A snapshot inlines it (`SnapshotManifest.db_files`), so a replica kept for days would write ever larger
snapshots, and a maintainer would cache ever larger manifests. Past this size the next edit starts a new
MANIFEST holding just the live files (~100 bytes per SST)."""


@dataclass(frozen=True)
class MemoryLimits:
    """`total_bytes` caps block cache + memtables of all stores in this process."""

    total_bytes: int = 256 << 20
    write_buffer_fraction: float = 0.5
    write_buffer_size: int = 16 << 20  # per column family memtable, before the shared cap applies

    def __post_init__(self) -> None:
        if self.total_bytes < 8 << 20:
            raise ConfigurationError(f"memory limit total_bytes={self.total_bytes} is below the 8 MiB minimum")
        if not 0.05 <= self.write_buffer_fraction <= 0.9:
            raise ConfigurationError(f"write_buffer_fraction={self.write_buffer_fraction} must be within [0.05, 0.9]")

    @classmethod
    def from_env(cls) -> MemoryLimits:
        raw = os.environ.get(MEMORY_ENV)
        if raw is None:
            return cls()
        try:
            mb = int(raw)
        except ValueError:
            raise ConfigurationError(f"{MEMORY_ENV}={raw!r} is not an integer number of MiB") from None
        return cls(total_bytes=mb << 20)


class _SharedMemory:
    def __init__(self, limits: MemoryLimits) -> None:
        self.limits = limits
        self.cache = rd.Cache(limits.total_bytes)
        # allow_stall stays off: RocksDB only flushes the DB that is writing, so a stall waits forever on
        # memtables held by idle stores (or pinned by an open iterator). `relieve_memory_pressure` does
        # the flushing instead, from the writing thread, across every open store.
        self.write_buffer_manager = rd.WriteBufferManager.new_write_buffer_manager_with_cache(
            int(limits.total_bytes * limits.write_buffer_fraction), False, self.cache
        )
        self.memtables: dict[tuple[int, str], rd.Rdict] = {}  # (owner id, cf name) -> column family
        # owner id -> finalizer that forgets its entries when the owner is garbage collected
        self.owners: dict[int, weakref.finalize[[int], object]] = {}
        self.flush_lock = threading.Lock()


_lock = threading.Lock()
_shared: _SharedMemory | None = None


def configure_memory(limits: MemoryLimits) -> None:
    """Set the process-wide limit; must happen before the first store opens (or repeat the same)."""
    global _shared
    with _lock:
        if _shared is not None and _shared.limits != limits:
            raise ConfigurationError(
                f"memory limits are already {_shared.limits} for this process; configure them before "
                "opening the first store"
            )
        if _shared is None:
            _shared = _SharedMemory(limits)


def default_memory(limits: MemoryLimits) -> None:
    """Use `limits` in this process unless it is already set: by `STATEKEEPER_MEMORY_MB`, by `configure_memory`
    or by an open store. For processes whose role implies another default (a Spark Python worker: one per core)."""
    global _shared
    with _lock:
        if _shared is None and MEMORY_ENV not in os.environ:
            _shared = _SharedMemory(limits)
            log.info("statekeeper memory limit: %d MiB", limits.total_bytes >> 20)


def shared_memory() -> _SharedMemory:
    global _shared
    with _lock:
        if _shared is None:
            _shared = _SharedMemory(MemoryLimits.from_env())
            log.info("statekeeper memory limit: %d MiB", _shared.limits.total_bytes >> 20)
        return _shared


MIN_FLUSH_BYTES = 256 << 10
"""Active memtables smaller than this are not worth an SST file of their own."""


def track_memtable(owner: object, name: str, cf: rd.Rdict) -> None:
    """Make column family `cf` of `owner` (a store) a candidate for `relieve_memory_pressure`.

    The entry holds `cf` (and so its DB) until `untrack_memtables(owner)` or until `owner` is
    garbage collected, so a store dropped without `close()` still frees its DB.
    """
    mem = shared_memory()
    key = id(owner)
    with _lock:
        _reap_dead_owners(mem)  # before reuse of a dead owner's id can confuse the two
        mem.memtables[(key, name)] = cf
        if key not in mem.owners:
            mem.owners[key] = weakref.finalize(owner, _dead_owners.append, key)


_dead_owners: list[int] = []
"""Ids of stores collected without `close()`. The garbage collector can run the finalizer in any
thread at any allocation, also while that thread holds `_lock` (a lock taken there would deadlock,
and a dict changed there would break an iteration), so the finalizer only appends here."""


def _reap_dead_owners(mem: _SharedMemory) -> None:
    """Forget the column families of collected stores; call with `_lock` held."""
    while _dead_owners:
        key = _dead_owners.pop()
        mem.owners.pop(key, None)
        for k in [k for k in mem.memtables if k[0] == key]:
            del mem.memtables[k]


def forget_collected_stores() -> None:
    """Drop the registry's references to stores collected without `close()` (also done on every
    track/untrack), releasing their DBs."""
    mem = _shared
    if mem is not None:
        with _lock:
            _reap_dead_owners(mem)


def untrack_memtables(owner: object) -> None:
    """Forget every column family of `owner`; call before closing its DB."""
    mem = _shared
    if mem is None:
        return
    key = id(owner)
    with _lock:
        for k in [k for k in mem.memtables if k[0] == key]:
            del mem.memtables[k]
        _reap_dead_owners(mem)


def flush_memtables(owner: object) -> int:
    """Flush the active memtables of `owner`'s column families that hold at least MIN_FLUSH_BYTES.

    For a store that has gone idle: RocksDB never flushes an idle memtable by itself, and what it holds
    is charged to the shared cache, so a few idle stores crowd out the blocks the busy ones read.
    Returns the number flushed.
    """
    mem = _shared
    if mem is None:
        return 0
    key = id(owner)
    with _lock:
        own = [cf for (k, _), cf in mem.memtables.items() if k == key]
    return sum(_flush(cf, wait=True) for cf in own if (_active_bytes(cf) or 0) >= MIN_FLUSH_BYTES)


def _active_bytes(cf: rd.Rdict) -> int | None:
    """Size of `cf`'s active memtable; None once its owner closed it (concurrently)."""
    try:
        return cf.property_int_value("rocksdb.cur-size-active-mem-table") or 0
    except Exception:
        return None


def _flush(cf: rd.Rdict, *, wait: bool) -> bool:
    """Flush `cf`'s memtable; False if its owner closed it concurrently."""
    try:
        cf.flush(wait=wait)
    except Exception:
        return False
    return True


def relieve_memory_pressure() -> int:
    """Keep the memtables of all stores within their share of the process-wide limit.

    Writers call this between blocks of updates. Under the budget it costs one counter read. Over it,
    the calling thread flushes the largest active memtables of any open store (idle ones included)
    and waits for those flushes: backpressure like a write stall, but it cannot deadlock, because
    every flush completes by itself. Returns the number of memtables flushed.
    """
    mem = _shared
    if mem is None:
        return 0
    wbm = mem.write_buffer_manager
    budget = wbm.get_buffer_size()
    if wbm.get_usage() <= budget:
        return 0
    with mem.flush_lock:  # one thread flushes at a time; the others wait here, which is the backpressure
        with _lock:
            candidates = list(mem.memtables.values())
        sized = [(size, cf) for cf in candidates if (size := _active_bytes(cf)) is not None]
        sized.sort(key=lambda t: t[0], reverse=True)
        excess = wbm.get_usage() - budget * 3 // 4
        chosen = []
        for size, cf in sized:
            if size < MIN_FLUSH_BYTES or excess <= 0:
                break
            chosen.append(cf)
            excess -= size
        return sum(_flush(cf, wait=i == len(chosen) - 1) for i, cf in enumerate(chosen))


def db_options(*, bulk_replay: bool = False) -> rd.Options:
    """Options for every store DB and column family; built once per open so nothing is shared by accident.

    `bulk_replay`: a DB only written in large batches and read after a flush (maintenance's warm
    copies): a vector memtable appends each write and sorts once at flush, ~10x less CPU per
    insert than the default skip list, whose reads are slow until then.
    """
    mem = shared_memory()
    opts = rd.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_write_buffer_manager(mem.write_buffer_manager)
    opts.set_write_buffer_size(mem.limits.write_buffer_size)
    opts.set_max_write_buffer_number(3)
    opts.set_compression_type(rd.DBCompressionType.lz4())
    if bulk_replay:
        opts.set_memtable_factory(rd.MemtableFactory.vector())
        opts.set_allow_concurrent_memtable_write(False)
    opts.set_max_background_jobs(2)
    opts.set_bytes_per_sync(1 << 20)
    opts.set_keep_log_file_num(2)
    opts.set_max_manifest_file_size(MAX_MANIFEST_BYTES)
    opts.set_max_open_files(256)
    # Its 16 default threads are spawned at every open but only open files up front with unlimited
    # max_open_files: one saves ~1 ms per open (rescales and loads open many small DBs).
    opts.set_max_file_opening_threads(1)
    table = rd.BlockBasedOptions()
    table.set_block_cache(mem.cache)
    table.set_cache_index_and_filter_blocks(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    table.set_bloom_filter(10, False)
    table.set_block_size(16 << 10)
    opts.set_block_based_table_factory(table)
    return opts


def flush_all(db: rd.Rdict, column_families: Iterable[str]) -> None:
    """Flush the memtables of `column_families` of `db` and wait (rocksdict lets other threads run meanwhile)."""
    for name in column_families:
        (db if name == DEFAULT_CF else db.get_column_family(name)).flush(wait=True)


def ingest_sst(cf_db: rd.Rdict, path: str) -> None:
    """Move the external SST file at `path` into `cf_db` (an Rdict bound to one column family); its
    records get newer sequence numbers than every write before, as if written now."""
    ingest = rd.IngestExternalFileOptions()
    ingest.set_move_files(True)
    cf_db.ingest_external_file([path], ingest)


def write_options() -> rd.WriteOptions:
    wo = rd.WriteOptions()
    # A property at run time; the bundled stub wrongly declares a method. The changelog is the durability.
    wo.disable_wal = True  # type: ignore[assignment]
    return wo


def check_family_count(count: int, owner: str, name: str | None = None, *, read_from: str | None = None) -> None:
    """Refuse `count` column families in `owner` past `MAX_COLUMN_FAMILIES` (`name`: the one that would make them):
    a `ConfigurationError` for a writer, a `CorruptFileError` naming the file they were `read_from`."""
    if count > MAX_COLUMN_FAMILIES:
        what = f"column family {name!r} would make {count}" if name is not None else f"{count} column families"
        message = f"{owner}: {what}, above the limit of {MAX_COLUMN_FAMILIES}"
        raise ConfigurationError(message) if read_from is None else CorruptFileError(message, read_from)


def open_db(path: str, column_families: Iterable[str] = (), *, bulk_replay: bool = False) -> rd.Rdict:
    """Open (or create) the DB at `path`, passing every column family and its options explicitly
    (`bulk_replay`: see `db_options`)."""
    names = set(column_families)
    if os.path.exists(os.path.join(path, "CURRENT")):
        names.update(rd.Rdict.list_cf(path, db_options()))
    names.discard(DEFAULT_CF)
    check_family_count(len(names) + 1, "the DB", read_from=path)  # a restored snapshot's: before RocksDB opens each
    opts = db_options(bulk_replay=bulk_replay)
    db = rd.Rdict(path, opts, column_families={n: db_options(bulk_replay=bulk_replay) for n in sorted(names)})
    db.set_write_options(write_options())
    return db


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_TRIM = _malloc_trim()


def release_free_heap() -> None:
    """Hand the heap pages freed by a unit of work back to the OS (glibc's ``malloc_trim``; elsewhere nothing).

    Long-lived processes (a maintainer's cycles, a Spark Python worker's tasks, Dagster's ticks) open and close
    RocksDB instances and connections on several threads, whose freed blocks glibc keeps in per-thread arenas:
    without this their RSS creeps up by what is free but fragmented, not by what they hold. 1-3 ms a call."""
    if _TRIM is not None:
        _TRIM(0)


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) so that `peak_rss` measures only what follows (Linux >= 4.0);
    False where it cannot be reset."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss() -> int | None:
    """This process's peak RSS in bytes since `reset_peak_rss` or its start (VmHWM: it catches spikes between
    samples); None where the kernel does not tell it."""
    return _status_bytes("VmHWM:")


def current_rss() -> int | None:
    """This process's RSS in bytes now (VmRSS); None where the kernel does not tell it."""
    return _status_bytes("VmRSS:")


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
