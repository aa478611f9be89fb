"""Rescale of state that no snapshot covers yet, by relaying its changelogs' records: no old partition is loaded.

A source whose load would replay every changelog from the empty state (no snapshot on its lineage:
`LoadSource.EMPTY`) costs more to load than to read, and its records are in those changelogs already, in
order. So each new partition of a run whose sources are all such is written as a full-state changelog that
holds, source by source and block by block, the records of its key groups in them, superseded updates and
deletes included: replayed from the empty state, they leave exactly what the load-and-copy route
(store/rescale.py) would copy. Each source's changelogs are read once for the whole run, with the checks of
a load (`read_changelogs`).

The records are routed by the same `KeyGroupRules`: a `LEADING` column family by byte range (a sorted block is
cut by bisection), a `LOCATED` one key by key, a `SHARED` one by merging the values each source ends with; a
range delete stays a range delete. A record of a `LEADING` column family outside its source's key groups is
refused, naming the changelog. A changelog holding an SST block (an earlier rescale's copy, not snapshotted
since) cannot be read record by record, and counting the rows of typed state holds keys in memory (at most
`COUNTED_KEYS`; a range delete of a counted or a shared column family, which typed state never logs, would have to
scan them): past any of these, the run takes the load-and-copy route, as it does when a source has a snapshot to
start from.
"""

from __future__ import annotations

import bisect
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import islice
from operator import itemgetter, le

from statekeeper.store.commit_log import CommitLog
from statekeeper.store.errors import ConfigurationError, CorruptFileError, StatekeeperError
from statekeeper.store.files import CheckpointFileManager
from statekeeper.store.formats.changelog import ChangelogHeader, ChangelogWriter, RangeDelete, SstFile
from statekeeper.store.key_group_rules import CfRule, KeyGroupRules
from statekeeper.store.key_groups import group_byte_range
from statekeeper.store.layout import StoreId, new_checkpoint_id
from statekeeper.store.load_plan import CheckpointPlanSource, LoadPlan, LoadSource, resolve_load_plan
from statekeeper.store.loading import read_changelogs
from statekeeper.store.rescale_plan import PartitionBuild, RescaleError, RescalePlan, SharedRecords
from statekeeper.store.rocks import check_family_count
from statekeeper.store.state_store import StoreConfig

log = logging.getLogger(__name__)

Span = tuple[bytes, bytes | None]
"""A byte range ``[start, end)`` of keys (None: no end)."""

_EVERYTHING: Span = (b"", None)

COUNTED_KEYS = 2_000_000
"""At most this many keys are held in memory by a run of relays to count the rows of its new partitions (typed
state's row count, `KeyGroupRules.counted`: ~100 bytes a key); a run that would hold more loads and copies
instead, counting in RocksDB."""


class _UnrelayableError(StatekeeperError):
    """The run cannot be relayed (a source changelog holds an SST block or a range delete of a counted or a shared
    column family, or counting would hold too many keys)."""


@dataclass
class _Counted:
    """The keys the run's new partitions hold in memory to count them, against `COUNTED_KEYS`."""

    keys: int = 0

    def grew(self, by: int) -> None:
        self.keys += by
        if self.keys > COUNTED_KEYS:
            raise _UnrelayableError(f"counting its rows would hold more than {COUNTED_KEYS} keys in memory")


@dataclass
class _Out:
    """A new partition's full-state changelog being written."""

    partition: int
    writer: ChangelogWriter
    started: float
    counted: _Counted
    live: dict[str, set[bytes]] = field(default_factory=dict)
    """The keys each counted column family (`KeyGroupRules.counted`) holds so far."""
    shared: SharedRecords = field(default_factory=SharedRecords)
    cfs: set[str] = field(default_factory=set)
    bytes_read: int = 0

    def append(self, cf: str, keys: Sequence[bytes], values: Sequence[bytes | None], counted: bool) -> None:
        self.cfs.add(cf)
        if not keys:
            return
        self.writer.append_block(cf, keys, values)
        if counted:
            live = self.live.setdefault(cf, set())
            before = len(live)
            if None in values:
                for k, v in zip(keys, values, strict=True):
                    if v is None:
                        live.discard(k)
                    else:
                        live.add(k)
            else:
                live.update(keys)
            self.counted.grew(len(live) - before)

    def delete_range(self, cf: str, start: bytes, end: bytes, counted: bool) -> None:
        if counted:  # no writer of counted state logs one; finding the live keys it covers would scan them all
            raise _UnrelayableError(f"a range delete of counted column family {cf!r}")
        self.cfs.add(cf)
        self.writer.append_range_delete(cf, start, end)


@dataclass
class _Taker:
    """A new partition taking key groups ``[lo, hi)`` (keys `span`) of one source."""

    out: _Out
    lo: int
    hi: int
    span: Span


def _source_loads(
    fm: CheckpointFileManager, plan: RescalePlan, config: StoreConfig, sources: set[int]
) -> dict[int, LoadPlan] | None:
    """How each of `sources` would load at the source version; None if one starts from a snapshot (or expiry
    is removing its files right now: the load-and-copy route replans for that)."""
    commits, loads = CommitLog(fm), {}
    try:
        for q in sorted(sources):
            at = CheckpointPlanSource(fm, StoreId(plan.operator, q), commits)
            load = resolve_load_plan(at, plan.source_version, plan.source_ids[q], verify_commit=config.verify_commit)
            if load.source is not LoadSource.EMPTY:
                return None
            loads[q] = load
    except FileNotFoundError:
        return None
    return loads


def relay_partitions(
    fm: CheckpointFileManager, plan: RescalePlan, rules: KeyGroupRules, config: StoreConfig, run: list[int]
) -> list[PartitionBuild] | None:
    """Write and publish the new partitions of `run` from their sources' changelogs; None (nothing published)
    where a source has a snapshot or a changelog with an SST block: the caller loads and copies instead."""
    takes = {p: plan.sources_of(p) for p in run}
    loads = _source_loads(fm, plan, config, {q for given in takes.values() for q, _lo, _hi in given})
    if loads is None:
        return None
    work = tempfile.mkdtemp(prefix=f"statekeeper-relay-{plan.operator}-")
    counted = _Counted()
    outs = {p: _open(plan, p, config, work, counted) for p in run}
    try:
        try:
            for q, load in loads.items():
                takers = [_Taker(outs[p], lo, hi, _span(plan, lo, hi)) for p in run for g, lo, hi in takes[p] if g == q]
                takers[0].out.bytes_read += _relay_source(fm, plan, rules, config, q, load, takers, work)
        except (_UnrelayableError, FileNotFoundError) as e:
            log.info("%s: loading the old partitions instead of relaying their changelogs (%s)", plan.describe(), e)
            return None
        return [_publish(fm, plan, rules, out) for out in outs.values()]
    finally:
        for out in outs.values():
            out.writer.abandon()
        shutil.rmtree(work, ignore_errors=True)


def _open(plan: RescalePlan, p: int, config: StoreConfig, work: str, counted: _Counted) -> _Out:
    header = ChangelogHeader(plan.operator, p, plan.new_version, new_checkpoint_id(), ())
    path = os.path.join(work, f"{p}-{header.checkpoint_id}.changelog")
    return _Out(p, ChangelogWriter(path, header, level=config.compression_level), time.perf_counter(), counted)


def _span(plan: RescalePlan, lo: int, hi: int) -> Span:
    return _EVERYTHING if plan.kind == "rollback" else group_byte_range(lo, hi)


def _relay_source(
    fm: CheckpointFileManager,
    plan: RescalePlan,
    rules: KeyGroupRules,
    config: StoreConfig,
    q: int,
    load: LoadPlan,
    takers: list[_Taker],
    work: str,
) -> int:
    """Relay every changelog of old partition `q` (in load order) to the new partitions taking its groups; returns
    the bytes read."""
    rescale = plan.kind == "rescale"
    own = group_byte_range(*plan.source_layout.groups_of(q)) if rescale and plan.source_layout else None
    ends = SharedRecords()  # the SHARED records as the source ends with them
    counted: dict[str, bool] = {}
    read = 0
    for reader in read_changelogs(fm, load.store, load.replay, work, config.read_ahead):
        read += reader.size or 0
        for entry in reader.entries(None):
            if isinstance(entry, SstFile):
                raise _UnrelayableError(f"{reader.name} holds an SST block of column family {entry.cf!r}")
            cf = entry.cf if isinstance(entry, RangeDelete) else entry[0]
            rule = rules.rule(cf) if rescale else CfRule.LEADING
            counts = counted.get(cf)
            if counts is None:
                check_family_count(len(counted) + 1, f"old partition {q}", cf, read_from=reader.name)
                counts = counted[cf] = rules.counted(cf)
            if isinstance(entry, RangeDelete):
                _relay_range_delete(entry, rule, takers, counts, reader.name)
            elif rule is CfRule.SHARED:
                for k, v in zip(entry[1], entry[2], strict=True):
                    ends.put(cf, k, v, reader.name)
            elif rule is CfRule.LOCATED:
                groups = _located(rules, cf, entry[1], reader.name)
                for t in takers:
                    picked = [i for i, g in enumerate(groups) if t.lo <= g < t.hi]
                    t.out.append(cf, *_pick(entry[1], entry[2], picked), counts)
            else:
                _relay_leading(reader.name, cf, entry[1], entry[2], own, takers, counts)
    name = f"{plan.operator}/{q} version {plan.source_version}"
    for t in takers:
        for (cf, k), v in sorted(ends.records.items()):
            t.out.cfs.add(cf)
            if v is not None:
                t.out.shared.merge(rules, cf, k, v, name)
    return read


def _located(rules: KeyGroupRules, cf: str, keys: list[bytes], name: str) -> list[int]:
    """The key group of each key of a `LOCATED` column family; a key the rules cannot place fails naming the file."""
    try:
        return [rules.locate(cf, k) for k in keys]
    except StatekeeperError as e:
        raise CorruptFileError(f"column family {cf!r}: {e}", name) from None


def _relay_leading(
    name: str,
    cf: str,
    keys: list[bytes],
    values: list[bytes | None],
    own: Span | None,
    takers: list[_Taker],
    counts: bool,
) -> None:
    """Cut a record block of a column family whose keys lead with their group among the takers' byte ranges."""
    if not keys:  # a block of no records (none written, but well framed): its column family exists
        for t in takers:
            t.out.cfs.add(cf)
        return
    ordered = all(map(le, keys, islice(keys, 1, None)))
    first, last = (keys[0], keys[-1]) if ordered else (min(keys), max(keys))
    if own is not None and (first < own[0] or (own[1] is not None and last >= own[1])):
        bad = first if first < own[0] else last
        raise RescaleError(
            f"{name}: column family {cf!r} holds key {bad[:16]!r}, which does not lead with one of the partition's "
            "key groups: pass the key-group rules of the store's writer (rules=TypedStateKeys() for a "
            "statekeeper.store.spark operator, as `statekeeper rescale` does)"
        )
    for t in takers:
        start, end = t.span
        if start <= first and (end is None or last < end):  # the whole block is the taker's
            t.out.append(cf, keys, values, counts)
            return
    if ordered:
        for t in takers:
            start, end = t.span
            i = bisect.bisect_left(keys, start)
            j = len(keys) if end is None else bisect.bisect_left(keys, end, i)
            t.out.append(cf, keys[i:j], values[i:j], counts)
        return
    for t in takers:
        start, end = t.span
        picked = [i for i, k in enumerate(keys) if start <= k and (end is None or k < end)]
        t.out.append(cf, *_pick(keys, values, picked), counts)


def _relay_range_delete(entry: RangeDelete, rule: CfRule, takers: list[_Taker], counts: bool, name: str) -> None:
    cf, start, end = entry.cf, entry.start, entry.end
    if rule is CfRule.SHARED:  # no writer of shared metadata logs one; finding the keys it covers would scan them
        raise _UnrelayableError(f"{name} holds a range delete of shared column family {cf!r}")
    for t in takers:
        if rule is CfRule.LEADING:  # only the part inside the taker's groups
            lo, hi = max(start, t.span[0]), end if t.span[1] is None else min(end, t.span[1])
            if lo < hi:
                t.out.delete_range(cf, lo, hi, counts)
        else:  # it deletes only keys the taker holds, as it did in the source
            t.out.delete_range(cf, start, end, counts)


def _pick(keys: list[bytes], values: list[bytes | None], picked: list[int]) -> tuple[list[bytes], list[bytes | None]]:
    if not picked:
        return [], []
    if len(picked) == len(keys):
        return keys, values
    get = itemgetter(*picked)
    if len(picked) == 1:
        return [get(keys)], [get(values)]
    return list(get(keys)), list(get(values))


def _publish(fm: CheckpointFileManager, plan: RescalePlan, rules: KeyGroupRules, out: _Out) -> PartitionBuild:
    """Add the merged shared records and the rules' fix-ups, seal the changelog and publish it."""
    try:  # each source held no more, but their union may: such a partition could not be loaded
        check_family_count(len(out.cfs), f"new partition {out.partition}")
    except ConfigurationError as e:
        raise RescaleError(f"{plan.describe()}: {e}") from None
    cfs = sorted(out.cfs)
    counts = {cf: len(out.live.get(cf, ())) for cf in cfs if rules.counted(cf)}
    for cf, key, value in rules.finish(cfs, counts):
        out.shared.put(cf, key, value, f"{plan.operator}/{out.partition} (new)")
    by_cf: dict[str, list[tuple[bytes, bytes | None]]] = {}
    for (cf, key), held in sorted(out.shared.records.items()):
        by_cf.setdefault(cf, []).append((key, held))
    for cf, records in by_cf.items():
        out.writer.append_block(cf, [k for k, _v in records], [v for _k, v in records])
    writer, header = out.writer, out.writer.header
    size = writer.finish()
    fm.put_file(writer.path, StoreId(plan.operator, out.partition).changelog(header.version, header.checkpoint_id))
    os.unlink(writer.path)
    seconds = time.perf_counter() - out.started
    return PartitionBuild(
        out.partition, header.checkpoint_id, False, writer.records, 0, out.bytes_read, size, seconds, relayed=True
    )


__all__ = ["relay_partitions"]
