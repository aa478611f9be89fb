"""The maintainers' own records in a root (lease holds, the deployment record) are untrusted content too
(DESIGN invariant 12): a record nested thousands deep within the size cap, or of the wrong shape, is a
`CorruptFileError` naming the file, never a raw RecursionError. A commit record's claims about the files it
commits are checked against them before maintenance deletes or builds anything on them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from statekeeper.maintenance.cli import main
from statekeeper.maintenance.deployment import recorded_catalog
from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.root_leases import HoldRecord
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_builds import create_snapshots
from statekeeper.store.errors import CorruptFileError
from statekeeper.store.files import open_file_manager
from statekeeper.store.formats.commit import CommitRecord
from statekeeper.store.layout import DEPLOYMENT_FILE, MAX_VERSION, commit_path
from statekeeper.store.snapshot import read_manifest
from tests.maintenance.helpers import History, clobber

BODIES = [b"[" * 4000, b'{"a":' * 800 + b"1" + b"}" * 800, b"[1]", b"\xff", b'{"format": "x"}']
HOLD = b'{"format":"statekeeper-lease","version":1,"owner":"o","token":"t","epoch":3,"expires_at":%s}'
EXPIRIES = [HOLD % (b"1" + b"0" * 309), HOLD % b"NaN", HOLD % b"Infinity", HOLD % b"-1"]
"""Hold records whose expiry no clock reaches (an int past a float's range raised OverflowError; an infinite one
held the store for ever)."""


@pytest.mark.parametrize("body", BODIES + EXPIRIES)
def test_a_hostile_lease_record_is_refused_naming_it(body: bytes) -> None:
    with pytest.raises(CorruptFileError, match=r"unreadable maintenance lease.*s3://b/r/_leases/x"):
        HoldRecord.parse(body, "s3://b/r/_leases/x", 3)


@pytest.mark.parametrize("body", BODIES)
def test_a_hostile_deployment_record_is_refused_naming_it(tmp_path: Path, body: bytes) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / DEPLOYMENT_FILE).write_bytes(body)
    with pytest.raises(CorruptFileError, match=rf"unreadable deployment record.*{DEPLOYMENT_FILE}"):
        recorded_catalog(open_file_manager(str(tmp_path / "root")))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("command", [["expire", "--retain", "3"], ["snapshot", "--threshold", "1"], ["verify"]])
def test_a_full_state_changelog_a_commit_record_claims_and_its_header_denies_is_no_base(
    make_local_history: Callable[..., History],
    settings: MaintenanceSettings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: list[str],
) -> None:
    """Version 8's record claims a rescale, but its changelog's header extends version 7 (every checksum right):
    expiry took it as a full-state base and deleted the files below it that every retained version's load walks
    to; a snapshot build replayed it from the empty state and wrote a snapshot of version 10 without versions 1-7;
    verify found nothing wrong."""
    monkeypatch.setenv("STATEKEEPER_HOME", str(tmp_path / "home"))
    h = make_local_history(operators={"agg": 1})
    h.batches(10)
    record = CommitRecord.from_bytes(h.fm.read_bytes(commit_path(8)), commit_path(8))
    clobber(h.root, commit_path(8), replace(record, change={"agg": "rescale"}).to_bytes())
    changelog = h.stores[0].changelog(8, h.committed[8][h.stores[0]][0])
    code = main([*command, h.root, "--json", "--work-dir", str(tmp_path / "work")])
    out = capsys.readouterr()
    assert code == 1 and changelog in out.out, (out.out[-2000:], out.err[-2000:])
    for v in h.retained(settings):
        h.check_loadable([v])  # each in a fresh instance: a cold load


@pytest.mark.timeout(300)
def test_a_commit_record_far_above_the_others_is_a_problem_every_command_names_quickly(
    make_local_history: Callable[..., History],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A well-framed record of version 10**12 above versions 1-4: the plan walked every version between (a hang in
    every command), and verify failed with a bare KeyError ("verification failed: 999999999998")."""
    monkeypatch.setenv("STATEKEEPER_HOME", str(tmp_path / "home"))
    h = make_local_history(operators={"agg": 1})
    h.batches(4)
    far = 10**12
    record = CommitRecord.from_bytes(h.fm.read_bytes(commit_path(4)), commit_path(4))
    clobber(h.root, commit_path(far), replace(record, version=far, batch_id=None).to_bytes())
    work = ["--work-dir", str(tmp_path / "work")]
    said = ""
    one = ["inspect", "--store", "agg/0", "--version", str(far)]
    for cmd in (["inspect"], one, ["verify", *work], ["expire", *work], ["snapshot", *work], ["catalog", "sync"]):
        t0 = time.monotonic()
        code = main([*cmd, h.root, "--json"])
        out = capsys.readouterr()
        assert code in (0, 1) and time.monotonic() - t0 < 30, (cmd, code, out.err[-2000:])
        assert "verification failed" not in out.out + out.err, out.out[-2000:]
        said += out.out + out.err
    assert "retained versions need version 5, which no commit record names" in said
    assert f"no commit record names versions 5..{far - 1}" in said
    h.check_loadable(range(1, 5))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("field", ["num_keys", "sst size", "key_count"])
def test_a_manifest_count_a_64_bit_long_cannot_hold_is_named_not_a_crash_of_catalog_sync(
    make_local_history: Callable[..., History],
    settings: MaintenanceSettings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    field: str,
) -> None:
    """A manifest claiming 2**64 keys or bytes: `catalog sync` died of an OverflowError inserting it."""
    monkeypatch.setenv("STATEKEEPER_HOME", str(tmp_path / "home"))
    h = make_local_history(operators={"agg": 1})
    h.batches(5)
    create_snapshots(h.fm, settings)
    (key, entry) = max(Inventory.scan(h.fm).files_of(h.stores[0]).manifests.items())
    m = read_manifest(h.fm, h.stores[0], *key)
    huge = {
        "num_keys": replace(m, num_keys=2**64),
        "key_count": replace(m, key_count=2**64),
        "sst size": replace(m, sst_files=(replace(m.sst_files[0], size=2**64), *m.sst_files[1:])),
    }[field]
    clobber(h.root, entry.path, huge.to_bytes())
    code = main(["catalog", "sync", "--full", h.root, "--json"])
    out = capsys.readouterr()
    assert code == 1 and entry.path in out.out + out.err, (out.out[-2000:], out.err[-2000:])


@pytest.mark.timeout(300)
def test_a_lease_epoch_named_near_the_last_one_fails_its_store_naming_it(
    make_local_history: Callable[..., History],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An epoch file named a step below the largest epoch a name holds: taking and releasing the store's lease ran
    out of names, an error naming no file ("invalid version 9223372036854775807"), at every maintenance run."""
    monkeypatch.setenv("STATEKEEPER_HOME", str(tmp_path / "home"))
    h = make_local_history(operators={"agg": 2})
    h.batches(6)
    bad = f"_leases/agg/00000/{MAX_VERSION - 2:020d}.lease"
    clobber(h.root, bad, b"")  # a release
    before = max(Inventory.scan(h.fm).files_of(h.stores[1]).manifests, default=(0, ""))[0]
    code = main(["snapshot", "--threshold", "1", h.root, "--json", "--work-dir", str(tmp_path / "work")])
    out = capsys.readouterr()
    assert code == 1 and bad in out.out, (out.out[-2000:], out.err[-2000:])
    assert max(Inventory.scan(h.fm).files_of(h.stores[1]).manifests)[0] > before, "the other store was snapshotted"
