"""The documentation's code runs: every code block of README.md and docs/*.md that is meant to run, the
`TwsTester` docstring's example, and the two commands' prerequisites.

A ```python, ```sh or ```bash block runs unless the line before it says why not: ``<!-- not run: reason -->``
(a placeholder root, an S3 bucket, a command that runs for minutes). The runnable Python blocks of one document run
in order in one interpreter sharing one namespace, as a reader reads them top to bottom (a block may use what an
earlier one defined; Spark's session is started once), in a temporary directory with a catalog of their own.
"""

from __future__ import annotations

import doctest
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUNNABLE = {"python": "python", "py": "python", "sh": "sh", "bash": "sh", "shell": "sh", "console": "sh"}
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(?P<reason>\S.*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<fence>`{3,})(?P<info>[^`]*)$")


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int
    """The fence's line (1-based)."""
    language: str
    """"python" or "sh" (what runs it); "" for any other block (json, mermaid, plain text)."""
    source: str
    not_run: str | None
    """Why the block does not run (its marker), or None."""

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"


def blocks(doc: Path) -> list[Block]:
    """The fenced code blocks of `doc`, with their language and not-run marker."""
    found: list[Block] = []
    lines = doc.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m.group("fence"), m.group("info").strip().split()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith(fence)), len(lines))
        marker = NOT_RUN.match(lines[i - 1]) if i else None
        found.append(
            Block(
                doc,
                i + 1,
                RUNNABLE.get(info[0].lower(), "") if info else "",
                "\n".join(lines[i + 1 : end]) + "\n",
                marker.group("reason") if marker else None,
            )
        )
        i = end + 1
    return found


def runnable(doc: Path, language: str) -> list[Block]:
    return [b for b in blocks(doc) if b.language == language and b.not_run is None]


def test_every_code_block_runs_or_says_why_not() -> None:
    every = [b for doc in DOCS for b in blocks(doc)]
    code = [b for b in every if b.language]
    assert len(code) >= 10, [b.where for b in every]
    markers = [b.where for b in every if b.not_run is not None and not b.language]
    assert not markers, f"a not-run marker before a block that would not run anyway: {markers}"
    assert len(runnable(REPO / "README.md", "python")) >= 4, "README.md's Python examples run"
    for doc in DOCS:
        stray = [n + 1 for n, line in enumerate(doc.read_text().splitlines()) if "not run" in line and "<!--" in line]
        marked = {b.line - 1 for b in blocks(doc) if b.not_run is not None}
        assert set(stray) <= marked, f"{doc.name}: a not-run marker not right before a code block, lines {stray}"


RUNNER = """
import json, sys
for where, source in json.load(open(sys.argv[1])):
    print(f"--- {where}", flush=True)
    exec(compile(source, where, "exec"), globals())
print("--- all ran", flush=True)
"""
"""Runs a document's blocks in order in one namespace, each compiled under its document and line."""


def _environment(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STATEKEEPER_")}
    env.update(
        {
            "STATEKEEPER_HOME": str(tmp_path / "home"),
            "STATEKEEPER_SPARK_LOCAL_DIR": str(tmp_path / "spark-local"),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        }
    )
    env.pop("PYTHONPATH", None)  # the installed product, as a reader has it; not this checkout's tests
    return env


def _run_python(doc: Path, tmp_path: Path, timeout: float) -> None:
    todo = runnable(doc, "python")
    work = tmp_path / "work"
    work.mkdir()
    (work / "blocks.json").write_text(json.dumps([[b.where, b.source] for b in todo]))
    (work / "runner.py").write_text(RUNNER)
    done = subprocess.run(
        [sys.executable, "runner.py", "blocks.json"],
        cwd=work,
        env=_environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0 and "--- all ran" in done.stdout, (
        f"{doc.name}: exit {done.returncode}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-6000:]}"
    )


SPARK_DOCS = [d for d in DOCS if any("pyspark" in b.source or "store.spark" in b.source for b in runnable(d, "python"))]
PLAIN_DOCS = [d for d in DOCS if runnable(d, "python") and d not in SPARK_DOCS]


@pytest.mark.parametrize("doc", PLAIN_DOCS, ids=lambda d: d.name)
def test_the_python_blocks_run(doc: Path, tmp_path: Path) -> None:
    _run_python(doc, tmp_path, timeout=120)


@pytest.mark.parametrize("doc", SPARK_DOCS, ids=lambda d: d.name)
def test_the_python_blocks_with_spark_run(doc: Path, tmp_path: Path) -> None:
    """One Spark session for all of a document's blocks (`SparkSession.builder.getOrCreate` reuses it)."""
    _run_python(doc, tmp_path, timeout=600)


@pytest.mark.parametrize("block", [b for d in DOCS for b in runnable(d, "sh")], ids=lambda b: f"{b.doc.name}:{b.line}")
def test_the_shell_blocks_run(block: Block, tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.source],
        cwd=tmp_path,
        env=_environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{block.where}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


def test_the_twstester_docstring_example_runs() -> None:
    from statekeeper.store.spark import testing

    result = doctest.testmod(testing, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 3 and result.failed == 0, result


# -- the two commands -------------------------------------------------------------------------------


def _path_without_node(tmp_path: Path) -> str:
    """A PATH with what `make run` needs (python, java, the shell tools) and no node or npm."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "env", "sed", "head", "java", "make", "dirname", "cat"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    (bin_dir / "python3").symlink_to(sys.executable)
    return str(bin_dir)


def test_make_run_needs_no_node(tmp_path: Path) -> None:
    if shutil.which("java") is None:
        pytest.skip("java is a prerequisite of both commands")
    path = _path_without_node(tmp_path)
    check = str(REPO / "scripts" / "check-prereqs.sh")
    env = {"PATH": path, "HOME": str(tmp_path)}
    run = subprocess.run([str(check), "--for", "run", "python3"], env=env, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    test = subprocess.run(
        [str(check), "--for", "test", "python3"], env=env, capture_output=True, text=True, check=False
    )
    assert test.returncode == 1 and "node/npm not found" in test.stderr, test.stderr
    dry = subprocess.run(["make", "-n", "run"], cwd=REPO, env=env, capture_output=True, text=True, check=False)
    assert "--for run" in dry.stdout and "--for test" not in dry.stdout, dry.stdout + dry.stderr


def test_the_install_shows_its_progress() -> None:
    makefile = (REPO / "Makefile").read_text()
    installs = [line for line in makefile.splitlines() if "pip install" in line and not line.lstrip().startswith("#")]
    assert installs and not [line for line in installs if " -q" in line], installs


def test_what_make_run_runs_is_what_the_docstrings_say() -> None:
    from statekeeper.orchestration import run_local
    from statekeeper.store import demo

    recipe = (REPO / "Makefile").read_text().split("\nrun:", 1)[1].split("\n\n", 1)[0]
    assert "examples/session_count.py" in recipe and "statekeeper.orchestration.run_local" in recipe
    assert "examples/session_count.py" in (run_local.__doc__ or "")
    assert "statekeeper.store.demo" not in (run_local.__doc__ or "")
    assert "what `make run` runs" not in (demo.__doc__ or "") and "without Spark" in (demo.__doc__ or "")
