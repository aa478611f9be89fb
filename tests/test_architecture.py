"""The architecture, checked: no import circle, layers one way, modules of one size, the design map current.

Read from the source (no module is imported), so every import counts: at module level, inside
functions and under ``TYPE_CHECKING`` alike. A circle there is one even if Python happens to load
it, since it ties two modules' responsibilities together; a module reached only through a deferred
import is still a dependency. Importing ``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b``;
those implicit parent imports are not edges (a package re-exporting its modules is not a circle).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.architecture import (
    NAMESPACE,
    PACKAGES,
    REPO,
    find_circle,
    import_graph,
    imported_names,
    module_files,
    product_graph,
    updated_design,
)

ALLOWED_LAYERS = {
    "store": {"store"},
    "sql": {"sql"},
    "maintenance": {"maintenance", "store", "sql"},
    "orchestration": {"orchestration", "maintenance", "store", "sql"},
}
"""Which top-level packages each package may import: orchestration -> maintenance -> (store, sql)."""


def test_no_import_circle_in_the_product() -> None:
    graph = product_graph()
    assert len(graph) > 50, "the product's modules were not found"
    circle = find_circle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def test_layers_point_one_way() -> None:
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in product_graph().items()
        for target in targets
        if target.split(".")[1] not in ALLOWED_LAYERS[module.split(".")[1]]
    )
    assert not wrong, "imports against orchestration -> maintenance -> (store, sql):\n" + "\n".join(wrong)


@pytest.mark.parametrize(
    ("files", "circle"),
    [
        ({"a.py": "from pkg import b\n", "b.py": "from pkg.a import x\n"}, True),
        ({"a.py": "from .b import x\n", "b.py": "def f():\n    from . import a\n"}, True),
        (
            {
                "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.b\n",
                "b.py": "import pkg.a\n",
            },
            True,
        ),
        ({"__init__.py": "from pkg.a import x\n", "a.py": "from pkg.b import y\n", "b.py": "import os\n"}, False),
    ],
    ids=["from-import", "relative-deferred", "type-checking", "package-reexport"],
)
def test_the_check_finds_circles(tmp_path: Path, files: dict[str, str], circle: bool) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, text in files.items():
        (package / name).write_text(text)
    found = find_circle(import_graph(module_files(tmp_path, ["pkg"])))
    assert (found is not None) == circle, found


def test_design_doc_map_is_current() -> None:
    """docs/design.md's picture and module table are generated from the code: regenerate after a change."""
    from scripts.architecture import DESIGN

    assert updated_design(DESIGN.read_text()) == DESIGN.read_text(), "run `python -m scripts.architecture`"


MODULE_LINE_LIMIT = 650
"""One responsibility per module: ~600 lines, with a little slack so a docstring never forces a split."""


def test_no_product_module_outgrows_one_responsibility() -> None:
    big = {
        m: n
        for m, p in module_files(REPO, PACKAGES, NAMESPACE).items()
        if (n := len(p.read_text().splitlines())) > MODULE_LINE_LIMIT
    }
    assert not big, f"modules over {MODULE_LINE_LIMIT} lines (split them by responsibility): {big}"


def test_everything_imports_the_product_through_its_namespace() -> None:
    """`import store` would load a second copy of a module beside `statekeeper.store` (and only works from a
    clone): the product, its tests, benchmarks, examples and scripts import `statekeeper.*` only."""
    folders = [*PACKAGES, "tests", "bench", "examples", "scripts"]
    bare = sorted(
        f"{path.relative_to(REPO)}: {name}"
        for folder in folders
        for path in (REPO / folder).rglob("*.py")
        for name in imported_names("", path)
        if name.split(".")[0] in PACKAGES
    )
    assert not bare, "import through statekeeper.*:\n" + "\n".join(bare)


@pytest.mark.parametrize("package", PACKAGES)
def test_a_second_copy_cannot_be_imported(package: str) -> None:
    """From the repository root the folders are importable as bare names too; each refuses to load as anything but
    `statekeeper.<package>`, so no module ever exists twice (whose exceptions the other copy would not catch)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", f"import {package}"], check=False, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert f"ImportError: import statekeeper.{package}, not {package}" in done.stderr


SUPPORT_IMPORTS = {"bench": {"tests"}, "testkit": {"tests", "bench"}, "tests": {"bench"}}
"""Folders beside the product and the folders they must not import: what tests and benchmarks share is in
`testkit`, which neither feeds; only tests/bench/ reaches bench (the suites it runs are what it tests)."""


def crossing_imports(repo: Path, folder: str, forbidden: set[str], allowed_under: str | None = None) -> list[str]:
    """`path: name` for every import in `folder` of a top-level package in `forbidden` (none under `allowed_under`)."""
    found = []
    for path in sorted((repo / folder).rglob("*.py")):
        rel = path.relative_to(repo)
        if allowed_under is not None and rel.is_relative_to(allowed_under):
            continue
        module = ".".join(rel.with_suffix("").parts)
        found += [f"{rel}: {name}" for name in imported_names(module, path) if name.split(".")[0] in forbidden]
    return found


@pytest.mark.parametrize(("folder", "forbidden"), sorted(SUPPORT_IMPORTS.items()))
def test_tests_and_benchmarks_share_only_testkit(folder: str, forbidden: set[str]) -> None:
    wrong = crossing_imports(REPO, folder, forbidden, allowed_under="tests/bench" if folder == "tests" else None)
    assert not wrong, f"{folder}/ imports {sorted(forbidden)} (move what both need to testkit/):\n" + "\n".join(wrong)


def test_the_check_finds_a_crossing_import(tmp_path: Path) -> None:
    (tmp_path / "bench" / "fleet").mkdir(parents=True)
    (tmp_path / "bench" / "fleet" / "run.py").write_text("def f():\n    from tests.spark import conftest\n")
    (tmp_path / "tests" / "bench").mkdir(parents=True)
    (tmp_path / "tests" / "bench" / "test_run.py").write_text("from bench.fleet import run\n")
    (tmp_path / "tests" / "test_x.py").write_text("import bench.report\n")
    assert crossing_imports(tmp_path, "bench", {"tests"}) == [
        "bench/fleet/run.py: tests.spark.conftest",
        "bench/fleet/run.py: tests.spark",
    ]
    assert crossing_imports(tmp_path, "tests", {"bench"}, allowed_under="tests/bench") == [
        "tests/test_x.py: bench.report"
    ]
