"""What every file of a store is for: the retention rules, in one place, from an `Inventory`.

For a store whose newest committed version is ``L`` the versions ``R = max(1, L - N + 1) .. L`` are
*retained* (``N = min_versions_to_retain``). A load of version ``r`` starts from the newest snapshot
of a committed ``(v, id)`` with ``v <= r`` (its *base*) and replays the committed changelogs after
it; the base of the oldest retained version is the store's **base**. Then:

- **needed** (never deleted): commit records from the root's *floor* on, committed changelogs after
  the base, committed manifests from the base on and every SST they reference. A snapshot becomes
  the base once it is older than `load_grace_seconds` (default 0: a load that listed the snapshots
  before it existed and loses a file starts over from it; docs/maintenance.md says why that is safe).
- **expired** (expiry deletes them; they are committed, so nothing writes them any more): committed
  changelogs at or below the base, committed manifests below it, SSTs only those manifests
  reference, and commit records below the floor (the lowest base of any store), with the Spark
  driver's batch files of those versions.
- **orphan** (orphan cleanup deletes them once older than the grace period): changelogs and manifests
  of ids that lost a committed version, files below the oldest commit record that no retained version
  can need, SSTs no surviving manifest references, temp files and incomplete uploads.
- **in flight** (kept): anything of a version newer than the newest commit record (the driver may
  still commit it), and orphans younger than the grace period.

A store with a file maintenance cannot read, a snapshot missing an SST, a foreign file or a gap in
its committed chain has *problems*: nothing of it is deleted until they are fixed (DESIGN invariant 7).
A foreign file outside every store's prefix is someone else's: a *warning*, never deleted, and it
fails nothing (one under ``commits/`` still stops commit record deletion).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from statekeeper.maintenance.file_kinds import FOREIGN, MANIFEST, FileEntry
from statekeeper.maintenance.inventory import Inventory, StoreFiles
from statekeeper.maintenance.parsed_cache import PROVEN_SNAPSHOTS, UNOPENABLE_SNAPSHOTS, UNOPENABLE_WHY
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.store.formats.snapshot import SnapshotManifest
from statekeeper.store.layout import COMMITS_DIR, StoreId

HEARTBEAT_STALE_SECONDS = 300.0
"""A Spark driver's heartbeat older than this is dead (store/spark/heartbeat.py refreshes it every few seconds)."""

MAX_PROBLEMS = 20
"""Problems listed per store (the count is always exact)."""


@dataclass
class StorePlan:
    store: StoreId
    latest: int | None
    """Newest committed version of the store (None: nothing committed yet)."""
    latest_id: str | None
    committed: dict[int, str]
    retain_from: int | None
    base: tuple[int, str] | None
    """The snapshot the oldest retained version loads from (None: it replays from version 1)."""
    snapshot: tuple[int, str] | None
    """The newest intact committed snapshot (what a load of `latest` starts from)."""
    chain_length: int
    """Changelogs a load of `latest` replays."""
    intact_snapshots: dict[int, str] = field(default_factory=dict)
    full_state: dict[int, str] = field(default_factory=dict)
    """Committed full-state changelogs (a rescale or rollback wrote them): bases like snapshots, but
    the base's own changelog is needed."""
    broken_snapshots: dict[int, str] = field(default_factory=dict)
    """Committed snapshots that cannot be restored (version -> why); loads repair around them."""
    needed: list[FileEntry] = field(default_factory=list)
    expired: list[FileEntry] = field(default_factory=list)
    """In deletion order: manifests, then SSTs only they reference, then changelogs."""
    orphans: list[tuple[FileEntry, str]] = field(default_factory=list)
    """(file, why), deletable now; in deletion order: manifests, SSTs, then the rest."""
    in_flight: list[tuple[FileEntry, str]] = field(default_factory=list)
    """(file, why it is kept) for files that are not needed but may still be being written."""
    problems: list[str] = field(default_factory=list)
    problem_count: int = 0
    notes: list[str] = field(default_factory=list)
    """Things worth knowing that are not problems (e.g. retention shortened by an earlier run)."""
    unproven_base: tuple[int, str] | None = None
    """The snapshot that would be the base but has not been proven to open yet (DESIGN invariant 14): the
    base stays older until expiry proves it (`statekeeper.maintenance.snapshot_checks.proof_problem`)."""
    retired: bool = False
    """A rescale down removed the store from its operator's layout, and no retained version of the
    operator names it any more: every committed file of it is expired."""

    @property
    def blocked(self) -> bool:
        return self.problem_count > 0

    def problem(self, text: str) -> None:
        self.problem_count += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(f"store {self.store}: {text}")

    def base_for(self, version: int) -> int:
        """Version of the snapshot a load of `version` starts from (0: the empty version)."""
        return max((v for v in (*self.intact_snapshots, *self.full_state) if v <= version), default=0)


_Memo = tuple[StoreFiles, MaintenanceSettings, StorePlan, tuple[frozenset[str], frozenset[str]]]
_plans: weakref.WeakKeyDictionary[Inventory, dict[StoreId, _Memo]] = weakref.WeakKeyDictionary()
_plans_lock = threading.Lock()


def plan_store(inv: Inventory, store: StoreId, settings: MaintenanceSettings, *, now: float | None = None) -> StorePlan:
    """Classify every file of `store` (see the module docstring).

    Without `now`, the plan of the same view of the store (the same listing, `Inventory.rescan_store`
    makes a new one) and settings is returned again: the operations of a maintenance cycle plan each
    store several times. Its clock is then the first plan's, which only keeps files longer (a file
    becomes an orphan, a snapshot a base, once older than a grace period).
    """
    if now is not None:
        return _plan_store(inv, store, settings, now)
    files = inv.files_of(store)
    proofs = _proofs(inv, store)
    with _plans_lock:
        memo = _plans.setdefault(inv, {})
        cached = memo.get(store)
    if cached is not None and cached[0] is files and cached[1] == settings and cached[3] == proofs:
        return cached[2]
    plan = _plan_store(inv, store, settings, time.time())
    with _plans_lock:
        memo[store] = (files, settings, plan, proofs)
    return plan


def _proofs(inv: Inventory, store: StoreId) -> tuple[frozenset[str], frozenset[str]]:
    """(proven, unopenable) manifest paths of `store` known to this process."""
    return PROVEN_SNAPSHOTS.names(inv.root_uri, store), UNOPENABLE_SNAPSHOTS.names(inv.root_uri, store)


def _plan_store(inv: Inventory, store: StoreId, settings: MaintenanceSettings, now: float) -> StorePlan:
    grace = settings.orphan_grace_seconds
    load_grace = settings.load_grace_seconds
    files = inv.files_of(store)
    committed = inv.committed_ids(store)
    latest = max(committed, default=None)
    plan = StorePlan(store, latest, committed.get(latest) if latest else None, committed, None, None, None, 0)
    for e in files.foreign:
        plan.problem(f"foreign file under the store (not in the statekeeper layout; left alone): {e.path}")
    for path in sorted(inv.unreadable):
        plan.problem(f"commit record {path} cannot be read, so no version can be classified safely")

    # Intact committed snapshots: readable, and every SST present with the size the manifest names, and not
    # found unable to open (invariant 14).
    proven, unopenable = _proofs(inv, store)
    broken: list[tuple[int | None, str]] = []
    for (v, cid), entry in sorted(files.manifests.items()):
        m = files.manifest_data.get((v, cid))
        if m is None or committed.get(v) != cid:
            continue
        if entry.path in unopenable:
            why = UNOPENABLE_WHY.get((inv.root_uri, entry.path), "it does not open to what it recorded when built")
            broken.append((v, f"snapshot {entry.path} is broken: {why}"))
            continue
        bad = _missing_ssts(files.ssts, m)
        if bad:
            broken.append((v, f"snapshot {entry.path} is broken: {bad}"))
            continue
        plan.intact_snapshots[v] = cid
    plan.full_state = {v: cid for v, cid in inv.full_state_versions(store).items() if (v, cid) in files.changelogs}
    unreadable = [
        (_manifest_version(files, path), f"cannot read {path}: {why}") for path, why in files.unreadable.items()
    ]
    for broken_version, text in sorted([*broken, *unreadable], key=lambda item: item[1]):
        _broken_snapshot(plan, broken_version, text)

    plan.retired = latest is not None and _retired(inv, store, latest, settings.min_versions_to_retain)
    if latest is not None and not plan.retired:
        plan.retain_from = _retain_from(plan, inv, files.changelogs, settings.min_versions_to_retain)
        # The base is the newest snapshot the oldest retained version can load from that is older than
        # the load grace (a load still reading the older files then starts over from the newer one).
        newest = plan.base_for(plan.retain_from)
        settled = [
            v
            for v, cid in plan.intact_snapshots.items()
            if v <= newest and now - files.manifests[(v, cid)].mtime >= load_grace
        ]
        # A snapshot is a base only once proven to open (invariant 14): until then the older base stays. The
        # commit records below the oldest one left were expired by a maintainer whose bases were proven, and
        # nothing older than them loads any more: a snapshot at or above that version is a base as it is.
        expired_below = inv.oldest_record or 1

        def base_ready(v: int) -> bool:
            return files.manifests[(v, committed[v])].path in proven or v >= expired_below > 1

        candidate = max([*settled, *(v for v in plan.full_state if v <= newest)], default=0)
        if candidate in plan.intact_snapshots and not base_ready(candidate):
            plan.unproven_base = (candidate, committed[candidate])
        full = [v for v in plan.full_state if v <= newest]
        b = max([*(v for v in settled if base_ready(v)), *full], default=0)
        plan.base = (b, plan.intact_snapshots.get(b) or plan.full_state[b]) if b else None
        if plan.unproven_base is not None and b < candidate:
            plan.notes.append(
                f"store {plan.store}: the snapshot at version {candidate} is not proven to open yet; "
                f"expiry keeps everything after version {b} until it is"
            )
        elif b != newest:
            plan.notes.append(
                f"store {plan.store}: the snapshot at version {newest} is younger than load_grace_seconds; "
                f"expiry keeps everything after version {b}"
            )
        s = plan.base_for(latest)
        plan.snapshot = (s, plan.intact_snapshots[s]) if s in plan.intact_snapshots else None
        plan.chain_length = latest - s + (1 if s in plan.full_state and s not in plan.intact_snapshots else 0)
    needed_from = plan.base[0] if plan.base else 0
    if plan.base is not None and plan.base[0] in plan.full_state and plan.base[0] not in plan.intact_snapshots:
        needed_from -= 1  # a full-state base is its changelog
    expire_below = plan.base[0] if plan.base is not None else None
    if plan.retired and not plan.blocked and latest is not None:
        needed_from = expire_below = latest + 1
        plan.notes.append(f"store {plan.store}: retired by a rescale after version {latest}; its files expire")

    def orphan(e: FileEntry, why: str) -> bool:
        """Deletable now if older than the grace period; returns whether it is."""
        if now - e.mtime >= grace:
            plan.orphans.append((e, why))
            return True
        plan.in_flight.append((e, f"{why}; younger than the grace period"))
        return False

    def unknown(e: FileEntry, v: int) -> None:
        plan.problem(f"no commit record for version {v} although it is within the committed range; kept: {e.path}")

    oldest = inv.oldest_record
    expired_manifests: list[FileEntry] = []
    orphan_manifest_keys: set[tuple[int, str]] = set()
    for (v, cid), e in sorted(files.manifests.items()):
        if v > inv.latest:
            plan.in_flight.append((e, "snapshot of a version newer than the newest commit record"))
        elif v in inv.commit_files:
            if v not in inv.records:
                continue  # unreadable commit record: a problem already; keep
            if committed.get(v) == cid:
                if expire_below is not None and v < expire_below:
                    expired_manifests.append(e)
                else:
                    plan.needed.append(e)
            elif orphan(e, "snapshot of an attempt that lost its version"):
                orphan_manifest_keys.add((v, cid))
        elif oldest is not None and v < oldest and plan.base is not None and v < plan.base[0]:
            if orphan(e, "snapshot below the oldest commit record"):
                orphan_manifest_keys.add((v, cid))
        else:
            unknown(e, v)

    # SSTs: expired when only expired manifests reference them; orphan when no surviving manifest does.
    refs = {k: {s.remote_name for s in m.sst_files} for k, m in files.manifest_data.items()}
    all_keys = set(files.manifests)
    sst_knowable = not files.unreadable  # an unreadable manifest may reference any SST
    expired_keys = {k for k, e in files.manifests.items() if e in expired_manifests}
    needed_ssts: set[str] = set()
    for k in all_keys - expired_keys:
        needed_ssts |= refs.get(k, set())
    doomed: set[str] = set()
    for k in expired_keys:
        doomed |= refs.get(k, set())
    expired_ssts = (
        sorted((doomed - needed_ssts) & set(files.ssts)) if sst_knowable else []
    )  # a broken one may miss some
    referenced_after_orphans: set[str] = set()
    for k in all_keys - orphan_manifest_keys:
        referenced_after_orphans |= refs.get(k, set())
    sst_orphans: list[tuple[FileEntry, str]] = []
    for name, e in sorted(files.ssts.items()):
        if name in referenced_after_orphans or not sst_knowable:
            if name in needed_ssts:
                plan.needed.append(e)
            continue
        if now - e.mtime >= grace:
            sst_orphans.append((e, "referenced by no snapshot manifest"))
        else:
            plan.in_flight.append((e, "referenced by no snapshot manifest; younger than the grace period"))

    expired_changelogs: list[FileEntry] = []
    for (v, cid), e in sorted(files.changelogs.items()):
        if v > inv.latest:
            plan.in_flight.append((e, "version newer than the newest commit record: may still be committed"))
        elif v in inv.commit_files:
            if v not in inv.records:
                continue
            if committed.get(v) == cid:
                if v > needed_from:
                    plan.needed.append(e)
                else:
                    expired_changelogs.append(e)
            else:
                orphan(e, "attempt that lost its version")
        elif oldest is not None and v < oldest and plan.base is not None and v <= plan.base[0]:
            orphan(e, "changelog below the oldest commit record")
        else:
            unknown(e, v)
    for e in files.temps:
        orphan(e, "unfinished write (temp file or incomplete upload)")

    plan.expired = [*expired_manifests, *(files.ssts[n] for n in expired_ssts), *expired_changelogs]
    manifests = [o for o in plan.orphans if o[0].kind == MANIFEST]
    rest = [o for o in plan.orphans if o[0].kind != MANIFEST]
    plan.orphans = [*manifests, *sst_orphans, *rest]
    return plan


def _manifest_version(files: StoreFiles, path: str) -> int | None:
    """Version of the committed manifest at `path` (None: not a manifest of this store)."""
    for (v, _cid), e in files.manifests.items():
        if e.path == path:
            return v
    return None


def _broken_snapshot(plan: StorePlan, version: int | None, text: str) -> None:
    """A bad snapshot blocks deletions until a newer intact one supersedes it (DESIGN invariant 10).

    While it is the newest, loads repair around it by replaying from an older base, so expiry must
    keep those changelogs; once a newer intact snapshot exists, no load needs it and it expires.
    """
    if version is not None:
        plan.broken_snapshots[version] = text
    if version is not None and any(v > version for v in plan.intact_snapshots):
        plan.notes.append(f"store {plan.store}: {text}; superseded by a newer intact snapshot, it expires")
    else:
        plan.problem(text)


def _missing_ssts(present: dict[str, FileEntry], m: SnapshotManifest) -> str:
    problems = []
    for s in m.sst_files:
        e = present.get(s.remote_name)
        if e is None:
            problems.append(f"SST {s.remote_name} is missing")
        elif e.size != s.size:
            problems.append(f"SST {s.remote_name} has {e.size} bytes, the manifest says {s.size}")
    return "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else "")


def _retired(inv: Inventory, store: StoreId, latest: int, retain: int) -> bool:
    """Whether `store` is outside the layout of its operator's newest version and its last committed
    version `latest` is older than every retained version of the operator (so no load needs it)."""
    for v in sorted((u for u in inv.records if latest < u <= inv.latest), reverse=True):  # not every integer:
        ids = inv.records[v].checkpoint_ids.get(store.operator)  # a record's version is a claim (10**19)
        if ids is not None:
            return store.partition >= len(ids) and latest < v - retain + 1
    return False


def _retain_from(plan: StorePlan, inv: Inventory, changelogs: dict[tuple[int, str], FileEntry], retain: int) -> int:
    """The oldest retained version: normally `latest - retain + 1`.

    When versions in that range cannot load because an earlier run with a smaller retention expired
    them (every changelog up to a snapshot gone, the snapshot intact), retention starts at that
    snapshot. Any other gap in the chain is damage: a problem, which stops deletions in the store.
    """
    assert plan.latest is not None
    wanted = max(1, plan.latest - retain + 1)
    first = min(plan.committed)
    if first in plan.full_state:  # a store a rescale created: nothing before its first version
        wanted = max(wanted, first)
    start = plan.base_for(wanted)
    breaks = _unloadable_runs(plan, changelogs, start)
    bad = [run for run in breaks if run[1] >= wanted]
    if not bad:
        return wanted
    first_ok = bad[-1][1] + 1
    if first_ok <= plan.latest and first_ok in plan.intact_snapshots:
        present = [v for v, cid in changelogs if wanted <= v <= first_ok and plan.committed.get(v) == cid]
        if not present:
            plan.notes.append(
                f"store {plan.store}: versions {wanted}..{first_ok - 1} were expired by an earlier run; "
                f"retained versions start at {first_ok}"
            )
            return first_ok
    for v, _ in breaks:  # report where each break starts
        cid = plan.committed.get(v)
        if cid is None:
            plan.problem(
                f"retained versions need version {v}, which no commit record names (oldest commit record: "
                f"{inv.oldest_record})"
            )
        else:
            plan.problem(f"retained versions need the missing changelog {plan.store.changelog(v, cid)}")
    return wanted


def _unloadable_runs(
    plan: StorePlan, changelogs: dict[tuple[int, str], FileEntry], start: int
) -> list[tuple[int, int]]:
    """The runs ``(first, last)`` of versions in ``start + 1 .. latest`` that cannot load, oldest first, from `start`
    (which can). Walked over the committed versions, not every integer between them: the versions are the commit
    records' claims, and one record of version 10**19 would make that a loop without end."""
    assert plan.latest is not None
    runs: list[tuple[int, int]] = []
    ok, prev, opened = True, start, 0
    for v in sorted(u for u in plan.committed if start < u <= plan.latest):
        if v > prev + 1 and ok:  # versions no commit record names
            ok, opened = False, prev + 1
        cid = plan.committed[v]
        loadable = v in plan.intact_snapshots or ((v, cid) in changelogs and (ok or v in plan.full_state))
        if ok and not loadable:
            opened = v
        elif loadable and not ok:
            runs.append((opened, v - 1))
        ok, prev = loadable, v
    if not ok:
        runs.append((opened, plan.latest))
    return runs


@dataclass
class RootPlan:
    """The plans of every store plus what lives outside the stores."""

    stores: dict[StoreId, StorePlan]
    floor: int
    """Commit records below this version are expired (1: none)."""
    expired_commits: list[FileEntry]
    orphans: list[tuple[FileEntry, str]]
    in_flight: list[tuple[FileEntry, str]]
    problems: list[str]
    foreign: list[FileEntry]
    expired_batches: list[FileEntry] = field(default_factory=list)
    """The Spark driver's batch files of versions below the floor (expired with their commit records)."""
    warnings: list[str] = field(default_factory=list)
    """Foreign files outside every store: reported, never deleted, never a failure."""


def plan_root(
    inv: Inventory,
    settings: MaintenanceSettings,
    *,
    now: float | None = None,
    all_stores: bool = True,
) -> RootPlan:
    """Plan every store; commit records expire only when every store of the root was planned."""
    stores = {s: plan_store(inv, s, settings, now=now) for s in inv.store_ids()}
    now = time.time() if now is None else now
    floor: int | None = None
    for p in stores.values():
        if p.latest is None:
            continue
        contribution = p.base[0] if p.base is not None and not p.blocked else 1
        if p.retired and not p.blocked:
            contribution = p.latest + 1  # its commit records go once its files are gone
        floor = contribution if floor is None else min(floor, contribution)
    problems: list[str] = []
    warnings: list[str] = []
    foreign = list(inv.foreign)
    for e in foreign:
        warnings.append(f"foreign file under the checkpoint root (not in the statekeeper layout; left alone): {e.path}")
    commits_foreign = any(e.path.startswith(f"{COMMITS_DIR}/") for e in foreign)
    if commits_foreign:
        warnings.append(f"a foreign file under {COMMITS_DIR}/ stops the deletion of commit records")
    if not all_stores or inv.unreadable or commits_foreign or floor is None:
        floor = 1
    expired_commits = [e for v, e in sorted(inv.commit_files.items()) if v < floor and v in inv.records]
    orphans: list[tuple[FileEntry, str]] = []
    in_flight: list[tuple[FileEntry, str]] = []

    def orphan(e: FileEntry, why: str) -> None:
        if now - e.mtime >= settings.orphan_grace_seconds:
            orphans.append((e, why))
        else:
            in_flight.append((e, f"{why}; younger than the grace period"))

    for e in inv.temps:
        orphan(e, "unfinished write (temp file or incomplete upload)")
    for e in inv.heartbeats:  # a live driver replaces its heartbeat every few seconds: only a dead one ages
        if now - e.mtime >= HEARTBEAT_STALE_SECONDS:
            orphan(e, "heartbeat of a driver that stopped without removing it")
        else:
            in_flight.append((e, "heartbeat of a driver that may be running"))
    expired_batches = _plan_batch_files(inv, floor, orphan, in_flight)
    for path, why in sorted(inv.unreadable.items()):
        problems.append(f"cannot read {path}: {why}")
    return RootPlan(stores, floor, expired_commits, orphans, in_flight, problems, foreign, expired_batches, warnings)


def _plan_batch_files(
    inv: Inventory,
    floor: int,
    orphan: Callable[[FileEntry, str], None],
    in_flight: list[tuple[FileEntry, str]],
) -> list[FileEntry]:
    """The driver's batch files live and die with the version their batch commits (`FileEntry.version`).

    On restart the driver needs the file of the batch Spark re-runs: the one after the newest commit
    record (in flight), or the newest committed one (re-delivered to the sink without committing).
    Both are at or above every store's base, so expiring batch files with the commit records below
    the floor never takes one a restart needs. Files below the oldest commit record were left by an
    interrupted expiry: orphans. The rest is needed.
    """
    expired: list[FileEntry] = []
    oldest = inv.oldest_record
    newest = inv.records.get(inv.latest)
    # A rescale or rollback commits a version without a batch, so batch b commits version b + 1 + shift;
    # the newest shift is the largest, so using it for every file only ever keeps a file longer.
    shift = max(0, newest.version - newest.batch - 1) if newest is not None else 0
    for e in sorted(inv.batch_files, key=lambda e: e.path):
        assert e.version is not None
        version = e.version + shift
        if version > inv.latest:
            in_flight.append((e, "batch not committed yet: the driver re-runs it on restart"))
        elif version < floor:
            expired.append(e)
        elif oldest is not None and version < oldest:
            orphan(e, "batch file below the oldest commit record")
    return expired


def never_delete(e: FileEntry) -> bool:
    """Kinds maintenance refuses to delete whatever a plan says."""
    return e.kind == FOREIGN


__all__ = ["RootPlan", "StorePlan", "never_delete", "plan_root", "plan_store"]
