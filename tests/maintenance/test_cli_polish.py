"""The `statekeeper` command line's manners: a mistake exits 2 naming itself before any work, a closed pipe ends it
quietly, each problem is said once, help shows what a command reads, a core-only install gets one line.

Most run the entry point in this process (cheap); what needs a real process (a pipe into ``head``, stderr's log,
an install without an extra) runs the console script.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cli_support import ROOT, run_cli
from tests.maintenance.helpers import History, all_files, clobber

STATEKEEPER = str(Path(sys.executable).parent / "statekeeper")
"""The console script `pip install` made, as a user runs it."""


@pytest.fixture
def cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., tuple[int, str, str]]]:
    """The command line in this process: (exit code, stdout, stderr), with an embedded catalog of the test's."""
    from statekeeper.maintenance.cli import main

    monkeypatch.setenv("STATEKEEPER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("STATEKEEPER_DB_URL", raising=False)

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse: --help, usage errors
            code = int(e.code or 0)
        out = capsys.readouterr()
        return code, out.out, out.err

    yield run


def _script(*args: str, home: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "STATEKEEPER_HOME": str(home), **(env or {})}
    full_env.pop("STATEKEEPER_DB_URL", None)
    return subprocess.run(
        args, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=120, check=False, shell=False
    )


def test_a_bad_variable_exits_2_naming_it_before_any_work(
    make_local_history: Callable[..., History],
    cli: Callable[..., tuple[int, str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = make_local_history()
    h.batches(3)
    before = all_files(h.root)
    commands = [
        ("inspect", h.root),
        ("expire", h.root, "--retain", "1", "--grace", "0", "--no-catalog"),
        ("maintain", h.root, "--cycles", "1", "--every", "0", "--retain", "1", "--grace", "0", "--no-catalog"),
        ("runs",),
    ]
    for variable, value in [
        ("STATEKEEPER_MEMORY_MB", "abc"),
        ("STATEKEEPER_MEMORY_MB", "1"),
        ("STATEKEEPER_PARALLELISM", "abc"),
        ("STATEKEEPER_PARALLELISM", "0"),
    ]:
        with monkeypatch.context() as env:
            env.setenv(variable, value)
            for command in commands:
                code, out, err = cli(*command)
                assert code == 2, (variable, value, command, out, err)
                assert variable in err, (variable, command, err)
    assert all_files(h.root) == before
    assert cli("inspect", h.root)[0] == 0
    with monkeypatch.context() as env:  # an S3 root's settings, checked before any request
        env.setenv("STATEKEEPER_S3_MAX_ATTEMPTS", "many")
        code, _, err = cli("inspect", "s3://no-such-bucket/q1")
        assert code == 2 and "STATEKEEPER_S3_MAX_ATTEMPTS" in err, err


def test_json_piped_into_head_ends_quietly(make_local_history: Callable[..., History], tmp_path: Path) -> None:
    h = make_local_history()
    h.batches(1)
    top = Path(h.fm.root_path)  # type: ignore[attr-defined]
    for i in range(1500):  # someone else's files: a warning each, ~150 KB of JSON, more than a pipe holds
        (top / f"note-{i:04d}.txt").write_text("x")
    err = tmp_path / "stderr"
    pipeline = f"'{STATEKEEPER}' inspect '{h.root}' --json 2>'{err}' | head -1; echo \"exit ${{PIPESTATUS[0]}}\""
    done = _script("bash", "-c", pipeline, home=tmp_path / "home")
    assert done.stdout.splitlines() == ["{", "exit 141"], done.stdout
    assert err.read_text() == ""


def test_a_folder_above_the_root_names_the_root(
    make_local_history: Callable[..., History], cli: Callable[..., tuple[int, str, str]]
) -> None:
    h = make_local_history()
    h.batches(2)
    parent = h.root.rsplit("/", 1)[0]
    for command in ("inspect", "expire", "snapshot"):
        code, out, err = cli(command, parent, "--no-catalog")
        assert code == 2, (command, out, err)
        assert f"checkpoint root(s) below it: {h.fm.root_uri}" in err, err
    assert cli("inspect", h.root)[0] == 0


def test_an_unknown_store_or_operator_is_named(
    make_local_history: Callable[..., History], cli: Callable[..., tuple[int, str, str]]
) -> None:
    h = make_local_history()
    h.batches(2)
    code, out, err = cli("inspect", h.root, "--store", "agg/99", "--store", "agg/1")
    assert code == 2 and "no store agg/99" in err and "agg/0-1" in err, (code, out, err)
    code, _, err = cli("verify", h.root, "--store", "nope/0", "--no-catalog")
    assert code == 2 and "no store nope/0" in err, err
    for command in (("rescale", "--partitions", "3"), ("rollback", "--to-version", "1")):
        code, _, err = cli(command[0], h.root, "--operator", "nope", *command[1:], "--force", "--no-catalog")
        assert code == 2 and "no operator 'nope'" in err and "operators: agg" in err, err
    # The operator is there but records no key-group count: the error names the command's flag.
    code, _, err = cli("rescale", h.root, "--operator", "agg", "--partitions", "3", "--force", "--dry-run")
    assert code == 2 and "pass --max-key-groups" in err and "max_key_groups" not in err, err


def test_help_lists_only_the_flags_a_command_reads(
    make_local_history: Callable[..., History], cli: Callable[..., tuple[int, str, str]]
) -> None:
    def flags(command: str) -> set[str]:
        code, out, _ = cli(command, "--help")
        assert code == 0
        return {word.strip("[],") for word in out.split() if word.startswith(("--", "[--"))}

    snapshot_only = {"--threshold", "--snapshot-spread", "--snapshot-schedule", "--round-seconds"}
    deleting = {"--delete-batch-size"}
    leasing = {"--lease-ttl", "--lease-timeout", "--work-dir"}
    assert {"--store", "--retain", "--grace", "--load-grace", "--parallelism"} <= flags("inspect")
    assert not flags("inspect") & (snapshot_only | deleting | leasing | {"--no-catalog", "--catalog-history"})
    assert "--no-catalog" in flags("verify") and not flags("verify") & (snapshot_only | deleting | leasing)
    assert snapshot_only | leasing <= flags("snapshot") and not flags("snapshot") & deleting
    assert deleting | leasing | {"--catalog-history"} <= flags("expire") and not flags("expire") & snapshot_only
    assert not flags("clean-orphans") & (snapshot_only | {"--catalog-history"})
    assert snapshot_only | deleting | leasing | {"--catalog-history", "--build-processes"} <= flags("maintain")
    # A script passing one set of options to every command still runs: unread flags are accepted.
    h = make_local_history()
    h.batches(1)
    code, _, err = cli("inspect", h.root, "--threshold", "4", "--no-catalog", "--delete-batch-size", "10")
    assert code == 0, err


def test_text_has_no_none_and_no_markup(
    make_local_history: Callable[..., History], cli: Callable[..., tuple[int, str, str]], tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out, err = cli("inspect", str(empty))
    assert code == 0 and "no commit records" in out and "None" not in out, (out, err)
    h = make_local_history()
    h.batches(2)
    code, out, _ = cli("inspect", h.root, "--store", "agg/0", "--version", "2")
    assert code == 0 and "no base snapshot" in out and "None" not in out, out
    assert cli("catalog", "sync", h.root)[0] == 0
    code, out, _ = cli("catalog", "files", h.root, "--store", "agg/0", "--version", "2")
    assert code == 0 and "no base snapshot" in out and "None" not in out, out
    code, out, _ = cli("catalog", "retention", h.root, "--retain", "1")
    assert code == 0 and "`" not in out and "None" not in out, out


def test_each_problem_is_said_once(make_local_history: Callable[..., History], tmp_path: Path) -> None:
    h = make_local_history()
    h.batches(2)
    clobber(h.root, "notes.txt", b"foreign")
    done = run_cli("expire", h.root, "--no-catalog", home=tmp_path / "home")
    assert (done.stdout + done.stderr).count("notes.txt") == 1, (done.stdout, done.stderr)
    assert "1 warning(s)" in done.stdout and "notes.txt" in done.stderr


def test_a_core_only_install_says_which_extra_without_a_traceback(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\nsys.modules['sqlalchemy'] = None  # as if statekeeper[maintenance] were not installed\n"
    )
    done = _script(STATEKEEPER, "inspect", str(tmp_path), home=tmp_path / "home", env={"PYTHONPATH": str(site)})
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and "pip install 'statekeeper[maintenance]'" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
