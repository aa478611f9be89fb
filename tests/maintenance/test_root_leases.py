"""The lease lives with the store (invariant 15): two maintainers on one root exclude each other whatever
catalog each uses or none, on one host or "two hosts" (processes with work directories of their own), on
local disk and S3; a holder that lost its lease cannot delete; the CLI finds the deployment's catalog."""

from __future__ import annotations

import json
import multiprocessing
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from statekeeper.maintenance.cli import main
from statekeeper.maintenance.deletion import delete_entries
from statekeeper.maintenance.deployment import recorded_catalog, shareable_url
from statekeeper.maintenance.expiry import expire_versions
from statekeeper.maintenance.file_kinds import DEPLOYMENT, LEASE, classify
from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.leasing import ROOT_FILES, store_lease
from statekeeper.maintenance.loop import maintain
from statekeeper.maintenance.orphans import clean_orphans
from statekeeper.maintenance.plan import plan_store
from statekeeper.maintenance.root_leases import (
    MAX_CLOCK_SKEW_SECONDS,
    SUPERSEDED_KEEP_SECONDS,
    Hold,
    LeaseLostError,
    MaintenanceBusyError,
    RootLeases,
)
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.sql import Catalog
from statekeeper.store.errors import StatekeeperError
from statekeeper.store.files import open_file_manager
from statekeeper.store.layout import StoreId, lease_dir, lease_path
from tests.maintenance.helpers import History, all_files, snapshotted_history


def _busy_for(errors: list[str], store: StoreId) -> bool:
    return any(f"store {store}" in e and "holds its lease" in e for e in errors)


def test_maintainers_on_different_catalogs_or_none_exclude_each_other(
    make_local_history: Callable[..., History], settings: MaintenanceSettings, tmp_path: Path
) -> None:
    """The issue's case: a maintainer on one catalog holds a store; another on a second catalog, and one without
    a catalog, leave that store alone (and maintain the other); neither deletes the holder's files."""
    h = snapshotted_history(make_local_history, settings)
    a = h.stores[0]
    first, second = (Catalog.open(f"sqlite:///{tmp_path / name}", upgrade=True) for name in ("a.db", "b.db"))
    try:
        held_before = {p: n for p, n in all_files(h.root).items() if p.startswith(f"{a.prefix}/")}
        with store_lease(h.fm, a, settings, first):
            other_catalog = expire_versions(h.fm, settings, catalog=second)
            no_catalog = clean_orphans(h.fm, settings)
            held_after = {p: n for p, n in all_files(h.root).items() if p.startswith(f"{a.prefix}/")}
        assert _busy_for(other_catalog.errors, a) and _busy_for(no_catalog.errors, a), (other_catalog.errors,)
        assert held_after == held_before, "the held store's files are untouched"
        assert other_catalog.changelogs > 0, "the free store was expired"
        assert [lease.scope for lease in first.leases(h.fm.root_uri)] == [], "released in the catalog too"
        assert expire_versions(h.fm, settings).ok  # once released, anyone maintains it
    finally:
        first.close()
        second.close()


def _race(root: str, work: str, stores: list[tuple[str, int]], start: object, seconds: float, out: object) -> None:
    """One "host": take each store in turn for a few ms while the other does the same; report the holds."""
    settings = MaintenanceSettings(lease_ttl_seconds=30, lease_timeout_seconds=0, work_dir=work)
    fm = open_file_manager(root)
    held: list[tuple[str, int, float, float]] = []
    busy = 0
    start.wait(120)  # type: ignore[attr-defined]  # both processes are up: race from here
    rng = random.Random(work)
    end = time.time() + seconds
    while time.time() < end:
        order = list(stores)
        rng.shuffle(order)
        for op, p in order:
            try:
                with store_lease(open_file_manager(root) if rng.random() < 0.5 else fm, StoreId(op, p), settings, None):
                    t0 = time.time()
                    time.sleep(0.003)
                    held.append((op, p, t0, time.time()))
            except MaintenanceBusyError:
                busy += 1
    out.put((held, busy))  # type: ignore[attr-defined]


def _race_two_hosts(root: str, tmp_path: Path, seconds: float) -> None:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    stores = [("agg", p) for p in range(3)]
    start = ctx.Barrier(2)
    procs = [
        ctx.Process(target=_race, args=(root, str(tmp_path / f"host-{i}"), stores, start, seconds, out))
        for i in range(2)
    ]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(30)
    (one, busy_one), (two, busy_two) = results
    assert one and two and busy_one + busy_two > 0, "both hosts held stores, and each was refused some"
    for op, p, start, end in one:
        clash = [h for h in two if (h[0], h[1]) == (op, p) and h[2] < end and start < h[3]]
        assert not clash, f"store {op}/{p} held by both hosts at once: {(start, end)} and {clash[0][2:]}"
    fm = open_file_manager(root)
    assert all(classify(i.path).kind == LEASE for i in fm.list("_leases/"))
    # epochs stay a while after they are superseded; a take and release after that leave each store three: the
    # release it found (superseded by its take just now), its hold and its release
    later = RootLeases(fm, ttl=30, clock=lambda: time.time() + SUPERSEDED_KEEP_SECONDS + 1)
    assert all(isinstance(got, Hold) for got in later.take_free([StoreId(op, p) for op, p in stores]).values())
    later.release()
    leftovers = [i.path for i in fm.list("_leases/")]
    assert len(leftovers) == 3 * len(stores), f"older epochs are deleted: {leftovers}"


def test_two_hosts_racing_for_the_same_stores_never_hold_one_at_once_local(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    root.mkdir()
    _race_two_hosts(root.as_uri(), tmp_path, seconds=2.0)


def test_an_epoch_is_never_taken_twice_even_from_an_old_listing(tmp_path: Path) -> None:
    """The race the two-host test once caught: a maintainer acts on a listing that still shows epoch 2 (a release)
    as the newest, while others went on to epochs 3 and 4 and a cleanup deleted 3. Its create of 3 then finds a free
    name. Superseded epochs stay `SUPERSEDED_KEEP_SECONDS` (a release within that deletes nothing of them), and a
    take from a listing older than that lists again and gives the epoch up."""
    root = tmp_path / "ckpt"
    root.mkdir()
    fm = open_file_manager(root.as_uri())
    store = StoreId("agg", 0)
    now = [time.time()]  # compared with the files' times
    a, b = (RootLeases(fm, ttl=30, owner=o, clock=lambda: now[0]) for o in ("a", "b"))
    assert isinstance(a.take(store, timeout=0), Hold)
    a.release()  # epochs 1 (hold), 2 (release)
    old_listing = a.listing([store])[store]
    assert isinstance(b.take(store, timeout=0), Hold)  # 3
    b.release()  # 4; the superseded 1, 2 and 3 stay
    assert len(list(fm.list(lease_dir(store)))) == 4

    now[0] += SUPERSEDED_KEEP_SECONDS + 1  # long enough: the next release deletes what was superseded before
    assert isinstance(b.take(store, timeout=0), Hold)  # 5
    b.release()  # 6; 1..3 deleted; 4 and 5 (superseded just now) stay
    assert len(list(fm.list(lease_dir(store)))) == 3
    assert not fm.exists(lease_path(store, 3)), "epoch 3 is a free name again"

    late = RootLeases(fm, ttl=30, owner="late", clock=lambda: now[0])
    got = late.try_take(store, old_listing, listed_at=time.monotonic() - SUPERSEDED_KEEP_SECONDS)
    assert not isinstance(got, Hold), "a take from an old listing must not hold the store beside epoch 6"
    assert isinstance(late.take(store, timeout=0), Hold), "from a fresh listing it takes epoch 7"


@pytest.mark.slow
def test_two_hosts_racing_for_the_same_stores_never_hold_one_at_once_s3(s3_bucket: str, tmp_path: Path) -> None:
    _race_two_hosts(f"s3://{s3_bucket}/race", tmp_path, seconds=2.0)


def test_a_holder_paused_past_its_lease_cannot_delete_the_takers_fresh_files(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    """The issue's deletion: a holder plans orphans with grace 0, pauses past its lease; another maintainer takes
    the store and uploads a snapshot's SST (unreferenced until its manifest lands). The paused holder's
    deletion is refused with LeaseLostError before any request, and the fresh file survives."""
    h = snapshotted_history(make_local_history, settings)
    a = h.stores[0]
    now = [1_000_000.0]

    def clock() -> float:
        return now[0]

    paused = RootLeases(h.fm, ttl=10, owner="paused", clock=clock)
    assert isinstance(paused.try_take(a, paused.listing().get(a, [])), Hold)
    paused.check(a)  # held: fencing passes

    now[0] += 10 + MAX_CLOCK_SKEW_SECONDS + 1  # the holder's process stopped longer than its lease
    taker = RootLeases(h.fm, ttl=10, owner="taker", clock=clock)
    with pytest.raises(MaintenanceBusyError):  # not before the skew margin has passed either
        RootLeases(h.fm, ttl=10, owner="early", clock=lambda: now[0] - MAX_CLOCK_SKEW_SECONDS - 2).take(a, timeout=0)
    assert isinstance(taker.take(a, timeout=0), Hold)
    fresh = a.sst("ab" * 20 + ".sst")
    with h.fm.create(fresh) as f:
        f.write(b"an SST of the taker's snapshot in flight")

    inv = Inventory.scan(h.fm)
    planned = [e for e, _ in plan_store(inv, a, settings).orphans]
    assert fresh in {e.path for e in planned}, "with grace 0 the fresh SST looks like an orphan"
    with pytest.raises(LeaseLostError, match="another maintainer took it over") as lost:
        delete_entries(h.fm, planned, batch_size=1000, check=paused.guard(a).check)
    assert isinstance(lost.value, StatekeeperError)
    assert all(h.fm.exists(e.path) for e in planned), "nothing was deleted"
    paused.renew_all()  # nor does renewing bring it back
    with pytest.raises(LeaseLostError):
        paused.check(a)
    taker.check(a)
    taker.release_all()
    paused.release_all()  # lost: releasing leaves the taker's epochs alone
    assert isinstance(RootLeases(h.fm, ttl=10, clock=clock).take(a, timeout=0), Hold), "released: free again"


def test_lease_files_and_the_deployment_record_are_neither_foreign_nor_catalogued(
    make_local_history: Callable[..., History], settings: MaintenanceSettings, catalog: Catalog
) -> None:
    """Lease epochs and `_deployment.json` are in the layout: maintenance reports no foreign file and never
    deletes them as orphans, and a full catalog sync records no row for them."""
    from statekeeper.maintenance.catalog_sync import sync_catalog

    h = snapshotted_history(make_local_history, settings)
    assert expire_versions(h.fm, settings, catalog=catalog).ok  # records the catalog, leaves released epochs
    kinds = {classify(p).kind for p in all_files(h.root) if p.startswith(("_leases/", "_deployment"))}
    assert kinds == {LEASE, DEPLOYMENT}
    report = clean_orphans(h.fm, settings)
    assert report.ok and not report.warnings and report.foreign_files == 0, (report.errors, report.warnings)
    assert kinds == {classify(p).kind for p in all_files(h.root) if p.startswith(("_leases/", "_deployment"))}
    assert sync_catalog(catalog, h.fm, full=True).errors == []


def test_the_cli_finds_the_catalog_the_roots_deployment_uses(
    make_local_history: Callable[..., History],
    settings: MaintenanceSettings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """After the deployment's maintainer (Dagster after `make run`) ran on its catalog, `statekeeper runs ROOT`
    without --db shows its runs and says on stderr which catalog it read; never a password in the root."""
    h = snapshotted_history(make_local_history, settings)
    monkeypatch.delenv("STATEKEEPER_DB_URL", raising=False)
    monkeypatch.setenv("STATEKEEPER_HOME", str(tmp_path / "home"))  # the CLI's default catalog: another file
    deployment = Catalog.open(f"sqlite:///{tmp_path / 'run' / 'catalog.db'}", upgrade=True)
    try:
        assert expire_versions(h.fm, settings, catalog=deployment).ok
    finally:
        deployment.close()
    assert recorded_catalog(h.fm) == f"sqlite:///{tmp_path / 'run' / 'catalog.db'}"
    assert main(["runs", h.root, "--json"]) == 0
    out, err = capsys.readouterr()
    assert [r["kind"] for r in json.loads(out)] == ["expire"]
    assert f"catalog sqlite:///{tmp_path / 'run' / 'catalog.db'}" in err and "_deployment.json" in err
    assert len([line for line in err.splitlines() if "catalog" in line]) == 1


def test_a_recorded_catalog_url_never_carries_a_password() -> None:
    url = shareable_url("postgresql+psycopg://keeper:s3cret@db.example:5432/catalog?sslmode=require&password=x")
    assert "s3cret" not in url and "password" not in url and url.startswith("postgresql+psycopg://keeper@db.example")
    assert "sslmode=require" in url


def test_root_files_are_deleted_by_one_maintainer_at_a_time(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    """Commit records and batch files belong to no store: their deletions are fenced by the root's own lease
    (`ROOT_FILES`). While another maintainer holds it, expiry still expires the stores but keeps every commit
    record; once it is released, the next run deletes them, and the run leaves the root lease released."""
    h = snapshotted_history(make_local_history, settings)
    commits = {p for p in all_files(h.root) if p.startswith("commits/")}
    other = RootLeases(h.fm, ttl=60, owner="the-other-maintainer")
    other.take(ROOT_FILES, timeout=0)
    held = expire_versions(h.fm, settings)
    assert held.errors == [] and held.changelogs > 0, "the stores are expired as before"
    assert {p for p in all_files(h.root) if p.startswith("commits/")} == commits, "no commit record deleted"
    other.release_all()
    free = expire_versions(h.fm, settings)
    assert free.errors == []
    kept = {p for p in all_files(h.root) if p.startswith("commits/")}
    assert kept < commits, "the expired commit records go once the root lease is free"
    assert isinstance(RootLeases(h.fm, ttl=10).take(ROOT_FILES, timeout=0), Hold), "the run released it"


def test_a_maintainer_that_lost_the_root_lease_deletes_no_root_file(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    """Fencing of root files as of a store's: the holder paused past its lease finds the taker's epoch before its
    deletion batch and deletes nothing."""
    h = snapshotted_history(make_local_history, settings)
    now = [1_000_000.0]
    paused = RootLeases(h.fm, ttl=10, owner="paused", clock=lambda: now[0])
    paused.take(ROOT_FILES, timeout=0)
    now[0] += 10 + MAX_CLOCK_SKEW_SECONDS + 1
    RootLeases(h.fm, ttl=10, owner="taker", clock=lambda: now[0]).take(ROOT_FILES, timeout=0)
    root_files = [e for e in Inventory.scan(h.fm).all_entries() if e.path.startswith("commits/")]
    with pytest.raises(LeaseLostError):
        delete_entries(h.fm, root_files, batch_size=1000, check=paused.guard(ROOT_FILES).check)
    assert all(h.fm.exists(e.path) for e in root_files)


def test_a_loop_cycle_takes_the_root_lease_once_and_gives_it_back(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    """Cheap: inside a cycle, expiry and orphan cleanup share one hold of the root's files (one create to take,
    one to release, per cycle), and the cycle leaves it free."""
    h = snapshotted_history(make_local_history, settings)
    before = {p for p in all_files(h.root) if p.startswith(lease_dir(ROOT_FILES))}
    created: list[str] = []
    create = type(h.fm).create

    def counted(self: object, path: str, *a: object, **kw: object) -> object:
        if path.startswith(lease_dir(ROOT_FILES)):
            created.append(path)
        return create(self, path, *a, **kw)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(h.fm), "create", counted)
        maintain(h.fm, settings, every=0, cycles=1)
    assert before == set() and len(created) == 2, created  # a hold, then its release
    assert isinstance(RootLeases(h.fm, ttl=10).take(ROOT_FILES, timeout=0), Hold), "free after the cycle"


@pytest.mark.parametrize("fate", ["killed", "paused"])
def test_a_hold_of_a_process_gone_from_this_host_ends_at_once(tmp_path: Path, fate: str) -> None:
    """A maintainer killed with -9 holds its leases in the root until they expire; on its own host the next one
    sees that process is gone and takes them at once (a rerun after a crash is not refused for the lease's ttl).
    A holder that is only paused (SIGSTOP) is alive: its hold stands."""
    import signal
    import subprocess
    import sys

    root = (tmp_path / "ckpt").as_uri()
    store = StoreId("agg", 0)
    holder = (
        "import sys, time\n"
        "from statekeeper.maintenance.root_leases import RootLeases\n"
        "from statekeeper.store.files import open_file_manager\n"
        "from statekeeper.store.layout import StoreId\n"
        f"RootLeases(open_file_manager({root!r}), ttl=600).take(StoreId('agg', 0), timeout=0)\n"
        "print('held', flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        if fate == "killed":
            proc.kill()
            proc.wait(timeout=60)
            assert isinstance(RootLeases(open_file_manager(root), ttl=10).take(store, timeout=0), Hold)
        else:
            proc.send_signal(signal.SIGSTOP)
            with pytest.raises(MaintenanceBusyError, match=f":{proc.pid}' holds its lease"):
                RootLeases(open_file_manager(root), ttl=10).take(store, timeout=0)
    finally:
        proc.kill()
        proc.wait(timeout=60)


@pytest.mark.parametrize("operation", ["expire", "clean-orphans"])
def test_a_lease_lost_part_way_reports_every_file_that_went(
    make_local_history: Callable[..., History],
    settings: MaintenanceSettings,
    catalog: Catalog,
    monkeypatch: pytest.MonkeyPatch,
    operation: str,
) -> None:
    """Fencing stops the deletions of a store whose lease was lost; what went before is in the report (files, bytes,
    rows) and marked deleted in the catalog, as a run that was not stopped reports it."""
    from statekeeper.maintenance import leasing
    from statekeeper.maintenance.catalog_sync import sync_catalog

    h = snapshotted_history(make_local_history, settings)
    checks = [0]
    check = leasing._Guard.check

    def lost_after_three(guard: leasing._Guard) -> None:
        checks[0] += 1
        if checks[0] > 3:
            raise LeaseLostError("another maintainer took it over (the test's)")
        check(guard)

    monkeypatch.setattr(leasing._Guard, "check", lost_after_three)
    one_by_one = MaintenanceSettings(**{**settings.to_json(), "delete_batch_size": 1, "parallelism": 1})
    sync_catalog(catalog, h.fm)
    before = all_files(h.root)
    op = expire_versions if operation == "expire" else clean_orphans
    report = op(h.fm, one_by_one, catalog=catalog)
    gone = sorted(set(before) - set(all_files(h.root)))
    assert len([p for p in gone if p.startswith("state/")]) == 3, "three of the stores' files went before it was lost"
    assert not report.ok and sum("took it over" in e for e in report.errors) == 2, "each store's loss named once"
    assert sorted(r["path"] for r in report.rows() if r["action"] == "deleted") == gone
    assert (report.files, report.bytes) == (len(gone), sum(before[p] for p in gone))
    files = catalog.summary(h.fm.root_uri)["files"]
    assert sum(states.get("deleted", {}).get("files", 0) for states in files.values()) == len(gone)
