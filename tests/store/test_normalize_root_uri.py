"""`normalize_root_uri`: the URI a file manager knows a root by, without opening one (the seams that only
compare or record roots: the CLI's catalog root, the Dagster resource's configured roots, the leases)."""

from __future__ import annotations

from pathlib import Path

import pytest

from statekeeper.store.errors import ConfigurationError
from statekeeper.store.files import normalize_root_uri, open_file_manager


@pytest.mark.parametrize(
    "root",
    ["s3://bucket", "s3://bucket/", "s3://bucket/a/b/", "s3a://bucket/a", "S3://bucket/a"],
)
def test_an_s3_root_normalises_as_its_file_manager_names_it(root: str) -> None:
    assert normalize_root_uri(root) == open_file_manager(root).root_uri


def test_a_local_root_normalises_as_its_file_manager_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for root in ["rel/dir", str(tmp_path / "x" / ".." / "y"), (tmp_path / "z").as_uri(), "file://localhost/tmp/q"]:
        assert normalize_root_uri(root) == open_file_manager(root).root_uri
    assert normalize_root_uri("rel/dir") == (tmp_path / "rel" / "dir").as_uri()


@pytest.mark.parametrize(
    "root", ["", "  ", "gs://bucket/a", "s3://Bad_Bucket/a", "s3://key:secret@bucket/a", "s3://bucket/a//b"]
)
def test_a_bad_root_is_refused_as_opening_it_would_be(root: str) -> None:
    with pytest.raises(ConfigurationError):
        normalize_root_uri(root)
    with pytest.raises(ConfigurationError):
        open_file_manager(root)
