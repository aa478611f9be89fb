"""Offline rescale and rollback of an operator (``statekeeper rescale`` / ``statekeeper rollback``).

Both commit one new version of the operator while its query is stopped (store/rescale.py does the
copy and the atomic commit): a rescale re-lays out the head over a new partition count, moving key
groups by range; a rollback makes a retained older version the head again as a new version (a new
branch of the lineage; later versions stay readable until expiry removes them). They refuse while a
writer looks alive (its driver's heartbeat, ``spark/<operator>/heartbeat/``, or its newest commit record is
younger than ``idle_seconds``; ``force`` overrides),
and hold the maintenance lease of every store they read or write, so no maintenance run expires the
source state under them. A concurrent commit of the same version by a writer makes the exclusive
commit record fail and nothing changes: the copies become orphans for ``clean-orphans``.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from statekeeper.maintenance.fanout import SparkEngine, check_engine
from statekeeper.maintenance.leasing import store_lease
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.sql.layouts import LayoutSpan, layout_rows, layout_spans
from statekeeper.store.commit_log import CommitLog
from statekeeper.store.files import CheckpointFileManager
from statekeeper.store.formats.commit import CommitRecord
from statekeeper.store.layout import StoreId
from statekeeper.store.rescale import (
    RescaleError,
    RescalePlan,
    RescaleResult,
    execute_rescale,
    in_processes,
    plan_rescale,
    plan_rollback,
)
from statekeeper.store.spark.heartbeat import newest_heartbeat
from statekeeper.store.spark.rescale_rules import TypedStateKeys
from statekeeper.store.spark.restart import on_executors

if TYPE_CHECKING:
    from statekeeper.sql.catalog import Catalog

log = logging.getLogger(__name__)

DEFAULT_IDLE_SECONDS = 60.0
"""How long the newest commit must be ago before an offline rescale or rollback starts."""


class RescaleOptions(TypedDict, total=False):
    """What `rescale` and `rollback` share (the CLI's and the Dagster jobs' common settings)."""

    dry_run: bool
    """Plan only: change nothing."""
    idle_seconds: float
    """Refuse while the operator's heartbeat or newest commit record is younger (0: ``--force``)."""
    workers: int
    """New partitions built at once (processes: this one and spawned ones, at most one per CPU)."""
    engine: SparkEngine | None
    """Build the new partitions on this Spark engine's executors instead (one task each)."""
    settings: MaintenanceSettings | None
    catalog: Catalog | None


def check_writer_idle(
    fm: CheckpointFileManager, operator: str, idle_seconds: float, *, now: float | None = None
) -> None:
    """Raise `RescaleError` while a writer of `operator` may be running: its driver's heartbeat
    (store/spark/heartbeat.py) or the newest commit record is younger than `idle_seconds`."""
    now = time.time() if now is None else now
    beat = newest_heartbeat(fm, operator, now=now)
    if beat is not None and beat.age_seconds < idle_seconds:
        raise RescaleError(
            f"the Spark driver of operator {operator!r} is running: its heartbeat {fm.root_uri}/{beat.path} is "
            f"{beat.age_seconds:.0f}s old (< --idle-seconds {idle_seconds:.0f}). Stop the query first; if its "
            "driver was killed, wait or pass --force"
        )
    commits = CommitLog(fm)
    latest = commits.latest()
    record = commits.get(latest) if latest else None
    if record is None:
        return
    age = now - record.created_at
    if age < idle_seconds:
        raise RescaleError(
            f"version {latest} of {fm.root_uri} was committed {age:.0f}s ago (< {idle_seconds:.0f}s): a query may "
            "still be writing. Stop it first, or pass --force (--idle-seconds) if it is stopped"
        )


def execute_leased(
    fm: CheckpointFileManager,
    plan: RescalePlan,
    *,
    settings: MaintenanceSettings | None = None,
    catalog: Catalog | None = None,
    dry_run: bool = False,
    workers: int = 4,
    engine: SparkEngine | None = None,
) -> RescaleResult:
    """Execute `plan` under the maintenance leases of every store it reads or writes: its new partitions
    built on up to `workers` processes here (`in_processes`), or as one Spark job on `engine` (``--engine spark``)."""
    if dry_run:
        return RescaleResult(plan)
    settings = settings or MaintenanceSettings.from_env()
    partitions = max(len(plan.source_ids), plan.target_layout.partitions if plan.target_layout else 0)
    with ExitStack() as leases:
        for p in range(partitions):
            leases.enter_context(store_lease(fm, StoreId(plan.operator, p), settings, catalog))
        runner = on_executors(engine.session()) if engine is not None else in_processes(workers)
        return execute_rescale(fm, plan, rules=TypedStateKeys(), runner=runner)


def _guarded(fm: CheckpointFileManager, plan: RescalePlan, options: RescaleOptions) -> RescaleResult:
    """Check that no writer runs (unless a dry run), then execute `plan` with `options`."""
    dry_run = options.get("dry_run", False)
    if not dry_run:
        check_writer_idle(fm, plan.operator, options.get("idle_seconds", DEFAULT_IDLE_SECONDS))
    return execute_leased(
        fm,
        plan,
        settings=options.get("settings"),
        catalog=options.get("catalog"),
        dry_run=dry_run,
        workers=options.get("workers", 4),
        engine=options.get("engine"),
    )


def rescale(
    fm: CheckpointFileManager,
    operator: str,
    partitions: int,
    *,
    max_key_groups: int | None = None,
    **options: Unpack[RescaleOptions],
) -> RescaleResult:
    """Commit the head of `operator` re-laid out over `partitions` partitions (the query stopped)."""
    plan = plan_rescale(fm, operator, partitions, max_key_groups=max_key_groups, rules=TypedStateKeys())
    if plan.source_layout == plan.target_layout:
        raise RescaleError(f"operator {operator!r} in {fm.root_uri} already has {partitions} partitions")
    return _guarded(fm, plan, options)


def rollback(
    fm: CheckpointFileManager, operator: str, to_version: int, **options: Unpack[RescaleOptions]
) -> RescaleResult:
    """Make retained `to_version` of `operator` the head again, as a new version (the query stopped)."""
    return _guarded(fm, plan_rollback(fm, operator, to_version), options)


def layout_history(records: Mapping[int, CommitRecord]) -> list[LayoutSpan]:
    """Each operator's layouts over the versions of `records` (``statekeeper inspect``; the catalog's
    `Catalog.layouts` folds the same rows)."""
    rows = (row for v, r in records.items() for row in layout_rows(v, r.checkpoint_ids, r.layouts, r.change))
    return layout_spans(rows)


def describe_layouts(spans: list[LayoutSpan]) -> list[str]:
    """Lines for people: versions, partitions x key groups, and how each layout began."""
    return ["layouts (versions: partitions x key groups, how the layout began):"] + [
        f"  {s.operator} {s.first_version}..{s.last_version}: {s.partitions} x {s.max_key_groups or 'legacy'}"
        + (f" ({s.change})" if s.change else "")
        for s in spans
    ]


# -- command line (registered by maintenance.cli) ---------------------------------------------------


def add_commands(
    sub: Any,
    parents: list[argparse.ArgumentParser],
    positive_int: Any,
    emit: Any,
    maybe_catalog: Any,
    file_manager_of: Any,
) -> None:
    """Register ``rescale`` and ``rollback`` (`parents`: the CLI's common and ``--engine`` options); `emit`,
    `maybe_catalog` and `file_manager_of` are the CLI's output, catalog and root helpers."""
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("root", help="checkpoint root: a local path, file:// or s3://bucket/prefix")
    shared.add_argument("--operator", required=True, help="the operator's name")
    shared.add_argument("--dry-run", action="store_true", help="print the plan; change nothing")
    shared.add_argument("--no-catalog", action="store_true", help="leases as host-local lock files")
    shared.add_argument(
        "--workers", type=positive_int, default=4, help="new partitions built at once (processes, at most one per CPU)"
    )
    shared.add_argument(
        "--idle-seconds",
        type=float,
        default=DEFAULT_IDLE_SECONDS,
        help="refuse while the newest commit is younger than this (a writer may be running)",
    )
    shared.add_argument("--force", action="store_true", help="skip the running-writer check")
    p = sub.add_parser("rescale", parents=[*parents, shared], help="change an operator's partition count (offline)")
    p.add_argument("--partitions", type=positive_int, required=True, help="the new partition count")
    p.add_argument("--max-key-groups", type=positive_int, help="key groups of a legacy operator without a layout")
    helpers = {"emit": emit, "maybe_catalog": maybe_catalog, "file_manager_of": file_manager_of}
    p.set_defaults(func=cmd_rescale, **helpers)
    p = sub.add_parser("rollback", parents=[*parents, shared], help="make a retained version the head again")
    p.add_argument("--to-version", type=positive_int, required=True, help="the retained version to restart from")
    p.set_defaults(func=cmd_rollback, **helpers)


def _run(args: argparse.Namespace, run: Callable[[RescaleOptions], RescaleResult]) -> int:
    with args.maybe_catalog(args) as catalog:
        result = run(
            RescaleOptions(
                dry_run=args.dry_run,
                idle_seconds=0.0 if args.force else args.idle_seconds,
                workers=args.workers,
                engine=check_engine(args.engine, args.master),
                catalog=catalog,
            )
        )
    doc = {**result.to_json(), "dry_run": args.dry_run, "plan": result.plan.describe()}
    done = (
        f"\ncommitted version {result.plan.new_version}: {result.records} records copied, {result.deleted} deleted "
        f"in place, {result.bytes_read} bytes read, {result.bytes_written} bytes of changelogs written in "
        f"{result.seconds:.2f}s; {result.relayed} of {result.plan.partitions} new partitions relayed from the old "
        "partitions' changelogs, the rest copied from loaded ones"
    )
    args.emit(args, doc, lambda: result.plan.describe() + ("" if args.dry_run else done))
    return 0


def cmd_rescale(args: argparse.Namespace) -> int:
    return _run(
        args,
        lambda options: rescale(
            args.file_manager_of(args), args.operator, args.partitions, max_key_groups=args.max_key_groups, **options
        ),
    )


def cmd_rollback(args: argparse.Namespace) -> int:
    return _run(args, lambda options: rollback(args.file_manager_of(args), args.operator, args.to_version, **options))


__all__ = [
    "RescaleOptions",
    "add_commands",
    "check_writer_idle",
    "describe_layouts",
    "execute_leased",
    "layout_history",
    "rescale",
    "rollback",
]
