"""The real thing: `make run`'s launcher starts `dagster dev` on 127.0.0.1 beside a main job; headless
Chromium (Debian's, driven by Playwright) sees the assets, launches a materialization from the UI,
and the run succeeds; Ctrl-C then stops every process.

Chromium is installed by scripts/ensure-chromium.sh when missing (apt-get), so this runs in CI.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from statekeeper.sql import Catalog
from tests.orchestration.helpers import CheckpointWriter, free_port

REPO = Path(__file__).resolve().parents[2]
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
RUNS_QUERY = "{ runsOrError { ... on Runs { results { runId status tags { key value } } } } }"


@pytest.fixture(scope="session")
def chromium() -> str:
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "ensure-chromium.sh")], check=True, capture_output=True, text=True, timeout=900
    )
    path = out.stdout.strip().splitlines()[-1]
    assert os.access(path, os.X_OK), out.stderr
    return path


class Launcher:
    """`python -m statekeeper.orchestration.run_local` in the background, its output read line by line."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "statekeeper.orchestration.run_local", *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line)

    def wait_for(self, text: str, timeout: float) -> str:
        """The first output line (seen so far or later) containing `text`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.output):
                if text in line:
                    return line
            assert self.proc.poll() is None or not self.lines.empty(), "".join(self.output)
            time.sleep(0.5)
        raise AssertionError(f"no {text!r} within {timeout}s:\n{''.join(self.output)}")

    def descendants(self) -> list[psutil.Process]:
        try:
            return list(psutil.Process(self.proc.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            return []

    def stop(self, sig: signal.Signals = signal.SIGINT, timeout: float = 120) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.wait(timeout)

    def wait(self, timeout: float) -> int:
        """The exit status, once the process ended and all its output was read."""
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code


def launcher_env(tmp_path: Path, root: Path) -> dict[str, str]:
    return {
        **os.environ,
        "STATEKEEPER_CHECKPOINT_ROOTS": str(root),
        "STATEKEEPER_DB_URL": f"sqlite:///{tmp_path / 'catalog.db'}",
        "STATEKEEPER_EXPIRY_SCHEDULE": "off",
        "STATEKEEPER_ORPHAN_SCHEDULE": "off",
        "STATEKEEPER_SNAPSHOT_THRESHOLD": "50",
        "STATEKEEPER_WORK_DIR": str(tmp_path / "work"),
        "RUN_SECONDS": "",
    }


THRESHOLD = 3
PRE_WRITTEN = 7
"""Commits before Dagster starts: a chain past twice `THRESHOLD` when the sensor's first tick sees it."""


def shared_env(tmp_path: Path, root: Path) -> dict[str, str]:
    """`launcher_env` with chains the sensor snapshots at once (threshold 3, ticks every 2 s), no expiry (every
    version retained) and no verification run: the only runs are the sensor's snapshot run and the UI's."""
    return {
        **launcher_env(tmp_path, root),
        "STATEKEEPER_SNAPSHOT_THRESHOLD": str(THRESHOLD),
        "STATEKEEPER_MIN_VERSIONS_TO_RETAIN": "1000",
        "STATEKEEPER_SENSOR_INTERVAL_SECONDS": "2",
        "STATEKEEPER_VERIFY_SCHEDULE": "off",
    }


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Launcher, Path]]:
    """One `dagster dev` (and main job) for the module's tests: starting it is most of their cost."""
    tmp_path = tmp_path_factory.mktemp("ui")
    root = tmp_path / "ckpt"
    with CheckpointWriter(str(root)) as writer:
        writer.commit(PRE_WRITTEN)
    main_job = [sys.executable, "-m", "tests.orchestration.helpers", str(root), "2"]
    args = ["--dagster-home", str(tmp_path / "dagster_home"), "--port", str(free_port()), "--", *main_job]
    launcher = Launcher(args, shared_env(tmp_path, root))
    try:
        yield launcher, root
    finally:
        if launcher.proc.poll() is None:
            launcher.stop(signal.SIGTERM)
        for p in launcher.descendants():
            p.kill()


TRIGGER = "statekeeper/trigger"


def tags_of(run: dict[str, Any]) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["tags"]}


def graphql(url: str, query: str) -> Any:
    req = urllib.request.Request(
        f"{url}/graphql", data=json.dumps({"query": query}).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.load(resp)["data"]


LOGS_QUERY = '{ logsForRun(runId: "%s") { ... on EventConnection { events { ... on MessageEvent { message } } } } }'


def sensor_run(url: str, timeout: float) -> dict[str, Any]:
    """The checkpoint sensor's first run, once it finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = [r for r in graphql(url, RUNS_QUERY)["runsOrError"]["results"] if tags_of(r).get(TRIGGER)]
        if runs and runs[-1]["status"] in ("SUCCESS", "FAILURE", "CANCELED"):
            return dict(runs[-1])
        time.sleep(2)
    raise AssertionError("the sensor's snapshot run did not finish in time")


def logged_chains(url: str, run_id: str) -> tuple[int, int]:
    """(before, after) as the run's log line states them."""
    events = graphql(url, LOGS_QUERY % run_id)["logsForRun"]["events"]
    line = next(e["message"] for e in events if "max_chain_length_before: " in (e.get("message") or ""))
    before = line.split("max_chain_length_before: ", 1)[1].split(",")[0]
    after = line.split("max_chain_length_after: ", 1)[1].split()[0]
    return int(before), int(after)


def metadata_row(page: Any, key: str) -> str:
    """The text of the metadata table row of `key` on the page (its key and its value)."""
    row = page.locator("tr").filter(has=page.get_by_text(key, exact=True)).first
    row.wait_for()
    return str(row.inner_text())


def row_value(text: str, key: str) -> int:
    return int(text.replace(key, "").strip().replace(",", "").split()[0])


def test_the_asset_pages_show_the_runs_own_numbers(launched: tuple[Launcher, Path], chromium: str) -> None:
    """Issue 63: the snapshot run the sensor requested found chains past twice the threshold. Its asset page shows
    the chains before and after it as its log states them, its bounded check failed, and lineage_catalog shows the
    sensor's catalog sync (not "Never materialized") with the chains the catalog held."""
    from playwright.sync_api import sync_playwright

    launcher, root = launched
    line = launcher.wait_for("Dagster UI: ", timeout=300)
    url = line.split("Dagster UI: ", 1)[1].split()[0]
    launcher.wait_for("main job finished with status 0", timeout=120)
    run = sensor_run(url, timeout=300)
    assert run["status"] == "SUCCESS", run
    before, after = logged_chains(url, run["runId"])
    assert before > 2 * THRESHOLD and after == 0, (before, after)
    with Catalog.open(f"sqlite:///{root.parent / 'catalog.db'}") as catalog:
        committed = len(catalog.committed_versions(root.resolve().as_uri(), "agg", 0))

    with tempfile.TemporaryDirectory(prefix="sk-chromium-") as profile, sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(
            profile,
            executable_path=chromium,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1400, "height": 900},
        )
        page = browser.new_page()
        page.set_default_timeout(120_000)
        try:
            page.goto(f"{url}/assets/state_snapshots?view=events", wait_until="domcontentloaded")
            page.get_by_text(run["runId"][:8]).first.wait_for()
            shown_before = metadata_row(page, "max_chain_length_before")
            shown_after = metadata_row(page, "max_chain_length_after")
            assert row_value(shown_before, "max_chain_length_before") == before, shown_before
            assert row_value(shown_after, "max_chain_length_after") == after, shown_after
            seconds = metadata_row(page, "seconds")
            assert len(seconds.replace("seconds", "").strip().split()[0].partition(".")[2]) <= 2, seconds

            page.goto(f"{url}/assets/state_snapshots?view=checks", wait_until="domcontentloaded")
            # the check list shows the bounded check failed; its latest evaluation names what the run found
            page.wait_for_function("() => /chains_within_twice_threshold\\s*Failed/.test(document.body.innerText)")
            page.get_by_text("chains_within_twice_threshold", exact=True).first.click()
            page.wait_for_function("() => /Evaluation result\\s*Failed/.test(document.body.innerText)")
            found = metadata_row(page, "max_chain_length_before")
            assert row_value(found, "max_chain_length_before") == before, found

            page.goto(f"{url}/assets/lineage_catalog?view=events", wait_until="domcontentloaded")
            page.get_by_text("checkpoint_sensor").first.wait_for()
            assert page.get_by_text("Never materialized").count() == 0
            shown = metadata_row(page, "max_chain_length")
            assert row_value(shown, "max_chain_length") == committed == before, shown
        except Exception:
            page.screenshot(path=str(root.parent / "ui-failure.png"), full_page=True)
            (root.parent / "ui-failure.html").write_text(page.content())
            raise
        finally:
            browser.close()


def test_ui_launches_a_materialization_that_succeeds(launched: tuple[Launcher, Path], chromium: str) -> None:
    from playwright.sync_api import sync_playwright

    launcher, root = launched
    line = launcher.wait_for("Dagster UI: ", timeout=300)
    url = line.split("Dagster UI: ", 1)[1].split()[0]
    assert url.startswith("http://127.0.0.1:")
    launcher.wait_for("main job finished with status 0", timeout=120)
    tree = launcher.descendants()
    assert len(tree) >= 3  # dagster dev and its webserver, daemon and code server

    with tempfile.TemporaryDirectory(prefix="sk-chromium-") as profile, sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(
            profile,
            executable_path=chromium,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1400, "height": 900},
        )
        try:
            page = browser.new_page()
            page.set_default_timeout(120_000)
            # the assets of the code location are listed
            page.goto(f"{url}/assets", wait_until="domcontentloaded")
            for name in ("lineage_catalog", "state_snapshots", "retained_versions", "orphan_cleanup"):
                page.get_by_text(name, exact=True).first.wait_for()
            # launch a materialization of the lineage asset for the (only) checkpoint root
            page.goto(f"{url}/assets/lineage_catalog", wait_until="domcontentloaded")
            page.get_by_role("button", name="Materialize").first.click()
            page.get_by_text("Launch runs to materialize lineage_catalog").wait_for()
            page.get_by_role("button", name="All", exact=True).click()
            page.get_by_role("button", name="Launch 1 run").click()

            # the run goes through the queue (one run per root) and succeeds
            deadline = time.monotonic() + 300
            run: dict[str, Any] | None = None
            while time.monotonic() < deadline:
                runs = [r for r in graphql(url, RUNS_QUERY)["runsOrError"]["results"] if not tags_of(r).get(TRIGGER)]
                if runs and runs[0]["status"] in ("SUCCESS", "FAILURE", "CANCELED"):  # the UI's (not the sensor's)
                    run = runs[0]
                    break
                time.sleep(2)
            assert run is not None, "the run did not finish in time"
            assert run["status"] == "SUCCESS", run
            tags = tags_of(run)
            assert tags["dagster/partition"] == root.resolve().as_uri()
            # and the UI shows it
            page.goto(f"{url}/runs/{run['runId']}", wait_until="domcontentloaded")
            page.get_by_text("Success", exact=True).first.wait_for()
            # the materialization's metadata (plotted numbers and the table of stores) on the asset's events
            page.goto(f"{url}/assets/lineage_catalog?view=events", wait_until="domcontentloaded")
            page.get_by_text(run["runId"][:8]).first.wait_for()
            page.get_by_text("max_chain_length", exact=True).first.wait_for()
            page.get_by_text("latest_checkpoint_id", exact=True).first.wait_for()
        finally:
            browser.close()

    # the materialization recorded its maintenance run with the Dagster run id
    with Catalog.open(f"sqlite:///{root.parent / 'catalog.db'}") as catalog:
        rows = [r for r in catalog.runs(root.resolve().as_uri()) if r.orchestrator_run_id == run["runId"]]
        assert [r.status for r in rows] == ["succeeded"]
        assert len(catalog.committed_versions(root.resolve().as_uri(), "agg", 0)) >= 3

    # Ctrl-C stops everything it started
    assert launcher.stop(signal.SIGINT) == 0
    assert "stopped" in "".join(launcher.output)
    time.sleep(1)
    assert [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []


def test_run_seconds_stops_by_itself(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    env = {**launcher_env(tmp_path, root), "RUN_SECONDS": "3"}
    launcher = Launcher(["--dagster-home", str(tmp_path / "home"), "--port", str(free_port())], env)
    try:
        launcher.wait_for("starting Dagster", timeout=60)
        time.sleep(1.5)
        tree = launcher.descendants()
        assert tree, "dagster dev is running"
        assert launcher.wait(timeout=120) == 0
        out = "".join(launcher.output)
        assert "RUN_SECONDS=3 elapsed: stopping" in out and "stopped" in out
        time.sleep(1)
        assert [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
    finally:
        if launcher.proc.poll() is None:
            launcher.stop(signal.SIGTERM)
