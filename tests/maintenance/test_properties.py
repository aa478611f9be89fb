"""Property test: random histories interleaving commits, retried and pending attempts, crashed snapshot
uploads, snapshots, expiry and orphan cleanup keep every retained version loadable and equal to the
model, and leave no file that is neither needed by a retained version nor possibly in flight."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from statekeeper.maintenance.expiry import expire_versions
from statekeeper.maintenance.inventory import Inventory, clear_caches
from statekeeper.maintenance.orphans import clean_orphans
from statekeeper.maintenance.replica_pool import close_replicas
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_builds import create_snapshots
from tests.maintenance.helpers import History, leftovers
from tests.model_steps import CountedSteps, scaled

STATS = {"expired": 0, "orphans": 0, "snapshots": 0, "clean": 0}


class MaintenanceMachine(CountedSteps, RuleBasedStateMachine):
    model_name = "store + maintenance"
    root_base = ""

    @initialize(seed=st.integers(0, 2**16))
    def setup(self, seed: int) -> None:
        root = f"{self.root_base.rstrip('/')}/{uuid.uuid4().hex[:10]}"
        self.h = History(root, operators={"agg": 2}, seed=seed, keys=25)
        self.work = tempfile.mkdtemp(prefix="sk-prop-")
        self.loadable_from = 1  # every version from here to the latest must stay loadable
        self.h.batch()  # the query's first batch creates the checkpoint root

    def settings(self, **kw: float) -> MaintenanceSettings:
        base = {
            "orphan_grace_seconds": 0,
            "load_grace_seconds": 0,
            "parallelism": 2,
            "work_dir": self.work,
            "lease_ttl_seconds": 30,
        }
        return MaintenanceSettings(**{**base, **kw})  # type: ignore[arg-type]

    def teardown(self) -> None:
        if hasattr(self, "h"):
            self.check(range(self.loadable_from, self.h.latest + 1))
            self.h.close()
            close_replicas()
            clear_caches()
            shutil.rmtree(self.work, ignore_errors=True)

    def check(self, versions: range | list[int]) -> None:
        versions = [v for v in versions if 1 <= v <= self.h.latest]
        if versions:
            self.h.check_loadable(versions)

    # -- the streaming job ------------------------------------------------------------------------
    @rule(n=st.integers(1, 4), losing=st.integers(0, 2))
    def commit_batches(self, n: int, losing: int) -> None:
        self.h.batches(n, losing=losing)

    @precondition(lambda self: not self.h.pending)
    @rule()
    def batch_in_flight(self) -> None:
        """A batch whose tasks committed but whose driver has not written the commit record yet."""
        self.h.batch(commit=False)

    @rule(data=st.binary(min_size=1, max_size=64))
    def crashed_snapshot_upload(self, data: bytes) -> None:
        """An SST uploaded by a snapshot run that died before its manifest."""
        import hashlib

        name = hashlib.sha256(data).hexdigest()[:40] + ".sst"
        with self.h.fm.create(self.h.stores[0].sst(name), exclusive=False) as out:  # content-named
            out.write(data)

    # -- maintenance ------------------------------------------------------------------------------
    @rule(threshold=st.integers(1, 5))
    def snapshot(self, threshold: int) -> None:
        report = create_snapshots(self.h.fm, self.settings(snapshot_threshold=threshold))
        assert report.ok, report.errors
        STATS["snapshots"] += report.snapshots
        self.check([self.h.latest])

    @rule(retain=st.integers(1, 5))
    def expire(self, retain: int) -> None:
        report = expire_versions(self.h.fm, self.settings(min_versions_to_retain=retain))
        assert report.ok, report.errors
        STATS["expired"] += report.files
        self.loadable_from = max(self.loadable_from, self.h.latest - retain + 1)
        self.check(sorted({self.loadable_from, self.h.latest}))

    @rule(retain=st.integers(1, 5))
    def clean_orphans(self, retain: int) -> None:
        pending = {s.changelog(v, c) for s, v, c in self.h.pending}
        report = clean_orphans(self.h.fm, self.settings(min_versions_to_retain=retain))
        assert report.ok, report.errors
        STATS["orphans"] += report.files
        assert pending <= {i.path for i in self.h.fm.list("")}, "a changelog in flight was deleted"
        self.check(sorted({self.loadable_from, self.h.latest}))

    @rule(retain=st.integers(1, 5))
    def full_maintenance(self, retain: int) -> None:
        """Expiry then orphan cleanup with one retention: nothing unneeded is left."""
        s = self.settings(min_versions_to_retain=retain)
        expired = expire_versions(self.h.fm, s)
        orphans = clean_orphans(self.h.fm, s)
        assert expired.ok and orphans.ok, expired.errors + orphans.errors
        STATS["expired"] += expired.files
        STATS["orphans"] += orphans.files
        self.loadable_from = max(self.loadable_from, self.h.latest - retain + 1)
        assert leftovers(self.h.root, s) == []
        inv = Inventory.scan(self.h.fm)
        assert not inv.foreign and all(not f.foreign and not f.temps for f in inv.stores.values())
        STATS["clean"] += 1
        self.check(sorted({self.loadable_from, self.h.latest}))

    @rule()
    def lose_the_replicas(self) -> None:
        close_replicas()
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)


LONG = [pytest.mark.slow, pytest.mark.timeout(1800)]
"""The long run explores 60 random histories: on moto S3 it took 480 s to over 600 s (the default timeout), alone."""


@pytest.mark.parametrize("examples", [pytest.param(8, id="fast"), pytest.param(60, id="long", marks=LONG)])
def test_random_histories_keep_retained_versions_and_leave_nothing_unneeded(
    checkpoint_root: str, examples: int
) -> None:
    class Machine(MaintenanceMachine):
        root_base = checkpoint_root

    if checkpoint_root.startswith("s3:") and examples < 50:
        examples = 5  # every request is an HTTP round trip to moto: fewer examples in the default run
    Machine.TestCase.settings = settings(
        max_examples=scaled(examples),
        stateful_step_count=18 if examples < 50 else 40,
        deadline=None,
        derandomize=examples < 50,  # the default run is reproducible; the long one explores
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    before = dict(STATS)
    Machine.TestCase().runTest()
    assert STATS["expired"] > before["expired"] and STATS["orphans"] > before["orphans"]
    assert STATS["snapshots"] > before["snapshots"] and STATS["clean"] > before["clean"]
