"""The scenarios of the crash-point sweep: what a child process does, how a restart recovers, and
the check that nothing committed was lost.

Everything written is a deterministic function of (partition, version) (`batch_updates`), so the
state every committed version must load to is known without having watched the killed child:
`expected_state` folds the batches. A scenario has three parts:

* `prepare(root, work)`: builds the checkpoint the scenario starts from (a template, copied per kill);
* `act(root, work)`: the durable work a child does with the fault seam armed; it is SIGKILLed at one
  point of `statekeeper.store.faults`;
* `recover(root, work)`: what a restarted process does afterwards (the writer resumes and commits
  one more batch; a maintenance run is simply run again).

`check(root, work, scenario)` then loads every retained committed version of every store and
compares it with the model, and runs `verify_root` (every file a retained version needs is there
and intact). All of it runs in forked children of the sweep process (`tests/reliability/sweep.py`).
"""

from __future__ import annotations

import functools
import os
import random
import shutil
from collections.abc import Callable
from contextlib import closing, nullcontext
from dataclasses import dataclass

from statekeeper.maintenance.catalog_sync import rebuild_catalog, sync_catalog
from statekeeper.maintenance.expiry import expire_versions
from statekeeper.maintenance.orphans import clean_orphans
from statekeeper.maintenance.reports import Report as MaintenanceReport
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_builds import create_snapshots
from statekeeper.maintenance.verify import verify_root
from statekeeper.sql import Catalog
from statekeeper.store import CommitLog, StateStore, StoreConfig, faults
from statekeeper.store.async_upload import AsyncUploader
from statekeeper.store.files import CheckpointFileManager, open_file_manager
from statekeeper.store.layout import StoreId
from statekeeper.store.snapshot import read_manifest
from tests.catalog_export import catalog_export
from tests.reliability import scenario_rescale

OPERATOR = "sweep"
PARTITIONS = 2
KEYSPACE = 40
TEMPLATE_VERSIONS = 5
RETAIN = 3

State = dict[bytes, bytes]


def settings(work: str) -> MaintenanceSettings:
    """Small numbers so that a short history snapshots, expires and cleans: many points per run."""
    return MaintenanceSettings(
        snapshot_threshold=2,
        min_versions_to_retain=RETAIN,
        orphan_grace_seconds=0.0,
        load_grace_seconds=0.0,  # a snapshot is the base at once: expiry deletes within the run
        parallelism=1,  # one thread: the points a run reaches come in the same order every time
        delete_batch_size=2,
        lease_ttl_seconds=1.0,  # a killed maintainer's lease on the catalog expires quickly ...
        lease_timeout_seconds=20.0,  # ... and the rerun waits for it (invariant 5 still holds)
        work_dir=os.path.join(work, "maintenance"),
    )


# -- the model ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def batch_updates(partition: int, version: int) -> tuple[tuple[bytes, bytes | None], ...]:
    """The updates of the batch that produces `version` (>= 1) of `partition`."""
    rng = random.Random(f"sweep:{partition}:{version}")
    out: list[tuple[bytes, bytes | None]] = []
    for _ in range(12):
        key = b"k%03d" % rng.randrange(KEYSPACE)
        out.append((key, None if rng.random() < 0.2 else b"%d:%d:" % (partition, version) * rng.randint(1, 40)))
    return tuple(out)


@functools.lru_cache(maxsize=1024)
def expected_state(partition: int, version: int) -> tuple[tuple[bytes, bytes], ...]:
    state: State = dict(expected_state(partition, version - 1)) if version > 1 else {}
    if version >= 1:
        for k, v in batch_updates(partition, version):
            if v is None:
                state.pop(k, None)
            else:
                state[k] = v
    return tuple(sorted(state.items()))


# -- the writer -----------------------------------------------------------------------------------


def store_config(work: str, tag: str) -> StoreConfig:
    return StoreConfig(local_dir=os.path.join(work, tag), block_bytes=1024, snapshot_check_interval=2)


class BatchWriter:
    """The streaming job's driver and its partitions' stores: each `commit` resumes at the latest
    committed version and commits the next batches on every partition, then the commit record.

    `asynchronous`: the stores commit through an `AsyncUploader` (commit returns once the changelog
    is staged locally) and the driver waits for every upload before the commit record, as the Spark
    integration does. A new writer starts from an empty local directory, as a restarted job does.
    """

    def __init__(self, root: str, work: str, *, asynchronous: bool = False, partitions: int | None = None) -> None:
        self.real = open_file_manager(root)
        self.work = work
        self.uploader = AsyncUploader(self.real, os.path.join(work, "staging")) if asynchronous else None
        fm: CheckpointFileManager = self.uploader if self.uploader is not None else self.real
        self.log = CommitLog(self.real)
        tag = os.urandom(4).hex()
        count = PARTITIONS if partitions is None else partitions
        self.stores = [StateStore(fm, OPERATOR, p, config=store_config(work, f"p{p}-{tag}")) for p in range(count)]
        self._ids: list[str | None] = [None] * count

    def commit(self, count: int = 1, *, losing: bool = False) -> int:
        """Commit `count` more batches (`losing`: each also has a losing attempt on partition 0, an
        orphan); returns the latest committed version."""
        latest = self.log.latest()
        for version in range(latest + 1, latest + 1 + count):
            if losing:
                _losing_attempt(self.real, self.work, version)
            new_ids: list[str] = []
            for p, store in enumerate(self.stores):
                store.load(version - 1, self._ids[p])
                for k, v in batch_updates(p, version):
                    if v is None:
                        store.delete(k)
                    else:
                        store.put(k, v)
                new_ids.append(store.commit().checkpoint_id)
            if self.uploader is not None:
                self.uploader.wait_all()
            self.log.commit(version, {OPERATOR: new_ids})
            self._ids = list(new_ids)
        return latest + count

    def close(self) -> None:
        for store in self.stores:
            store.close()
        if self.uploader is not None:
            self.uploader.close()


def write_batches(root: str, work: str, count: int, *, asynchronous: bool = False, losing: bool = False) -> int:
    """A restarted writer (`BatchWriter`) commits `count` more batches on every partition."""
    with closing(BatchWriter(root, work, asynchronous=asynchronous)) as writer:
        return writer.commit(count, losing=losing)


def _losing_attempt(fm: CheckpointFileManager, work: str, version: int) -> None:
    probe = StateStore(fm, OPERATOR, 0, config=store_config(work, f"lose-{os.urandom(4).hex()}"))
    try:
        probe.load(version - 1)
        probe.put(b"loser", b"%d" % version)
        probe.commit()
    finally:
        probe.close()
        shutil.rmtree(probe.local_dir, ignore_errors=True)


# -- scenarios ------------------------------------------------------------------------------------


def _empty_catalog_file(path: str) -> None:
    """A migrated, empty SQLite catalog at `path`: migrated once per sweep, then copied (Alembic
    takes longer than everything else a small catalog does)."""
    pristine = os.path.join(os.path.dirname(os.path.dirname(path)), "empty-catalog.db")
    if not os.path.exists(pristine):
        Catalog.open(f"sqlite:///{pristine}.tmp", upgrade=True).close()
        os.replace(f"{pristine}.tmp", pristine)
    shutil.copyfile(pristine, path)


def _catalog(work: str, name: str = "catalog.db") -> Catalog:
    path = os.path.join(work, name)
    if not os.path.exists(path):
        _empty_catalog_file(path)
    return observed(Catalog.open(f"sqlite:///{path}"))


def observed(catalog: Catalog) -> Catalog:
    """`catalog`, its transactions reaching the fault seam at "catalog.transaction" before they commit.

    The catalog is not in `statekeeper.store` (it may not import it): its transactions reach the seam
    through SQLAlchemy's commit event."""
    from sqlalchemy import event

    event.listen(catalog.engine, "commit", lambda _conn: faults.reached("catalog.transaction", "catalog"))
    return catalog


def _prepare_history(root: str, work: str) -> None:
    write_batches(root, work, TEMPLATE_VERSIONS, losing=True)


def _prepare_snapshotted(root: str, work: str) -> None:
    write_batches(root, work, TEMPLATE_VERSIONS, losing=True)
    create_snapshots(open_file_manager(root), settings(work))
    write_batches(root, work, 2)


def _prepare_catalog(root: str, work: str) -> None:
    _prepare_snapshotted(root, work)
    _sync(root, work)
    write_batches(root, work, 2, losing=True)


REPAIRED_VERSION = TEMPLATE_VERSIONS
"""The snapshot a repair scenario damages: partition 0's, at this version (its newest)."""


def _damaged_snapshot(root: str) -> tuple[str, list[str]]:
    """The manifest and SST paths of the snapshot the repair scenario damages."""
    fm = open_file_manager(root)
    store = StoreId(OPERATOR, 0)
    ckpt = CommitLog(fm).committed_id(REPAIRED_VERSION, OPERATOR, 0)
    manifest = store.manifest(REPAIRED_VERSION, ckpt)
    return manifest, [store.sst(f.remote_name) for f in read_manifest(fm, store, REPAIRED_VERSION, ckpt).sst_files]


def _prepare_damaged(root: str, work: str) -> None:
    """A snapshotted history whose newest snapshot of partition 0 has a bit flip in its largest SST."""
    from tests.maintenance.helpers import clobber

    _prepare_snapshotted(root, work)
    fm = open_file_manager(root)
    sst = max(_damaged_snapshot(root)[1], key=lambda path: fm.info(path).size)
    raw = bytearray(fm.read_bytes(sst))
    raw[len(raw) // 2] ^= 0x10
    clobber(root, sst, bytes(raw))


def _repair(root: str, work: str) -> None:
    """A restarted writer loads past the bad snapshot (replaying changelogs), then the next snapshot
    run writes a fresh one."""
    write_batches(root, work, 2)
    _maintain(create_snapshots)(root, work)


def _repair_check(root: str, work: str, committed_before: int) -> list[str]:
    """The per-partition check, except that verify rightly still reports the damaged snapshot."""
    manifest, ssts = _damaged_snapshot(root)
    damaged = (manifest, *ssts)
    problems = check(root, work, SCENARIOS["commit"], committed_before)
    return [p for p in problems if not (p.startswith("verify: ") and any(d in p for d in damaged))]


def _sync(root: str, work: str) -> None:
    with closing(_catalog(work)) as catalog:
        sync_catalog(catalog, open_file_manager(root), workers=1)


def _rebuild(root: str, work: str) -> None:
    path = os.path.join(work, "catalog.db")
    if os.path.exists(path):
        os.unlink(path)  # the catalog is lost: rebuilt from the checkpoint location alone
    with closing(_catalog(work)) as catalog:
        rebuild_catalog(catalog, open_file_manager(root), workers=1)


Operation = Callable[..., MaintenanceReport]


def _maintain(operation: Operation, *, with_catalog: bool = False) -> Callable[[str, str], None]:
    """A maintenance run of `operation` (with the catalog: leased and recorded), which must succeed."""

    def run(root: str, work: str) -> None:
        with closing(_catalog(work)) if with_catalog else nullcontext() as catalog:
            report = operation(open_file_manager(root), settings(work), catalog=catalog)
        assert report.ok, report.errors

    return run


@dataclass(frozen=True)
class Scenario:
    name: str
    prepare: Callable[[str, str], None]
    act: Callable[[str, str], None]
    recover: Callable[[str, str], None]
    expires: bool = False
    """After `act`/`recover` only the newest RETAIN versions are retained (older ones may be gone)."""
    catalog: bool = False
    """Recovery also syncs the catalog; the check compares it with a rebuild."""
    verify: Callable[[str, str, int], list[str]] | None = None
    """The scenario's own check (root, work, committed before the kill), instead of the per-partition model."""


def _commit(root: str, work: str) -> None:
    write_batches(root, work, 3, losing=True)


def _async_commit(root: str, work: str) -> None:
    write_batches(root, work, 3, asynchronous=True, losing=True)


def _resume(root: str, work: str) -> None:
    write_batches(root, work, 1)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("commit", _prepare_history, _commit, _resume),
        Scenario("async_commit", _prepare_history, _async_commit, _resume),
        Scenario("snapshot", _prepare_history, _maintain(create_snapshots), _maintain(create_snapshots)),
        Scenario("expiry", _prepare_snapshotted, _maintain(expire_versions), _maintain(expire_versions), expires=True),
        Scenario(
            "orphan_cleanup", _prepare_snapshotted, _maintain(clean_orphans), _maintain(clean_orphans), expires=True
        ),
        Scenario("catalog_sync", _prepare_catalog, _sync, _sync, catalog=True),
        Scenario("catalog_rebuild", _prepare_catalog, _rebuild, _rebuild, catalog=True),
        Scenario(
            "snapshot_catalog",
            _prepare_catalog,
            _maintain(create_snapshots, with_catalog=True),
            _maintain(create_snapshots, with_catalog=True),
            catalog=True,
        ),
        Scenario(
            "expiry_catalog",
            _prepare_catalog,
            _maintain(expire_versions, with_catalog=True),
            _maintain(expire_versions, with_catalog=True),
            expires=True,
            catalog=True,
        ),
        Scenario("repair", _prepare_damaged, _repair, _resume, verify=_repair_check),
        Scenario(
            "rescale",
            scenario_rescale.prepare,
            scenario_rescale.rescale,
            scenario_rescale.recover,
            verify=scenario_rescale.check,
        ),
    )
}


# -- the check ------------------------------------------------------------------------------------


def check(
    root: str, work: str, scenario: Scenario, committed_before: int, *, partitions: int | None = None
) -> list[str]:
    """Problems after a kill and a recovery: a committed version lost or wrong, a needed file gone,
    maintenance not verifying clean, a catalog that differs from a rebuild."""
    if scenario.verify is not None:
        return scenario.verify(root, work, committed_before)
    problems: list[str] = []
    fm = open_file_manager(root)
    latest = CommitLog(fm).latest()
    if latest < committed_before:
        problems.append(f"latest committed version {latest} < {committed_before} committed before the kill")
    first = max(1, latest - RETAIN + 1) if scenario.expires else 1
    for p in range(PARTITIONS if partitions is None else partitions):
        probe = StateStore(fm, OPERATOR, p, config=store_config(work, f"check-{p}-{os.urandom(4).hex()}"))
        try:
            for version in range(first, latest + 1):
                try:
                    probe.load(version)
                    got = tuple(probe.items())
                    probe.abort()
                except Exception as e:  # a lost file shows here as a load error
                    problems.append(f"partition {p} version {version} does not load: {type(e).__name__}: {e}")
                    break
                if got != expected_state(p, version):
                    problems.append(f"partition {p} version {version} differs from the model")
        finally:
            probe.close()
            shutil.rmtree(probe.local_dir, ignore_errors=True)
    report = verify_root(fm, settings(work))
    problems += [f"verify: {e}" for e in report.errors]
    if scenario.catalog:
        problems += _catalog_problems(root, work)
    return problems


def _catalog_problems(root: str, work: str) -> list[str]:
    """After a full sync, the catalog is what a rebuild from the checkpoint location gives."""
    from tests.maintenance.test_crash import _normalised

    synced = _catalog(work)
    fresh = _catalog(work, f"fresh-{os.urandom(4).hex()}.db")
    try:
        fm = open_file_manager(root)
        sync_catalog(synced, fm, full=True, workers=1)
        rebuild_catalog(fresh, fm, workers=1)
        uri = fm.root_uri
        if _normalised(catalog_export(synced, uri)) != _normalised(catalog_export(fresh, uri)):
            return ["the catalog after a sync differs from a rebuild from the checkpoint location"]
        return []
    finally:
        synced.close()
        fresh.close()
