"""Maintenance leases (DESIGN invariant 5): one maintainer per store, on SQLite and PostgreSQL."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from statekeeper.sql import Catalog, CatalogConfigError, LeaseLostError, LeaseUnavailableError
from statekeeper.sql.leases import Lease

ROOT = "file:///ckpt"
REPO = Path(__file__).resolve().parents[2]


def race(
    catalog: Catalog, n: int, store: tuple[str, int] | None, **kwargs: float
) -> tuple[list[Lease], list[Exception]]:
    """`n` threads call acquire at the same instant."""
    barrier = threading.Barrier(n)
    won: list[Lease] = []
    lost: list[Exception] = []

    def go(i: int) -> None:
        barrier.wait()
        try:
            won.append(catalog.acquire_lease(ROOT, store, owner=f"maintainer-{i}", **kwargs))
        except LeaseUnavailableError as e:
            lost.append(e)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won, lost


def test_concurrent_acquirers_exactly_one_wins(catalog: Catalog) -> None:
    for _ in range(4):
        won, lost = race(catalog, 6, ("agg", 0), ttl=30, timeout=0)
        assert len(won) == 1 and len(lost) == 5
        holder = won[0].owner
        for e in lost:
            assert isinstance(e, LeaseUnavailableError) and e.holder == holder
            assert f"cannot maintain store agg/0 of {ROOT}: {holder!r} holds a lease on store agg/0 until" in str(e)
        assert [(i.scope, i.owner) for i in catalog.leases(ROOT)] == [("agg/0", holder)]
        won[0].release()
        assert catalog.leases(ROOT) == []


def test_second_maintainer_waits_for_release(catalog: Catalog) -> None:
    first = catalog.acquire_lease(ROOT, ("agg", 1), owner="first", ttl=30)
    threading.Timer(0.5, first.release).start()
    t0 = time.monotonic()
    with catalog.acquire_lease(ROOT, ("agg", 1), owner="second", ttl=30, timeout=10, poll_interval=0.05) as second:
        assert time.monotonic() - t0 >= 0.4
        assert second.held and [i.owner for i in catalog.leases(ROOT)] == ["second"]
    assert catalog.leases(ROOT) == []


def test_second_maintainer_fails_clearly_after_timeout(catalog: Catalog) -> None:
    with catalog.acquire_lease(ROOT, ("agg", 1), owner="first", ttl=30):
        t0 = time.monotonic()
        with pytest.raises(LeaseUnavailableError) as err:
            catalog.acquire_lease(ROOT, ("agg", 1), owner="second", timeout=0.5, poll_interval=0.1)
        assert 0.45 <= time.monotonic() - t0 < 5
        msg = str(err.value)
        assert "cannot maintain store agg/1 of file:///ckpt: 'first' holds a lease on store agg/1 until" in msg
        waited = re.search(r"waited (\d+\.\d+)s", msg)
        assert waited and float(waited.group(1)) >= 0.5, msg


def test_expired_lease_is_taken_over(catalog: Catalog) -> None:
    old = catalog.acquire_lease(ROOT, ("agg", 0), owner="crashed", ttl=0.3)
    with pytest.raises(LeaseUnavailableError):
        catalog.acquire_lease(ROOT, ("agg", 0), owner="new")
    time.sleep(0.4)
    assert catalog.leases(ROOT)[0].expired and not old.held
    new = catalog.acquire_lease(ROOT, ("agg", 0), owner="new", ttl=30)
    with pytest.raises(LeaseLostError, match="another maintainer took it over"):
        old.renew()
    with pytest.raises(LeaseLostError):
        old.check()
    old.release()  # leaves the new holder's lease alone
    assert [i.owner for i in catalog.leases(ROOT)] == ["new"]
    new.check()
    new.release()
    with pytest.raises(LeaseLostError, match="released"):
        new.check()


def test_renew_and_keep_alive(catalog: Catalog) -> None:
    lease = catalog.acquire_lease(ROOT, None, owner="long-run", ttl=0.6)
    before = lease.expires_at
    lease.renew(ttl=0.6)
    assert lease.expires_at > before
    lease.keep_alive(interval=0.1)
    time.sleep(1.3)  # twice the ttl: still held thanks to the renewals
    lease.check()
    with pytest.raises(LeaseUnavailableError):
        catalog.acquire_lease(ROOT, ("agg", 0), owner="other")
    lease.release()
    catalog.acquire_lease(ROOT, ("agg", 0), owner="other").release()


def test_root_and_store_scopes(catalog: Catalog) -> None:
    with catalog.acquire_lease(ROOT, ("agg", 0), owner="a"):
        catalog.acquire_lease(ROOT, ("agg", 1), owner="b").release()  # another store: fine
        catalog.acquire_lease("file:///other", None, owner="c").release()  # another root: fine
        with pytest.raises(LeaseUnavailableError, match=r"cannot maintain the whole root .* on store agg/0"):
            catalog.acquire_lease(ROOT, None, owner="d")
    with (
        catalog.acquire_lease(ROOT, "*", owner="root-job"),
        pytest.raises(LeaseUnavailableError, match="'root-job' holds a lease on the whole root"),
    ):
        catalog.acquire_lease(ROOT, "agg/5", owner="e")
    for bad in ("agg", "agg/x", ("", 1), ("agg", -1)):
        with pytest.raises(CatalogConfigError):
            catalog.acquire_lease(ROOT, bad)
    with pytest.raises(CatalogConfigError):
        catalog.acquire_lease(ROOT, ("agg", 0), ttl=0)


def test_many_store_leases_in_one_transaction(catalog: Catalog) -> None:
    stores = [("agg", p) for p in range(6)]
    crashed = catalog.acquire_lease(ROOT, ("agg", 4), owner="crashed", ttl=0.3)
    with catalog.acquire_lease(ROOT, ("agg", 1), owner="busy", ttl=30) as busy:
        time.sleep(0.4)  # the crashed maintainer's lease expires; busy's does not
        group, refused = catalog.acquire_leases(ROOT, [*stores, ("agg", 0)], owner="cycle", ttl=30)
        assert group is not None and group.scopes == ("agg/0", "agg/2", "agg/3", "agg/4", "agg/5")
        assert {s: i.owner for s, i in refused.items()} == {"agg/1": "busy"}
        held = {i.scope: i.owner for i in catalog.leases(ROOT)}
        assert held == {"agg/1": "busy", **{s: "cycle" for s in group.scopes}}, "the expired lease taken over"
        with pytest.raises(LeaseLostError, match="another maintainer took it over"):
            crashed.check()
        with pytest.raises(LeaseUnavailableError, match="'cycle' holds a lease on store agg/3"):
            catalog.acquire_lease(ROOT, ("agg", 3), owner="other")
        none, all_refused = catalog.acquire_leases(ROOT, stores[2:4], owner="other")
        assert none is None and set(all_refused) == {"agg/2", "agg/3"}
        before = group.expires_at
        group.renew()  # one statement renews all five
        assert group.expires_at > before and {i.expires_at for i in catalog.leases(ROOT) if i.owner == "cycle"} == {
            group.expires_at
        }
        group.release()
        assert [i.owner for i in catalog.leases(ROOT)] == ["busy"], "released together, the other holder's kept"
        assert busy.held
    with catalog.acquire_lease(ROOT, None, owner="root-job"):
        none, refused = catalog.acquire_leases(ROOT, stores, owner="cycle")
        assert none is None and {i.owner for i in refused.values()} == {"root-job"}
    with pytest.raises(CatalogConfigError, match="store leases only"):
        catalog.acquire_leases(ROOT, ["*"])  # type: ignore[list-item]
    assert catalog.acquire_leases(ROOT, []) == (None, {})


def test_a_lease_of_many_stores_is_lost_when_any_is_taken_over(catalog: Catalog) -> None:
    group, _ = catalog.acquire_leases(ROOT, [("agg", 0), ("agg", 1)], owner="slow", ttl=0.3)
    assert group is not None
    time.sleep(0.4)
    catalog.acquire_lease(ROOT, ("agg", 1), owner="new", ttl=30)
    with pytest.raises(LeaseLostError, match=r"store 2 stores \(agg/0, ...\).*took it over"):
        group.check()
    group.release()
    assert [i.owner for i in catalog.leases(ROOT)] == ["new"]


CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    from statekeeper.sql import Catalog, LeaseUnavailableError
    url, name = sys.argv[1], sys.argv[2]
    timeout, hold = (float(x) for x in sys.argv[3:5])
    sync_dir, n, hold_until_all_tried = sys.argv[5], int(sys.argv[6]), sys.argv[7] == "1"

    def barrier(stage):
        open(os.path.join(sync_dir, f"{stage}-{name}"), "w").close()
        deadline = time.time() + 90
        while sum(f.startswith(stage + "-") for f in os.listdir(sync_dir)) < n and time.time() < deadline:
            time.sleep(0.01)

    cat = Catalog.open(url)
    barrier("ready")  # every child is connected before the race starts, however slow its start
    try:
        lease = cat.acquire_lease("file:///ckpt", ("agg", 0), owner=name, ttl=60, timeout=timeout, poll_interval=0.02)
    except LeaseUnavailableError as e:
        barrier("tried")
        print(json.dumps({"name": name, "won": False, "error": str(e)}))
        sys.exit(0)
    t0 = time.time()
    time.sleep(hold)
    if hold_until_all_tried:
        barrier("tried")  # hold until every other child has tried
    t1 = time.time()
    lease.release()
    print(json.dumps({"name": name, "won": True, "start": t0, "end": t1}))
    """
)


def run_children(
    url: str, n: int, timeout: float, hold: float, *, hold_until_all_tried: bool = False
) -> list[dict[str, object]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryDirectory() as sync_dir:
        args = [str(timeout), str(hold), sync_dir, str(n), "1" if hold_until_all_tried else "0"]
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", CHILD, url, f"proc-{i}", *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for i in range(n)
        ]
        out = []
        for p in procs:
            stdout, stderr = p.communicate(timeout=180)
            assert p.returncode == 0, stderr
            out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def test_processes_race_exactly_one_wins(catalog: Catalog) -> None:
    url = catalog.engine.url.render_as_string(hide_password=False)
    results = run_children(url, 4, timeout=0, hold=0.2, hold_until_all_tried=True)
    winners = [r for r in results if r["won"]]
    assert len(winners) == 1
    for r in results:
        if not r["won"]:
            assert f"{winners[0]['name']!r} holds a lease on store agg/0" in str(r["error"])


def test_processes_waiting_never_overlap(catalog: Catalog) -> None:
    results = run_children(catalog.engine.url.render_as_string(hide_password=False), 4, timeout=60, hold=0.3)
    assert all(r["won"] for r in results)
    spans = sorted((float(r["start"]), float(r["end"])) for r in results)  # type: ignore[arg-type]
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, spans
