"""The long-running maintainer: cycles of snapshot, expiry and orphan cleanup in one process."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from statekeeper.maintenance.health import chain_bound
from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.leasing import LeaseGuard, cycle_leases, store_lease
from statekeeper.maintenance.loop import CYCLE, CycleResult, maintain
from statekeeper.maintenance.root_leases import MaintenanceBusyError
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.workers import run_each
from statekeeper.sql import Catalog
from statekeeper.sql.leases import Lease
from statekeeper.store import faults
from statekeeper.store.errors import ConfigurationError
from statekeeper.store.files import CheckpointFileManager, open_file_manager
from statekeeper.store.layout import StoreId
from tests.cli_support import run_cli
from tests.maintenance.helpers import History, all_files


def test_cycles_snapshot_expire_and_clean(make_history: Callable[..., History], settings: MaintenanceSettings) -> None:
    h = make_history()
    h.batches(9, losing=1)
    assert maintain(h.fm, settings, every=0, cycles=1)[0].reports[1].files > 0  # snapshots at 9
    h.batches(4, losing=1)
    seen: list[CycleResult] = []
    results = maintain(h.fm, settings, every=0, cycles=2, on_cycle=seen.append)
    assert [r.cycle for r in results] == [1, 2] and seen == results and all(r.ok for r in results)
    first = {r.kind: r for r in results[0].reports}
    assert f"listing {results[0].listing_seconds:.2f}s" in results[0].summary()
    assert f"snapshot: {first['snapshot'].files} file(s) in {first['snapshot'].seconds:.2f}s" in results[0].summary()
    assert first["snapshot"].files > 0 and first["expire"].files > 0 and first["clean-orphans"].files > 0
    assert all(r.files == 0 for r in results[1].reports), "a second cycle finds nothing to do"
    h.check_loadable(h.retained(settings))
    stop = threading.Event()
    stop.set()
    assert maintain(h.fm, settings, every=60, stop=stop) == []


def test_the_maintain_command(make_local_history: Callable[..., History], tmp_path: Path) -> None:
    h, other = make_local_history(), make_local_history(seed=1)
    for history in (h, other):
        history.batches(9)
    ops = ["--retain", "3", "--threshold", "4", "--grace", "0", "--load-grace", "0"]
    home = tmp_path / "home"
    proc = run_cli("maintain", h.root, other.root, *ops, "--every", "0", "--cycles", "2", "--json", home=home)
    docs = [json.loads(line) for line in proc.stdout.splitlines()]  # JSON Lines: one document per cycle
    assert [d["cycle"] for d in docs] == [1, 2]
    assert all(0 < d["listing_seconds"] < d["seconds"] for d in docs), "where a cycle's time went: its listing"
    assert all(r["seconds"] > 0 for d in docs for r in d["reports"]), "... and each operation"
    assert [(r["root"], r["kind"]) for r in docs[0]["reports"]] == [
        (root, kind) for root in (h.fm.root_uri, other.fm.root_uri) for kind in ("expire", "snapshot", "clean-orphans")
    ]
    for history in (h, other):
        assert any(p.endswith(".manifest") for p in all_files(history.root))
    typo = run_cli("maintain", h.root, f"{other.root}-typo", "--cycles", "1", home=home, check=2)
    assert "-typo does not exist" in typo.stderr and typo.stdout == ""


def test_sigterm_stops_the_maintainer_after_its_cycle_with_its_leases_released(
    make_local_history: Callable[..., History], tmp_path: Path
) -> None:
    """What a service manager does to stop `statekeeper maintain`: it ends cleanly, holding nothing."""
    h = make_local_history()
    h.batches(9)
    home = tmp_path / "home"
    env = {**os.environ, "STATEKEEPER_HOME": str(home)}
    env.pop("STATEKEEPER_DB_URL", None)
    cmd = [sys.executable, "-m", "statekeeper.maintenance", "maintain", h.root, "--every", "0", "--threshold", "2"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for _ in range(3):  # cycles run back to back: the signal lands in one, leases held
            assert proc.stdout.readline().startswith("cycle "), proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "SIGTERM: stopping after the current root's cycle" in err
    catalog = Catalog.open(f"sqlite:///{home / 'catalog.db'}")
    try:
        assert catalog.leases(h.fm.root_uri) == []
    finally:
        catalog.close()


def _local_path(root: str) -> Path:
    return Path(urlparse(root).path)


def test_one_maintainer_keeps_several_roots_and_outlives_what_fails_at_run_time(
    make_local_history: Callable[..., History], settings: MaintenanceSettings, catalog: Catalog
) -> None:
    """Each cycle maintains every root; a root that is gone for a cycle (an unmounted volume) fails only its
    own part of that cycle, an I/O error on every listing fails a whole cycle, and the loop goes on: the next
    cycle maintains both roots again."""
    a, b = make_local_history(), make_local_history(seed=1)
    for h in (a, b):
        h.batches(9, losing=1)
    path_a = _local_path(a.root)
    away = path_a.with_name(path_a.name + "-unmounted")

    def eio(point: str, subject: str) -> None:
        if point == "local.list":
            raise OSError(errno.EIO, "injected I/O error", subject)

    def between(result: CycleResult) -> None:
        if result.cycle == 1:
            for h in (a, b):
                h.batches(4)
            path_a.rename(away)
        elif result.cycle == 2:
            away.rename(path_a)
            faults.arm(eio)
        elif result.cycle == 3:
            faults.arm(None)

    try:
        results = maintain([a.fm, b.fm], settings, every=0, cycles=4, catalog=catalog, on_cycle=between)
    finally:
        faults.arm(None)
    assert [r.ok for r in results] == [True, False, False, True]
    kinds = [[(r.root, r.kind) for r in res.reports] for res in results]
    ops = ["expire", "snapshot", "clean-orphans"]
    both = [(h.fm.root_uri, k) for h in (a, b) for k in ops]
    assert kinds == [both, [(a.fm.root_uri, CYCLE), *both[3:]], [(a.fm.root_uri, CYCLE), (b.fm.root_uri, CYCLE)], both]
    assert "does not exist" in results[1].reports[0].errors[0]
    assert all("injected I/O error" in r.errors[0] for r in results[2].reports)
    snapshots = [{r.root: r.files for r in res.reports if r.kind == "snapshot"} for res in results]
    assert snapshots[0][a.fm.root_uri] > 0 and snapshots[0][b.fm.root_uri] > 0
    assert snapshots[1][b.fm.root_uri] > 0, "the other root is maintained while one is gone"
    assert snapshots[3][a.fm.root_uri] > 0, "the root that came back is maintained again"
    for h in (a, b):
        h.check_loadable(h.retained(settings))
    with pytest.raises(ConfigurationError, match="does not exist"):  # wrong at start: stops at once
        maintain([b.fm, open_file_manager(f"{a.root}-typo")], settings, every=0, cycles=1)
    with pytest.raises(ConfigurationError, match="given twice"):
        maintain([a.fm, open_file_manager(a.root)], settings, every=0, cycles=1)


def test_maintain_only_the_named_stores(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    h = make_local_history()
    h.batches(9)
    first, second = h.stores
    (result,) = maintain(h.fm, settings, every=0, cycles=1, stores=[first])
    assert result.ok
    manifests = [p for p in all_files(h.root) if p.endswith(".manifest")]
    assert manifests and all(p.startswith(first.prefix + "/") for p in manifests)
    assert {p for p in all_files(h.root) if p.startswith(second.prefix + "/")} == {
        second.changelog(v, h.committed[v][second][0]) for v in range(1, 10)
    }, "the other store is left as its writer left it"


class _CountingCatalog(Catalog):
    """The real SQLite catalog, counting lease acquisitions per store scope and catalog transactions taking them."""

    acquired: Counter[str] = Counter()
    transactions = 0

    def acquire_lease(self, uri: str, store: tuple[str, int] | str | None = None, **kw: Any) -> Lease:
        lease = super().acquire_lease(uri, store, **kw)
        self.acquired[lease.scope] += 1
        self.transactions += 1
        return lease

    def acquire_leases(self, uri: str, stores: list[tuple[str, int]], **kw: Any) -> tuple[Lease | None, Any]:
        lease, refused = super().acquire_leases(uri, stores, **kw)
        self.acquired.update(lease.scopes if lease is not None else ())
        self.transactions += 1
        return lease, refused


def test_one_lease_per_store_per_cycle_and_refused_when_held_elsewhere(
    make_local_history: Callable[..., History], settings: MaintenanceSettings, tmp_path: Path
) -> None:
    h = make_local_history()
    h.batches(9, losing=1)
    with _CountingCatalog.open(f"sqlite:///{tmp_path / 'counting.db'}", upgrade=True) as catalog:
        maintain(h.fm, settings, every=0, cycles=1, catalog=catalog)  # snapshots at 9
        h.batches(4, losing=1)
        catalog.acquired = Counter()
        catalog.transactions = 0
        (first,) = maintain(h.fm, settings, every=0, cycles=1, catalog=catalog)
        assert first.ok and all(r.files > 0 for r in first.reports), "all three operations changed the stores"
        assert set(catalog.acquired.values()) == {1}, f"one acquisition per store and cycle: {catalog.acquired}"
        assert len(catalog.acquired) == len(h.stores)
        assert catalog.transactions == 1, "all the stores' leases taken in one catalog transaction"
        assert catalog.leases(h.fm.root_uri) == [], "every lease released when the cycle ends"

        h.batches(9, losing=1)
        a = h.stores[0]
        catalog.acquired = Counter()
        before = {p: s for p, s in all_files(h.root).items() if p.startswith(a.prefix)}
        with catalog.acquire_lease(h.fm.root_uri, (a.operator, a.partition), owner="other-host:4242", ttl=60):
            (second,) = maintain(h.fm, settings, every=0, cycles=1, catalog=catalog)
        assert not second.ok
        assert any("other-host:4242" in e for r in second.reports for e in r.errors)
        assert {p: s for p, s in all_files(h.root).items() if p.startswith(a.prefix)} == before, (
            "a held store untouched"
        )
        assert catalog.acquired[f"{a.operator}/{a.partition}"] == 1  # the holder's own acquisition only
        assert catalog.leases(h.fm.root_uri) == []


def test_cycle_leases_are_shared_only_by_the_cycles_own_work(
    make_local_history: Callable[..., History], settings: MaintenanceSettings, catalog: Catalog
) -> None:
    h = make_local_history()
    h.batches(2)
    a = h.stores[0]
    uri = h.fm.root_uri
    outside: list[BaseException] = []

    def other_caller() -> None:  # a thread of its own: not in the cycle's context
        try:
            with store_lease(h.fm, a, settings, catalog):
                pass
        except BaseException as e:
            outside.append(e)

    with cycle_leases(h.fm, settings, catalog):
        with store_lease(h.fm, a, settings, catalog) as first:
            pass
        (held,) = catalog.leases(uri)
        assert held.scope == f"{a.operator}/{a.partition}", "still held after the operation's block"
        shared = run_each([a, a], lambda s: _guard_of(h.fm, s, settings, catalog), parallelism=2)
        assert shared == [first, first], "the cycle's pool threads share its lease"
        t = threading.Thread(target=other_caller)
        t.start()
        t.join()
        assert len(outside) == 1 and isinstance(outside[0], MaintenanceBusyError), outside
    assert catalog.leases(uri) == [], "released when the cycle ends"


def _guard_of(fm: CheckpointFileManager, store: StoreId, settings: MaintenanceSettings, catalog: Catalog) -> LeaseGuard:
    with store_lease(fm, store, settings, catalog) as guard:
        return guard


@pytest.mark.parametrize("with_catalog", [True, False], ids=["catalog", "root-leases"])
def test_stores_leased_before_the_listing_are_not_listed_again(
    make_local_history: Callable[..., History],
    settings: MaintenanceSettings,
    catalog: Catalog,
    monkeypatch: pytest.MonkeyPatch,
    with_catalog: bool,
) -> None:
    """From the second cycle on the loop holds the known stores' leases before it lists the root (the
    catalog's, or without one the root's), so no operation lists a store again, nor the catalog
    sync after the snapshots: what expiry deletes leaves the cycle's listing, what a snapshot writes joins
    it. Expiry keeps the chains bounded, and every retained version loads."""
    h = make_local_history()
    h.batches(3, losing=1)
    listed: Counter[StoreId] = Counter()

    def counting(real: Callable[..., Any]) -> Callable[..., Any]:
        def listing(prefix: str = "", **kw: Any) -> Any:
            for s in h.stores:
                if prefix.startswith(f"{s.prefix}/"):  # the store, or one of its directories (catalog sync)
                    listed[s] += 1
            return real(prefix, **kw)

        return listing

    for name in ("list", "list_with_temp_files"):
        monkeypatch.setattr(h.fm, name, counting(getattr(h.fm, name)))
    expired_stores: list[StoreId] = []
    snapshotted: list[StoreId] = []
    real_scan = Inventory.scan.__func__  # type: ignore[attr-defined]
    reused: list[set[str]] = []

    def scan_checking_leases(cls: type[Inventory], /, *args: Any, leased: Any = (), **kw: Any) -> Inventory:
        """Invariant 5: a listing reused under a lease was taken while that lease was already held."""
        stores = {f"{s.operator}/{s.partition}" for s in leased}
        if with_catalog:
            assert stores <= {lease.scope for lease in catalog.leases(h.fm.root_uri)}
        else:
            assert all(_root_lease_held(h.fm, s) for s in leased)
        reused.append(stores)
        return real_scan(cls, *args, leased=leased, **kw)  # type: ignore[no-any-return]

    monkeypatch.setattr(Inventory, "scan", classmethod(scan_checking_leases))
    checked: list[int] = []

    def between(result: CycleResult) -> None:
        assert result.ok, result.summary()
        expire, snapshot, _ = result.reports
        assert (expire.kind, snapshot.kind) == ("expire", "snapshot")
        by_name = {str(s): s for s in h.stores}
        snapshotted.extend(by_name[i["store"]] for i in snapshot.items if i.get("action") == "snapshot")
        expired_stores.extend(by_name[i["store"]] for i in expire.items if i["action"] == "deleted" and i["store"])
        if result.cycle > 1:
            oldest = min(int(p.rsplit("/", 1)[1].split("_")[0]) for p in all_files(h.root) if "/changelogs/" in p)
            assert oldest >= h.latest - settings.min_versions_to_retain - settings.snapshot_threshold - 2
            assert not listed, f"cycle {result.cycle}: stores listed again: {dict(listed)}"
            checked.append(result.cycle)
        h.batches(2, losing=1)
        listed.clear()  # the writer's loads list snapshot directories too: count the maintainer's alone

    maintain(h.fm, settings, every=0, cycles=8, catalog=catalog if with_catalog else None, on_cycle=between)
    assert checked == list(range(2, 9))
    assert expired_stores and snapshotted, "expiry deleted and snapshots wrote files of stores not listed again"
    assert reused[0] == set() and all(len(r) == len(h.stores) for r in reused[1:]), reused
    h.check_loadable(h.retained(settings))


def _root_lease_held(fm: Any, store: StoreId) -> bool:
    """Whether `store`'s lease in the root is held: its newest epoch is a hold (a release is an empty epoch)."""
    from statekeeper.store.layout import lease_dir

    epochs = sorted(fm.list(lease_dir(store)), key=lambda f: f.path)
    return bool(epochs) and epochs[-1].size > 0


def test_a_fleet_keeps_a_replica_of_every_store_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Forty stores checked out twice (two snapshot rounds of a fleet): each replica is created once and
    stays open, instead of a small fixed cap closing and reopening copies every round (~3 ms of CPU each);
    the cap follows the open-file limit."""
    import resource

    from statekeeper.maintenance import replica_pool
    from statekeeper.maintenance.replica import Replica
    from statekeeper.store.files import open_file_manager

    created: Counter[StoreId] = Counter()

    class CountedReplica(Replica):
        def __init__(self, fm: Any, store: StoreId, directory: str) -> None:
            created[store] += 1
            super().__init__(fm, store, directory)

    monkeypatch.setattr(replica_pool, "Replica", CountedReplica)
    fm = open_file_manager((tmp_path / "root").as_uri())
    settings = MaintenanceSettings(work_dir=str(tmp_path / "work"))
    stores = [StoreId("fleet", p) for p in range(40)]
    try:
        for _ in range(2):
            for store in stores:
                with replica_pool.checkout(fm, store, replica_pool.work_root(settings)):
                    pass
        assert created == Counter(stores)
    finally:
        replica_pool.close_replicas()
    soft = {"value": 1024}
    monkeypatch.setattr(resource, "getrlimit", lambda _kind: (soft["value"], 4096))
    assert replica_pool.open_replica_limit() == (1024 - 256) // replica_pool.FILES_PER_REPLICA
    soft["value"] = 256
    assert replica_pool.open_replica_limit() == 32


def test_replicas_beyond_the_limit_are_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past `open_replica_limit()` the least recently used copies close (their directories stay)."""
    from statekeeper.maintenance import replica_pool
    from statekeeper.store.files import open_file_manager

    monkeypatch.setattr(replica_pool, "open_replica_limit", lambda: 3)
    fm = open_file_manager((tmp_path / "root").as_uri())
    work = str(tmp_path / "work")
    stores = [StoreId("fleet", p) for p in range(5)]
    try:
        for store in stores:
            with replica_pool.checkout(fm, store, work):
                pass
        open_now = [key[2] for key, slot in replica_pool._slots.items() if slot.replica is not None]
        assert open_now == stores[2:]
        assert all(os.path.isdir(replica_pool.replica_dir(work, fm.root_uri, s)) for s in stores)
    finally:
        replica_pool.close_replicas()


def test_a_long_running_maintainer_holds_what_its_root_holds(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    """Found by the 10-minute soak (RSS +8 MiB a minute): the parsed manifests and commit records of expired
    versions stayed cached, as did the names of every SST found sound, and each snapshot of a replica inlined its
    RocksDB MANIFEST, an edit longer at every flush (a cache of every path's kind went the same way; it is gone:
    classifying a path costs what the lookup did). Over many cycles of one loop the caches hold the files the root
    holds, and a snapshot's manifest stays as small as the store's metadata."""
    from statekeeper.maintenance import inventory, parsed_cache, snapshot_checks

    snapshot_checks.forget()  # what earlier tests' roots left
    inventory.clear_caches()
    h = make_local_history()
    manifest_sizes: list[int] = []
    listed: dict[str, int] = {}  # what the cycle's listing saw (the root before it)

    def count() -> None:
        h.batches(settings.snapshot_threshold)  # a snapshot of every store at every cycle
        files = all_files(h.root)
        listed["records"] = sum(p.startswith("commits/") for p in files)
        listed["manifests"] = sum(p.endswith(".manifest") for p in files)

    def after(result: CycleResult) -> None:
        assert result.ok, [e for r in result.reports for e in r.errors]
        assert len(inventory._records) <= listed["records"]
        assert len(inventory._manifests) <= listed["manifests"] + len(h.stores)  # + those it wrote
        files = all_files(h.root)
        assert len(parsed_cache.SOUND_SSTS) <= sum(p.endswith(".sst") for p in files)
        manifest_sizes.append(max(n for p, n in files.items() if p.endswith(".manifest")))
        count()

    count()

    maintain(h.fm, settings, every=0, cycles=90, on_cycle=after)
    # ~240 bytes of MANIFEST edits (x 4/3 in base64) per snapshot: without a new MANIFEST past
    # `rocks.MAX_MANIFEST_BYTES` (8 KiB), 90 snapshots would have grown it by ~35 KB
    assert max(manifest_sizes) - min(manifest_sizes) < 16 << 10, manifest_sizes
    h.check_loadable(h.retained(settings))


def test_a_long_running_maintainer_keeps_its_catalog_bounded(
    make_local_history: Callable[..., History], settings: MaintenanceSettings, tmp_path: Path
) -> None:
    """With no catalog history kept (`catalog_history_seconds` 0), the catalog of a root maintained for many
    cycles holds rows in proportion to the files the root holds, not to the versions it ever committed (each
    cycle commits a threshold of versions on every store; the rows of the expired ones are dropped)."""
    from sqlalchemy import func, select

    from statekeeper.sql.models import Base

    no_history = MaintenanceSettings(**{**settings.to_json(), "catalog_history_seconds": 0.0})
    h = make_local_history()
    rows: list[int] = []
    with Catalog.open(f"sqlite:///{tmp_path / 'catalog.db'}", upgrade=True) as catalog:

        def after(result: CycleResult) -> None:
            assert result.ok, [e for r in result.reports for e in r.errors]
            with catalog.read() as conn:
                rows.append(sum(conn.execute(select(func.count()).select_from(t)).scalar_one() for t in tables))
            files = len(all_files(h.root))
            assert rows[-1] <= 6 * files + 20, (rows, files)  # runs and leases: a handful
            h.batches(settings.snapshot_threshold)

        tables = Base.metadata.sorted_tables
        h.batches(settings.snapshot_threshold)
        maintain(h.fm, no_history, every=0, cycles=30, on_cycle=after, catalog=catalog)
    assert h.latest >= 30 * settings.snapshot_threshold
    assert max(rows[10:]) <= 1.5 * min(rows[10:]), rows  # level, not growing with the versions committed
    h.check_loadable(h.retained(settings))


def test_the_loop_says_when_it_falls_behind_and_when_it_is_back_within(
    make_local_history: Callable[..., History], settings: MaintenanceSettings, caplog: pytest.LogCaptureFixture
) -> None:
    """A root whose chains run past twice the snapshot threshold (the writers outpace the maintainer) is named in a
    warning with its longest chain: once, not every cycle while it stays behind, and again when it is back within."""
    h = make_local_history()
    bound = chain_bound(settings.snapshot_threshold)
    h.batches(bound + 1)

    def outpaced(result: CycleResult) -> None:
        if result.cycle == 1:
            h.batches(bound + 2)

    with caplog.at_level(logging.WARNING, logger="statekeeper.maintenance.loop"):
        maintain(h.fm, settings, every=0, cycles=3, on_cycle=outpaced)
    said = [r.getMessage() for r in caplog.records if h.fm.root_uri in r.getMessage()]
    assert len(said) == 2, said
    assert "falling behind" in said[0] and f"chain reached {bound + 1} changelogs" in said[0]
    assert "--build-processes" in said[0]
    assert f"within twice the snapshot threshold ({bound}) again" in said[1]
