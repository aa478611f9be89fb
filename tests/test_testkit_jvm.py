"""The test JVMs' class archive (testkit.jvm_classes): mapped only when it exists."""

from __future__ import annotations

from pathlib import Path

from testkit.jvm_classes import jvm_options


def test_the_archive_is_mapped_only_when_it_exists(tmp_path: Path) -> None:
    archive = tmp_path / "classes.jsa"
    assert jvm_options(archive) == ""
    archive.write_bytes(b"")
    assert jvm_options(archive) == f"-XX:SharedArchiveFile={archive} -Xlog:cds*=off"
