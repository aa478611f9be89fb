"""Verification: every retained version of every store is loadable from the checkpoint location.

For each retained version the check follows the loader's rules (`StateStore.load`): the commit record
names the id, the chain of committed changelogs down to the newest snapshot on it is present, each
changelog is read in full (header, every block's checksum, footer) and its lineage names the
committed ancestors, and the snapshot's manifest is readable and all its SSTs are present with the
right size (and, with `checksums`, the right SHA-256, and it opens to the key count and digest it recorded
when it was built: DESIGN invariant 14).

With `rebuild`, the latest version of each store is also loaded through `StateStore` itself and
compared with a replay from the oldest base still available, and every retained snapshot that has
an older base is compared with a replay of its changelogs from that base. Typed state (the Spark
integration's stores) is decoded too: every value of the latest version and of its retained
changelogs must decode under the schemas recorded in the checkpoint; a foreign value (a pickle
payload, say) is reported naming its changelog, and nothing in it is ever executed.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from statekeeper.maintenance.executors import InProcess, Row, StoreExecutor, StoreTask
from statekeeper.maintenance.file_kinds import classify
from statekeeper.maintenance.inventory import Inventory, StoreFiles
from statekeeper.maintenance.plan import StorePlan, plan_store
from statekeeper.maintenance.replica import Replica, content_digest
from statekeeper.maintenance.reports import VerifyReport, recorded
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_checks import proof_problem
from statekeeper.store.errors import CheckpointError, LineageError, StatekeeperError
from statekeeper.store.files import CheckpointFileManager
from statekeeper.store.formats.changelog import ChangelogReader, Lineage
from statekeeper.store.layout import StoreId
from statekeeper.store.load_plan import check_full_state, check_header, fall_back, resolve_load_plan
from statekeeper.store.snapshot import file_sha256
from statekeeper.store.state_store import StateStore, StoreConfig

if TYPE_CHECKING:
    from statekeeper.sql.catalog import Catalog

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VerifyOptions:
    """How deep verification goes, the same for every store of a run (and on every executor)."""

    rebuild: bool = False
    """Also rebuild versions and compare them with their snapshots, and load the latest through `StateStore`."""
    checksums: bool = True
    """Check the SHA-256 of SST files, not only their sizes."""


@dataclass
class _StoreResult:
    store: StoreId
    errors: list[str] = field(default_factory=list)
    versions: int = 0
    changelogs: int = 0
    snapshots: int = 0
    ssts: int = 0
    bytes: int = 0
    rebuilt: int = 0
    row: dict[str, Any] = field(default_factory=dict)


def verify_root(
    fm: CheckpointFileManager,
    settings: MaintenanceSettings,
    *,
    catalog: Catalog | None = None,
    rebuild: bool = False,
    checksums: bool = True,
    orchestrator_run_id: str | None = None,
    progress: bool = False,
    stores: Iterable[StoreId] | None = None,
    executor: StoreExecutor | None = None,
) -> VerifyReport:
    """Check that every retained version of every store (or of `stores`) is loadable; read-only.

    `executor`: where the stores are verified (default: a pool of `settings.parallelism` threads here;
    `statekeeper.maintenance.fanout` supplies Spark's executors).
    """
    wanted = None if stores is None else list(stores)
    report = VerifyReport(root=fm.root_uri)
    with recorded(catalog, report, orchestrator_run_id=orchestrator_run_id):
        inv = Inventory.scan(fm, parallelism=settings.parallelism, progress=progress, stores=wanted, use_cache=False)
        ids = wanted if wanted is not None else inv.store_ids()
        report.stores = len(ids)
        options = VerifyOptions(rebuild=rebuild, checksums=checksums)
        run = executor or InProcess(settings.parallelism, progress)
        results = _verify_stores(run, fm, inv, ids, settings, options)
        unreadable = dict(inv.unreadable)
        damaged = _stores_of(unreadable)
        again = [s for s in ids if results[s].errors or s in damaged]
        if again or unreadable:
            # Verification takes no lease: a maintainer may have expired files this listing still showed (the
            # retained window moved on) or replaced a base meanwhile. What failed is verified again on a fresh
            # listing; a file that is really missing or corrupt fails both times, and only that is reported.
            log.info("verifying %d store(s) of %s again on a fresh listing", len(again), fm.root_uri)
            fresh = Inventory.scan(fm, parallelism=settings.parallelism, stores=again, use_cache=False)
            unreadable = dict(fresh.unreadable)
            results.update(_verify_stores(run, fm, fresh, again, settings, options))
        for path, why in sorted(unreadable.items()):
            report.error(f"cannot read {path}: {why}")
        for s in ids:
            account_verification(report, results[s])
    return report


def _verify_stores(
    run: StoreExecutor,
    fm: CheckpointFileManager,
    inv: Inventory,
    ids: list[StoreId],
    settings: MaintenanceSettings,
    options: VerifyOptions,
) -> dict[StoreId, _StoreResult]:
    task = StoreTask("verify", fm.root_uri, settings, options=asdict(options))
    rows = run.run_stores(task, ids, lambda s: verify_row(fm, inv, s, settings, options))
    out: dict[StoreId, _StoreResult] = {}
    for s in ids:
        row = rows.get(s)
        if row is None:
            out[s] = _StoreResult(s, [f"store {s}: no verification result came back"])
        elif "error" in row:
            out[s] = _StoreResult(s, [f"store {s}: verification failed: {row['error']}"])
        else:
            out[s] = _StoreResult(**{**row, "store": s})
    return out


def _stores_of(paths: Iterable[str]) -> set[StoreId]:
    return {store for store in (classify(p).store for p in paths) if store is not None}


def account_verification(report: VerifyReport, res: _StoreResult) -> None:
    """Add one store's verification to the report."""
    report.versions += res.versions
    report.changelogs += res.changelogs
    report.snapshots += res.snapshots
    report.ssts += res.ssts
    report.rebuilt += res.rebuilt
    report.files += res.changelogs + res.snapshots + res.ssts
    report.bytes += res.bytes
    for text in res.errors:
        report.error(text)
    if res.errors:
        report.stores_failed += 1
    else:
        report.stores_ok += 1
    report.items.append({"store": str(res.store), **res.row, "ok": not res.errors, "errors": len(res.errors)})


def _verify_store(
    fm: CheckpointFileManager, inv: Inventory, store: StoreId, settings: MaintenanceSettings, options: VerifyOptions
) -> _StoreResult:
    plan = plan_store(inv, store, settings)
    files = inv.files_of(store)
    res = _StoreResult(store, list(plan.problems))
    res.row = {"latest": plan.latest, "retain_from": plan.retain_from}
    if plan.latest is None or plan.retain_from is None:
        return res
    committed = plan.committed
    snapshots = {k for k in files.manifests if committed.get(k[0]) == k[1]}
    source = InventoryPlanSource(store, committed, snapshots, plan.full_state)
    bases: dict[int, int] = {}
    repairs: dict[int, str] = {}  # broken snapshot version -> how loads repair around it
    lowest = plan.latest
    for r in range(plan.retain_from, plan.latest + 1):
        b = _loader_base(source, plan, files, r, repairs)
        bases[r] = b
        lowest = min(lowest, max(b, 0))
        if r not in inv.records:
            res.errors.append(f"store {store}: the commit record of retained version {r} is missing or unreadable")
    res.versions = plan.latest - plan.retain_from + 1
    res.row["base_version"] = bases[plan.retain_from]

    def first_needed(r: int, b: int) -> int:  # a full-state changelog (rescale, rollback) starts a chain
        return max(b + 1, 1, *(f for f in plan.full_state if f <= r))

    # the committed versions in each range, not every integer: a record's version is a claim (10**19)
    known = sorted(committed)
    needed: set[int] = set()
    for r, b in bases.items():
        needed.update(known[bisect.bisect_left(known, first_needed(r, b)) : bisect.bisect(known, r)])
    work = tempfile.mkdtemp(prefix="statekeeper-verify-")
    try:
        for v in sorted(needed):
            cid = committed.get(v)
            if cid is None:
                continue  # reported by the plan
            try:
                res.bytes += _verify_changelog(fm, store, files, v, cid, committed, work, v in plan.full_state)
                res.changelogs += 1
            except (StatekeeperError, OSError) as e:
                res.errors.append(f"store {store}: retained versions cannot load: {e}")
        for text in repairs.values():
            res.errors.append(f"store {store}: {text}")
        for b in sorted({b for b in bases.values() if b > 0}):
            cid = committed[b]
            res.snapshots += 1
            if options.checksums:  # restored, every SST's SHA-256 checked, opened and compared (invariant 14)
                n, size, errors = _verify_snapshot(fm, store, files, b, cid, settings)
            else:
                n, size, errors = _verify_ssts(fm, store, files, b, cid, work, options.checksums)
            res.ssts += n
            res.bytes += size
            res.errors += errors
        if options.rebuild and not res.errors:
            _rebuild_and_compare(fm, store, plan, files, min(bases.values()), work, res)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return res


def _loader_base(
    source: InventoryPlanSource, plan: StorePlan, files: StoreFiles, r: int, repairs: dict[int, str]
) -> int:
    """The snapshot version a load of retained version `r` restores (0: the empty version; -r: no path).

    The same `LoadPlan` the loader resolves; a broken base is passed over as the loader's snapshot
    repair does, and noted in `repairs` with the base the repair replays from.
    """
    cid = plan.committed.get(r)
    if cid is None:
        return -r  # no commit record names it: a gap (reported by the plan)
    try:
        load = resolve_load_plan(source, r, cid)
    except LineageError:
        return -r  # the chain is broken (reported by the plan)
    while load.base is not None and load.base[0] not in plan.intact_snapshots:
        bad = load.base
        path = files.manifests[bad].path
        why = plan.broken_snapshots.get(bad[0], f"snapshot {path} is broken")
        try:
            load = fall_back(source, load, path, why)
        except (LineageError, CheckpointError) as e:
            repairs[bad[0]] = (
                f"retained version {r} cannot load: its snapshot {path} is broken and no intact older base "
                f"is reachable ({e})"
            )
            return -r
        missing = [v for v, c in load.replay if (v, c) not in files.changelogs]
        start = load.base[0] if load.base is not None else 0
        gap = f", but the changelogs of versions {missing[:5]} are missing" if missing else ""
        repairs.setdefault(
            bad[0],
            f"{why}: loads repair around it by replaying from version {start}{gap}; "
            "the next snapshot run writes a fresh one",
        )
    return load.base[0] if load.base is not None else 0


class InventoryPlanSource:
    """`PlanSource` over an inventory: the loader's decisions without reading a file.

    Lineages come from the committed ids (a changelog's lineage names its committed ancestors);
    snapshots are the committed manifests listed.
    """

    def __init__(
        self,
        store: StoreId,
        committed: dict[int, str],
        snapshots: set[tuple[int, str]],
        full_state: Iterable[int] = (),
    ) -> None:
        self.store = store
        self._committed = committed
        self._snapshots = snapshots
        self._full_state = set(full_state)

    def committed_id(self, version: int) -> str:
        cid = self._committed.get(version)
        if cid is None:
            raise LineageError(f"version {version} of store {self.store} has no commit record")
        return cid

    def read_lineage(self, version: int, checkpoint_id: str) -> Lineage:
        out: list[tuple[int, str]] = []
        if version in self._full_state:
            return ()  # a full-state changelog starts its own lineage
        for u in range(version - 1, max(0, version - 1 - _LINEAGE_CHUNK), -1):
            cid = self._committed.get(u)
            if cid is None:
                break
            out.append((u, cid))
            if u in self._full_state:
                break
        return tuple(out)

    def list_snapshots(self) -> set[tuple[int, str]]:
        return set(self._snapshots)


_LINEAGE_CHUNK = 1000


def _verify_changelog(
    fm: CheckpointFileManager,
    store: StoreId,
    files: StoreFiles,
    version: int,
    cid: str,
    committed: dict[int, str],
    work: str,
    full_state: bool = False,
) -> int:
    """Read the committed changelog whole; `full_state`: its commit record declares it holds the whole state (a
    rescale or rollback wrote it), so its header must name no lineage, or loads and expiry disagree on its past."""
    path = store.changelog(version, cid)
    name = f"{fm.root_uri}/{path}"
    if (version, cid) not in files.changelogs:
        raise CheckpointError(f"changelog of committed version {version} is missing", name)
    tmp = os.path.join(work, "changelog")
    size = fm.download(path, tmp)
    with open(tmp, "rb") as f:
        reader = ChangelogReader(f, name)
        h = reader.header
        check_header(store, h, version, cid, name)
        if version > 1 and h.lineage and h.lineage[0][0] != version - 1:
            raise LineageError(f"changelog lineage does not start at version {version - 1}: {name}")
        if version > 1 and full_state:
            check_full_state(store, h, name)
        for u, uid in h.lineage:
            if u in committed and committed[u] != uid:
                raise LineageError(f"changelog lineage names ({u}, {uid}), which is not the committed attempt: {name}")
        reader.check_footer()
        for _ in reader.entries(None):  # every block's CRC (an SST block's too)
            pass
    return size


def _verify_snapshot(
    fm: CheckpointFileManager, store: StoreId, files: StoreFiles, version: int, cid: str, settings: MaintenanceSettings
) -> tuple[int, int, list[str]]:
    """Restore the snapshot, checking every SST's size and SHA-256, open it and compare its key count and digest
    with what its manifest recorded: a snapshot that passes is proven for this process (and, with a work
    directory, for later ones); one that fails is a bad snapshot the plan no longer takes as a base."""
    manifest = files.manifest_data[(version, cid)]
    why = proof_problem(fm, store, manifest, work_dir=settings.work_dir, again=True)
    errors = [] if why is None else [f"store {store}: {why}"]
    return len(manifest.sst_files), manifest.total_sst_bytes, errors


def _verify_ssts(
    fm: CheckpointFileManager, store: StoreId, files: StoreFiles, version: int, cid: str, work: str, checksums: bool
) -> tuple[int, int, list[str]]:
    manifest = files.manifest_data[(version, cid)]
    errors: list[str] = []
    size = 0
    for sst in manifest.sst_files:
        path = store.sst(sst.remote_name)
        if not checksums:
            continue
        tmp = os.path.join(work, "sst")
        try:
            got = fm.download(path, tmp)
            size += got
            digest = file_sha256(tmp)
        except (StatekeeperError, OSError) as e:
            errors.append(f"store {store}: SST {path} of snapshot {version} cannot be read: {e}")
            continue
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if got != sst.size or digest != sst.sha256:
            errors.append(f"store {store}: SST {path} of snapshot {version} does not match the manifest's checksum")
    return len(manifest.sst_files), size, errors


def _digest_of(replica: Replica) -> tuple[int, str]:
    return content_digest({cf: replica.items(cf) for cf in replica.column_families()})


def _rebuild_and_compare(
    fm: CheckpointFileManager,
    store: StoreId,
    plan: StorePlan,
    files: StoreFiles,
    lowest_base: int,
    work: str,
    res: _StoreResult,
) -> None:
    """Load the latest version with `StateStore`; compare snapshots and it with replays from older bases."""
    assert plan.latest is not None and plan.latest_id is not None
    manifests = {v: files.manifest_data[(v, c)] for v, c in plan.intact_snapshots.items()}

    def replay(target: int, bases: dict[int, Any], tag: str) -> tuple[int, str]:
        r = Replica(fm, store, os.path.join(work, tag))
        try:
            r.ensure(target, plan.committed[target], plan.committed, bases, plan.full_state)
            return _digest_of(r)
        finally:
            r.destroy()

    probe = StateStore(fm, store.operator, store.partition, config=StoreConfig(local_dir=os.path.join(work, "load")))
    try:
        probe.load(plan.latest, plan.latest_id)
        loaded = content_digest({cf: probe.items(cf=cf) for cf in probe.column_families()})
        from statekeeper.store.spark.state_view import (
            check_typed_state,  # typed state: every value decodes (no code runs)
        )

        logs = [(v, c) for v, c in sorted(plan.committed.items()) if (v, c) in files.changelogs]
        res.errors.extend(f"store {store}: {e}" for e in check_typed_state(probe, fm, logs))
        probe.abort()
    finally:
        probe.close()
    replayed = replay(plan.latest, {v: m for v, m in manifests.items() if v <= lowest_base}, "latest")
    res.rebuilt += 1
    if loaded != replayed:
        res.errors.append(
            f"store {store}: version {plan.latest} loaded from the checkpoint ({loaded[0]} keys) differs from a "
            f"replay from version {lowest_base} ({replayed[0]} keys)"
        )
    for v in sorted(manifests):
        if v < lowest_base:
            continue  # not used by any retained version
        older = _replayable_base(plan, files, v)
        if older is None:
            continue  # no older base whose changelogs are all still present
        from_snapshot = replay(v, {v: manifests[v]}, f"snap-{v}")
        from_changelogs = replay(v, {older: manifests[older]} if older else {}, f"replay-{v}")
        res.rebuilt += 1
        if from_snapshot != from_changelogs:
            res.errors.append(
                f"store {store}: snapshot {files.manifests[(v, plan.committed[v])].path} ({from_snapshot[0]} keys) "
                f"differs from the replay of its changelogs from version {older} ({from_changelogs[0]} keys)"
            )


def _replayable_base(plan: StorePlan, files: StoreFiles, version: int) -> int | None:
    """The newest intact snapshot below `version` (0: the empty version) whose changelogs up to it are present."""
    for base in sorted([0, *(v for v in plan.intact_snapshots if v < version)], reverse=True):
        if all((v, plan.committed.get(v)) in files.changelogs for v in range(base + 1, version + 1)):
            return base
    return None


def verify_row(
    fm: CheckpointFileManager, inv: Inventory, store: StoreId, settings: MaintenanceSettings, options: VerifyOptions
) -> Row:
    """Verify one store of an inventory (read-only): its outcome as a row (a failure: an "error" row).

    The per-store step of `verify_root`, wherever its executor runs it (`statekeeper.maintenance.executors`).
    """
    try:
        res = _verify_store(fm, inv, store, settings, options)
    except Exception as e:
        log.debug("verification of store %s failed", store, exc_info=True)
        return {"store": str(store), "error": str(e)}
    return {**asdict(res), "store": str(store)}


__all__ = ["VerifyOptions", "account_verification", "verify_root", "verify_row"]
