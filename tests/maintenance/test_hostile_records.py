"""The maintainers' own records in a root (lease holds, the deployment record) are untrusted content too
(DESIGN invariant 12): a record nested thousands deep within the size cap, or of the wrong shape, is a
`CorruptFileError` naming the file, never a raw RecursionError."""

from __future__ import annotations

from pathlib import Path

import pytest

from statekeeper.maintenance.deployment import recorded_catalog
from statekeeper.maintenance.root_leases import HoldRecord
from statekeeper.store.errors import CorruptFileError
from statekeeper.store.files import open_file_manager
from statekeeper.store.layout import DEPLOYMENT_FILE

BODIES = [b"[" * 4000, b'{"a":' * 800 + b"1" + b"}" * 800, b"[1]", b"\xff", b'{"format": "x"}']


@pytest.mark.parametrize("body", BODIES)
def test_a_hostile_lease_record_is_refused_naming_it(body: bytes) -> None:
    with pytest.raises(CorruptFileError, match=r"unreadable maintenance lease.*s3://b/r/_leases/x"):
        HoldRecord.parse(body, "s3://b/r/_leases/x", 3)


@pytest.mark.parametrize("body", BODIES)
def test_a_hostile_deployment_record_is_refused_naming_it(tmp_path: Path, body: bytes) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / DEPLOYMENT_FILE).write_bytes(body)
    with pytest.raises(CorruptFileError, match=rf"unreadable deployment record.*{DEPLOYMENT_FILE}"):
        recorded_catalog(open_file_manager(str(tmp_path / "root")))
