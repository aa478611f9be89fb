"""Rescale and rollback of an operator's state: new partitions built from committed ones, by key-group range.

A rescale re-lays out committed version ``v`` of an operator for a new partition count: each new
partition takes exactly its key groups (docs/formats.md, "Key groups") from the old partitions whose
ranges overlap it, by range scans of the column families whose keys lead with the key group (other
column families are filtered per key, or shared, as `KeyGroupRules` says; offline, state that no snapshot
covers yet is relayed from its changelogs instead of loaded: store/rescale_relay.py). Each new partition is
written as a *full-state changelog* (an empty lineage: a load replays from the empty state starting
there) and the batch's commit record ``v + 1`` names the new layout, so the switch is atomic (DESIGN
invariant 11): a crash before the record leaves the old layout and only uncommitted files (orphans for
maintenance); after it, the new one. A rollback is the same with the layout of an older retained
version and every key copied: the retained state becomes the head again as a new version.

Both repeat the batch id of the version they copy (``CommitRecord.batch_id``), so a streaming driver
maps its next batch to the version after them.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from itertools import islice

from statekeeper.store.commit_log import CommitLog
from statekeeper.store.errors import LineageError, StatekeeperError
from statekeeper.store.files import CheckpointFileManager
from statekeeper.store.key_group_rules import CfRule, GroupLedKeys, KeyGroupRules
from statekeeper.store.key_groups import KEY_GROUP_LIMIT, group_at, group_byte_range
from statekeeper.store.loading import load_bytes
from statekeeper.store.rescale_plan import (
    PartitionBuild,
    RescaleError,
    RescalePlan,
    SharedRecords,
    plan_rescale,
    plan_rollback,
)
from statekeeper.store.rescale_relay import relay_partitions
from statekeeper.store.state_store import StateStore, StoreConfig

log = logging.getLogger(__name__)

COPY_CHUNK = 8192
"""Records moved per write batch."""


@dataclass
class RescaleResult:
    plan: RescalePlan
    checkpoint_ids: tuple[str, ...] = ()
    records: int = 0
    """Records copied into new owners (the moved key groups; relayed, every record of their new changelogs)."""
    deleted: int = 0
    """Records deleted from partitions kept in place (the key groups they gave away)."""
    bytes_read: int = 0
    """Bytes read from the checkpoint: snapshots (manifests and SSTs) and changelogs loaded or relayed."""
    bytes_written: int = 0
    """Bytes of the new changelogs."""
    seconds: float = 0.0
    slowest_build_seconds: float = 0.0
    """The longest `build_partition` (the builds run in parallel: the rest of `seconds` is scheduling,
    planning and the commit record)."""
    relayed: int = 0
    """New partitions written from their old partitions' changelogs (store/rescale_relay.py); the others were
    copied from loaded old partitions."""
    committed: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "operator": self.plan.operator,
            "kind": self.plan.kind,
            "source_version": self.plan.source_version,
            "new_version": self.plan.new_version,
            "source_partitions": len(self.plan.source_ids),
            "partitions": len(self.checkpoint_ids) or len(self.plan.source_ids),
            "moved_key_groups": self.plan.moved_groups(),
            "records": self.records,
            "deleted": self.deleted,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "seconds": round(self.seconds, 3),
            "slowest_build_seconds": round(self.slowest_build_seconds, 3),
            "relayed_partitions": self.relayed,
            "committed": self.committed,
        }


class _Target:
    """One new partition being written, from every old partition that gives it key groups."""

    def __init__(self, store: StateStore, owned: tuple[int, int] | None = None) -> None:
        self.store = store
        self.owned = owned
        """In place (the store was loaded at the old version): the key groups ``[lo, hi)`` it owns in
        the new layout, outside which `_trim` deletes; None for a full-state changelog."""
        self.poured: Counter[str] = Counter()
        """Records copied into each column family."""
        self.deleted = 0
        self.bytes_read = 0
        self.shared = SharedRecords()


BuildRun = Callable[[list[int]], list[PartitionBuild]]
"""Builds a run of new partitions in order, in one place (`build_partitions`)."""

PartitionRunner = Callable[[BuildRun, list[int]], Iterable[PartitionBuild]]
"""Runs the builds of the new partitions somewhere, as runs of neighbours (`contiguous_runs`): threads
or processes here, Spark's executors at a restart or with ``--engine spark``."""


def contiguous_runs(partitions: list[int], runs: int) -> list[list[int]]:
    """`partitions` cut into at most `runs` runs of neighbours of about equal length. Neighbouring new
    partitions take their key groups from the same old ones, which a run loads once for all of them."""
    runs = max(1, min(runs, len(partitions)))
    size, extra = divmod(len(partitions), runs)
    out, start = [], 0
    for i in range(runs):
        end = start + size + (i < extra)
        out.append(partitions[start:end])
        start = end
    return out


def in_threads(workers: int) -> PartitionRunner:
    """Build the new partitions on a pool of `workers` threads of this process, a run each."""

    def run(build: BuildRun, partitions: list[int]) -> list[PartitionBuild]:
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            return [b for done in pool.map(build, contiguous_runs(partitions, workers)) for b in done]

    return run


def in_processes(workers: int) -> PartitionRunner:
    """Build the new partitions on up to `workers` processes, at most one per CPU: this one and spawned ones,
    a run each. The copy's per-record loop holds the GIL (rocksdict), so threads of one process share one
    core; processes do not. This process takes the last run while the others start (the first run holds
    partition 0, the one a rescale keeps in place: the lightest). A build that fails, or a process that dies,
    fails the rescale before its commit record (what was written is orphaned, as after a crash). A daemonic
    process, which may not start any, builds on threads."""

    def run(build: BuildRun, partitions: list[int]) -> list[PartitionBuild]:
        if multiprocessing.current_process().daemon:
            return list(in_threads(workers)(build, partitions))
        runs = contiguous_runs(partitions, min(workers, _cpus()))
        if len(runs) == 1:
            return build(runs[0])
        level = logging.getLogger("statekeeper").getEffectiveLevel()
        context = multiprocessing.get_context("spawn")  # never fork a process that may run threads
        with ProcessPoolExecutor(len(runs) - 1, context, initializer=_log_at, initargs=(level,)) as pool:
            elsewhere = [(r, pool.submit(_build_elsewhere, build, r)) for r in runs[:-1]]
            here = build(runs[-1])
            builds = []
            for r, done in elsewhere:
                try:
                    builds += done.result()
                except BrokenProcessPool as e:
                    raise RescaleError(f"the process building new partitions {r} ended: {e}") from None
        return builds + here

    return run


def _cpus() -> int:
    """The CPUs this process may run on (its affinity where the OS has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def _log_at(level: int) -> None:
    """A build process logs what the rescaling process would, to its stderr."""
    logging.basicConfig(format="%(levelname)s %(name)s [%(processName)s]: %(message)s")
    logging.getLogger("statekeeper").setLevel(level)


def _build_elsewhere(build: BuildRun, run: list[int]) -> list[PartitionBuild]:
    """`build(run)` in a build process. A statekeeper error crosses back as it is (`StatekeeperError` rebuilds
    anywhere); any other as a `RescaleError` naming it (another library's may not rebuild in this process)."""
    try:
        return build(run)
    except StatekeeperError:
        raise
    except Exception as e:
        raise RescaleError(f"building new partitions {run}: {type(e).__name__}: {e}") from e


def _chunks(items: Iterator[tuple[bytes, bytes]]) -> Iterator[tuple[Sequence[bytes], Sequence[bytes]]]:
    """`items` as (keys, values) lists of up to `COPY_CHUNK` records (the per-record loops in C)."""
    while chunk := list(islice(items, COPY_CHUNK)):
        keys, values = zip(*chunk, strict=True)
        yield keys, values


def _check_group_led(plan: RescalePlan, src: StateStore, q: int, cf: str, name: str) -> None:
    """Refuse, before anything is committed, to copy byte ranges of a column family whose first or last key does
    not lead with one of old partition `q`'s key groups: its keys are not group-led (a statekeeper.store.spark
    operator's metadata under the plain store's rules), or a changelog put a key of a group the partition does not
    own (sorted, such keys come first or last), and a range copy would drop them."""
    if plan.source_layout is None:
        return
    first = next(iter(src.column_family(cf).items()), None)
    if first is None:
        return
    lo, hi = plan.source_layout.groups_of(q)
    end = group_byte_range(lo, hi)[1]
    above = None if end is None else next(iter(src.column_family(cf).items(end)), None)
    if len(first[0]) < 2 or not lo <= group_at(first[0]) < hi:
        raise RescaleError(
            f"{plan.describe()}: column family {cf!r} of {name} holds key {first[0][:16]!r}, which does not lead "
            f"with one of the partition's key groups [{lo}, {hi}): pass the key-group rules of the store's writer "
            "(rules=TypedStateKeys() for a statekeeper.store.spark operator, as `statekeeper rescale` does); with "
            "them, the partition holds a key of a group it does not own"
        )
    if above is not None:
        raise RescaleError(
            f"{plan.describe()}: column family {cf!r} of {name} holds key {above[0][:16]!r} of key group "
            f"{group_at(above[0])}, which the partition does not own (its groups are [{lo}, {hi})): its state holds a "
            "key no partition of the new layout would get"
        )


def _give(plan: RescalePlan, src: StateStore, q: int, lo: int, hi: int, target: _Target, rules: KeyGroupRules) -> None:
    """Pour the key groups ``[lo, hi)`` of old partition `q` (loaded in `src`) into `target`."""
    name = f"{plan.operator}/{q} version {plan.source_version}"
    for cf in src.column_families():
        rule = rules.rule(cf) if plan.kind == "rescale" else CfRule.LEADING
        if plan.kind == "rollback":
            target.poured[cf] += target.store.put_sorted(src.items(cf=cf), cf=cf)
        elif rule is CfRule.LEADING:  # a byte range in key order: one SST file ingested
            _check_group_led(plan, src, q, cf, name)
            start, end = group_byte_range(lo, hi)
            target.poured[cf] += target.store.put_sorted(src.items(start, end, cf=cf), cf=cf)
        elif rule is CfRule.LOCATED:
            for keys, values in _chunks((k, v) for k, v in src.items(cf=cf) if lo <= rules.locate(cf, k) < hi):
                target.store.put_batch(keys, values, cf=cf)
                target.poured[cf] += len(keys)
        else:
            for k, v in src.items(cf=cf):
                if (merged := target.shared.merge(rules, cf, k, v, name)) is not None:
                    target.store.put(k, merged, cf=cf)


def _open_target(
    fm: CheckpointFileManager,
    plan: RescalePlan,
    p: int,
    rules: KeyGroupRules,
    config: StoreConfig,
    into: StateStore | None,
    sources: SourceStores,
) -> _Target:
    """New partition `p` (in `into`, or a store of its own): its old store loaded at the source version
    when it keeps groups in place (taken over from `sources` when they loaded it for a neighbour: one
    load, not two), else an empty store whose commit is a full-state changelog."""
    if p not in plan.kept_in_place():
        store = into or StateStore(fm, plan.operator, p, config=replace(config, local_dir=None))
        return _Target(store.begin_full_state(plan.head_version))
    taken = None if into is not None else sources.take(p)
    if taken is not None:
        store, read = taken, 0  # its bytes were counted where it was loaded
    else:
        store = into or StateStore(fm, plan.operator, p, config=sources.config)
        try:
            store.load(plan.source_version, plan.source_ids[p])
        except BaseException:
            if into is None:
                store.close()
            raise
        read = load_bytes(fm, store.last_plan)
    assert plan.target_layout is not None
    target = _Target(store, plan.target_layout.groups_of(p))
    target.bytes_read = read
    name = f"{plan.operator}/{p} version {plan.source_version}"
    for cf in store.column_families():
        if rules.rule(cf) is CfRule.SHARED:
            for k, v in store.items(cf=cf):
                target.shared.put(cf, k, v, name)
    return target


def _trim(target: _Target, rules: KeyGroupRules) -> None:
    """Delete from a partition kept in place every key of the groups it no longer owns (they moved)."""
    assert target.owned is not None
    lo, hi = target.owned
    store = target.store
    for cf in store.column_families():
        rule = rules.rule(cf)
        if rule is CfRule.LEADING:
            family = store.column_family(cf)
            for start, end in (group_byte_range(0, lo), (group_byte_range(hi, KEY_GROUP_LIMIT)[0], None)):
                if start != end and (count := family.count(start, end)):
                    family.delete_range(start, end)  # one tombstone, one changelog block
                    target.deleted += count
        elif rule is CfRule.LOCATED:
            gone = [k for k, _v in store.items(cf=cf) if not lo <= rules.locate(cf, k) < hi]
            for i in range(0, len(gone), COPY_CHUNK):
                store.delete_batch(gone[i : i + COPY_CHUNK], cf=cf)
            target.deleted += len(gone)


class SourceStores:
    """The old partitions a run of builds has loaded, kept while the next build needs them.

    `cached` may lend a store of the caller's (a Spark worker's cached store of that partition number,
    likely still holding the source version: its load is then a reuse); it stays the caller's. Other
    sources are loaded into temporary stores (`StoreConfig.bulk_replay`: they are only scanned), closed
    once no build needs them, or taken over by the build that keeps that partition in place (`take`).
    """

    def __init__(
        self,
        fm: CheckpointFileManager,
        plan: RescalePlan,
        config: StoreConfig,
        cached: Callable[[int], StateStore | None] | None = None,
    ) -> None:
        self.fm, self.plan, self.config = fm, plan, replace(config, local_dir=None, bulk_replay=True)
        self.cached = cached
        self.loaded: dict[int, tuple[StateStore, bool]] = {}
        """Old partition -> (its store, whether this object opened it)."""

    def keep_only(self, needed: set[int]) -> None:
        for q in set(self.loaded) - needed:
            store, own = self.loaded.pop(q)
            if own:
                store.close()

    def take(self, q: int) -> StateStore | None:
        """Old partition `q`'s store, if this object loaded it (at the source version, unchanged): now the
        caller's to write and close."""
        kept = self.loaded.get(q)
        if kept is None or not kept[1]:
            return None
        del self.loaded[q]
        return kept[0]

    def get(self, q: int) -> tuple[StateStore, int]:
        """Old partition `q` loaded at the source version, and the bytes that took (0 when kept)."""
        if q in self.loaded:
            return self.loaded[q][0], 0
        lent = self.cached(q) if self.cached is not None else None
        if lent is not None:
            try:
                return self._keep(q, lent, own=False)
            except LineageError as e:  # it remembers another root's commits (the root was written anew)
                log.warning(
                    "%s/%d: a cached store disagrees with %s (%s); loading it afresh",
                    self.plan.operator,
                    q,
                    self.fm.root_uri,
                    e,
                )
        src = StateStore(self.fm, self.plan.operator, q, config=self.config)
        try:
            return self._keep(q, src, own=True)
        except BaseException:
            src.close()
            raise

    def _keep(self, q: int, store: StateStore, *, own: bool) -> tuple[StateStore, int]:
        store.load(self.plan.source_version, self.plan.source_ids[q])
        self.loaded[q] = (store, own)
        return store, load_bytes(self.fm, store.last_plan)

    def close(self) -> None:
        self.keep_only(set())


def build_partitions(
    fm: CheckpointFileManager, plan: RescalePlan, rules: KeyGroupRules, config: StoreConfig, run: list[int]
) -> list[PartitionBuild]:
    """Build the new partitions of `run`: relayed from their sources' changelogs where no source has a snapshot
    (`relay_partitions`), else in order (`build_partition`), loading each old partition once for the
    neighbours that take groups from it."""
    relayed = relay_partitions(fm, plan, rules, config, run)
    if relayed is not None:
        return relayed
    sources = SourceStores(fm, plan, config)
    try:
        return [build_partition(fm, plan, rules, config, p, sources) for p in _build_order(plan, run)]
    finally:
        sources.close()


def _build_order(plan: RescalePlan, run: list[int]) -> list[int]:
    """`run` with each partition kept in place moved after the neighbours that take groups from its old
    partition: they load that partition first, and its own build then takes the loaded store over."""
    order = list(run)
    for p in plan.kept_in_place():
        if p not in order:
            continue
        at = order.index(p)
        order.remove(p)
        users = [i for i, r in enumerate(order) if any(q == p for q, _lo, _hi in plan.sources_of(r))]
        order.insert(max([at, *(i + 1 for i in users)]), p)
    return order


def build_partition(
    fm: CheckpointFileManager,
    plan: RescalePlan,
    rules: KeyGroupRules,
    config: StoreConfig,
    p: int,
    sources: SourceStores | None = None,
    into: StateStore | None = None,
) -> PartitionBuild:
    """Write new partition `p` of `plan` and publish its changelog (not the commit record).

    It loads each old partition that gives it key groups (or takes it from `sources`) and copies just
    those ranges, each range as one SST file that is ingested and logged as it is
    (`ColumnFamily.put_sorted`): the partition's first load ingests the same files instead of replaying
    records, so no snapshot is needed. Built `into` a store of the caller's (a Spark worker's cached
    one), it stays open holding the new version; else it is written in a temporary store.
    """
    t0 = time.perf_counter()
    own = sources is None
    sources = sources or SourceStores(fm, plan, config)
    in_place = p in plan.kept_in_place()
    given = [(q, lo, hi) for q, lo, hi in plan.sources_of(p) if not (q == p and in_place)]
    sources.keep_only({q for q, _lo, _hi in given} | ({p} if in_place else set()))
    target = _open_target(fm, plan, p, rules, config, into, sources)
    try:
        for q, lo, hi in given:  # a partition kept in place has its own groups already
            src, read = sources.get(q)
            target.bytes_read += read
            _give(plan, src, q, lo, hi, target, rules)
        if target.owned is not None:
            _trim(target, rules)
        store, cfs = target.store, target.store.column_families()
        counts = {
            cf: target.poured[cf] if target.owned is None else store.column_family(cf).count()
            for cf in cfs
            if rules.counted(cf)
        }
        for cf, key, value in rules.finish(cfs, counts):
            store.put(key, value, cf=cf)
        committed = target.store.commit()
        return PartitionBuild(
            p,
            committed.checkpoint_id,
            target.owned is not None,
            sum(target.poured.values()),
            target.deleted,
            target.bytes_read,
            committed.metrics.changelog_bytes,
            time.perf_counter() - t0,
        )
    finally:
        if into is None:
            target.store.close()
        if own:
            sources.close()


def execute_rescale(
    fm: CheckpointFileManager,
    plan: RescalePlan,
    *,
    rules: KeyGroupRules | None = None,
    config: StoreConfig | None = None,
    workers: int = 4,
    runner: PartitionRunner | None = None,
) -> RescaleResult:
    """Write every new partition (`build_partition`, on `runner`: `workers` threads by default), then commit
    the new version atomically.

    A new partition that keeps key groups in place (`RescalePlan.kept_in_place`) commits an ordinary
    changelog on its old lineage: the groups it gains as SST blocks, the groups it loses as range deletes. Any
    other is a full-state changelog. Only the key groups that change owner are written.
    A failure or crash before the commit record leaves the old layout (the new changelogs are orphans).
    """
    rules = rules or GroupLedKeys()
    config = config or StoreConfig()
    t0 = time.perf_counter()
    run = runner or in_threads(workers)
    builds = run(functools.partial(build_partitions, fm, plan, rules, config), list(range(plan.partitions)))
    return commit_rescale(fm, plan, builds, time.perf_counter() - t0)


def commit_rescale(
    fm: CheckpointFileManager, plan: RescalePlan, builds: Iterable[PartitionBuild], seconds: float | None = None
) -> RescaleResult:
    """Write the commit record naming every built partition of `plan` (the switch to the new layout:
    one exclusive publish); `seconds`: how long the builds took (None: they ran in parallel inside other
    work, a batch's tasks, so the slowest one stands for them)."""
    t0 = time.perf_counter()
    result = RescaleResult(plan)
    built = {b.partition: b for b in builds}
    if sorted(built) != list(range(plan.partitions)):
        raise RescaleError(f"{plan.describe()}: built partitions {sorted(built)}, not 0..{plan.partitions - 1}")
    ordered = [built[p] for p in range(plan.partitions)]
    for b in ordered:
        result.records += b.records
        result.deleted += b.deleted
        result.bytes_read += b.bytes_read
        result.bytes_written += b.bytes_written
        result.slowest_build_seconds = max(result.slowest_build_seconds, b.seconds)
        result.relayed += b.relayed
    ids = [b.checkpoint_id for b in ordered]
    layouts = {plan.operator: plan.target_layout} if plan.target_layout else {}
    CommitLog(fm).commit(
        plan.new_version,
        {plan.operator: ids},
        layouts=layouts,
        batch_id=plan.batch_id,
        change={plan.operator: plan.kind},
        in_place={plan.operator: [b.partition for b in ordered if b.in_place]},
        copied_from={plan.operator: plan.source_version},
    )
    result.checkpoint_ids = tuple(ids)
    result.committed = True
    built_in = result.slowest_build_seconds if seconds is None else seconds
    result.seconds = built_in + time.perf_counter() - t0
    log.info(
        "%s: committed, %d records copied, %d deleted in place, %d bytes read, %d bytes written in "
        "%.2fs (slowest partition %.2fs), %d of %d partitions relayed from changelogs",
        plan.describe(),
        result.records,
        result.deleted,
        result.bytes_read,
        result.bytes_written,
        result.seconds,
        result.slowest_build_seconds,
        result.relayed,
        plan.partitions,
    )
    return result


__all__ = [
    "BuildRun",
    "PartitionBuild",
    "PartitionRunner",
    "RescaleError",
    "RescalePlan",
    "RescaleResult",
    "SourceStores",
    "build_partition",
    "build_partitions",
    "commit_rescale",
    "contiguous_runs",
    "execute_rescale",
    "in_processes",
    "in_threads",
    "plan_rescale",
    "plan_rollback",
]
