"""The `statekeeper` commands: each turns parsed arguments into one maintenance operation or catalog query.

The parser (`statekeeper.maintenance.cli`) only knows the arguments; this module knows what they mean
(settings, the catalog to record runs in, progress bars) and calls the operations, which live in their
own modules and know nothing of a command line. What a command prints goes through
`statekeeper.maintenance.cli_output`.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from statekeeper.maintenance.cli_output import (
    EXIT_ERRORS,
    EXIT_OK,
    UsageError,
    emit,
    listed,
    log_problems,
    report_out,
    row_limit,
    table,
)
from statekeeper.store.layout import StoreId

if TYPE_CHECKING:
    from statekeeper.maintenance.reports import Report
    from statekeeper.maintenance.settings import MaintenanceSettings
    from statekeeper.sql.catalog import Catalog
    from statekeeper.store.files import CheckpointFileManager

log = logging.getLogger("statekeeper")  # as the command's printed problems (cli_output), shown at every verbosity


# -- what the arguments mean ------------------------------------------------------------------------


def settings_of(args: argparse.Namespace) -> MaintenanceSettings:
    """The maintenance settings: the command's options over the ``STATEKEEPER_<SETTING>`` environment (made once
    per command, when `statekeeper.maintenance.cli_checks` checks the environment at the start)."""
    from statekeeper.maintenance.settings import MaintenanceSettings

    made = vars(args).get("_settings")
    if isinstance(made, MaintenanceSettings):
        return made
    settings = MaintenanceSettings.from_env(
        snapshot_threshold=getattr(args, "threshold", None),
        snapshot_spread=getattr(args, "snapshot_spread", None),
        snapshot_schedule=getattr(args, "snapshot_schedule", None),
        snapshot_round_seconds=getattr(args, "round_seconds", None),
        min_versions_to_retain=getattr(args, "retain", None),
        orphan_grace_seconds=getattr(args, "grace", None),
        load_grace_seconds=getattr(args, "load_grace", None),
        parallelism=getattr(args, "parallelism", None),
        build_processes=getattr(args, "build_processes", None),
        lease_ttl_seconds=getattr(args, "lease_ttl", None),
        lease_timeout_seconds=getattr(args, "lease_timeout", None),
        work_dir=getattr(args, "work_dir", None),
        delete_batch_size=getattr(args, "delete_batch_size", None),
        catalog_history_seconds=getattr(args, "catalog_history", None),
    )
    args._settings = settings
    return settings


def file_manager_of(args: argparse.Namespace, root: str | None = None) -> CheckpointFileManager:
    """The file manager of `root` (default: the command's ``root``), opened once per command: the checks before
    it and the command itself share it."""
    from statekeeper.store.files import open_file_manager

    opened: dict[str, CheckpointFileManager] = vars(args).setdefault("_file_managers", {})
    name = args.root if root is None else root
    if name not in opened:
        opened[name] = open_file_manager(name)
    return opened[name]


def db_url(args: argparse.Namespace) -> str:
    """``--db``, else ``STATEKEEPER_DB_URL``, else the catalog the root's deployment recorded, else the embedded
    default (`statekeeper.maintenance.deployment.chosen_catalog`); unless given by ``--db``, one stderr line says
    which."""
    from statekeeper.maintenance.deployment import chosen_catalog
    from statekeeper.sql.db import normalize_url

    roots = [args.root] if getattr(args, "root", None) else list(getattr(args, "roots", None) or [])
    url, source = chosen_catalog(args.db, (file_manager_of(args, r) for r in roots))
    if not args.db:
        sys.stderr.write(f"statekeeper: catalog {normalize_url(url).render_as_string(hide_password=True)} ({source})\n")
    return url


@contextmanager
def open_catalog(args: argparse.Namespace) -> Iterator[Catalog]:
    """The catalog, closed after use; the embedded SQLite default is migrated on first use, a server database is not."""
    from statekeeper.sql.catalog import Catalog
    from statekeeper.sql.db import normalize_url

    url = db_url(args)
    auto = normalize_url(url).get_backend_name() == "sqlite" and not args.db
    catalog = Catalog.open(url, upgrade=auto)
    try:
        yield catalog
    finally:
        catalog.close()


@contextmanager
def maybe_catalog(args: argparse.Namespace) -> Iterator[Catalog | None]:
    """:func:`open_catalog`, or None with ``--no-catalog``."""
    if getattr(args, "no_catalog", False):
        yield None
        return
    with open_catalog(args) as catalog:
        yield catalog


def show_progress(args: argparse.Namespace) -> bool:
    """Progress bars: as ``--progress`` / ``--no-progress`` say, else when stderr is a terminal."""
    chosen = getattr(args, "progress", None)
    return bool(sys.stderr.isatty()) if chosen is None else bool(chosen)


def catalog_root(args: argparse.Namespace) -> str:
    """The root's URI as the catalog names it (`normalize_root_uri`)."""
    from statekeeper.store.files import normalize_root_uri

    return normalize_root_uri(args.root)


# -- maintenance operations -------------------------------------------------------------------------


def cmd_inspect(args: argparse.Namespace) -> int:
    from statekeeper.maintenance.inventory import Inventory
    from statekeeper.maintenance.plan import plan_root

    settings = settings_of(args)
    fm, progress = file_manager_of(args), show_progress(args)
    inv = Inventory.scan(fm, parallelism=settings.parallelism, progress=progress, stores=args.stores)
    plan = plan_root(inv, settings, all_stores=args.stores is None)
    rows = []
    problems = list(plan.problems)
    warnings = list(plan.warnings)
    for s, p in plan.stores.items():
        if args.stores and s not in args.stores:
            continue
        files = inv.files_of(s)
        rows.append(
            {
                "store": str(s),
                "latest": p.latest,
                "retain_from": p.retain_from,
                "base": p.base[0] if p.base else None,
                "snapshot": p.snapshot[0] if p.snapshot else None,
                "chain": p.chain_length,
                "changelogs": len(files.changelogs),
                "snapshots": len(files.manifests),
                "ssts": len(files.ssts),
                "bytes": sum(e.size for e in files.entries()),
                "expired": len(p.expired),
                "orphans": len(p.orphans),
                "in_flight": len(p.in_flight),
                "problems": p.problem_count,
            }
        )
        problems += p.problems
    from statekeeper.maintenance.offline_rescale import describe_layouts, layout_history

    layouts = layout_history(inv.records)
    doc: dict[str, Any] = {
        **inv.summary(),
        "floor": plan.floor,
        "layouts": [s.to_json() for s in layouts],
        "stores": rows,
        "problems": problems,
        "warnings": warnings,
    }
    if args.version is not None:
        if not args.stores or len(args.stores) != 1:
            raise UsageError("--version needs exactly one --store")
        doc["version_files"] = _version_files(inv, plan.stores.get(args.stores[0]), args.stores[0], args.version)

    def text() -> str:
        records = (
            "no commit records"
            if inv.oldest_record is None
            else f"commit records from version {inv.oldest_record} (floor {plan.floor})"
        )
        out = [
            f"{inv.root_uri}: latest version {inv.latest}, {len(rows)} store(s), {records}",
            table(rows, limit=row_limit(args)),
        ]
        if any(s.change for s in layouts):
            out += describe_layouts(layouts)
        if "version_files" in doc:
            vf = doc["version_files"]
            base = f"base snapshot {vf['snapshot_version']}" if vf["snapshot_version"] else "no base snapshot"
            out.append(f"version {args.version} of {args.stores[0]} ({base}):")
            out.append(table(vf["files"], limit=None))
        out += listed("problems:", problems, None)
        out += listed("warnings (someone else's files; left alone, not a failure):", warnings, row_limit(args))
        return "\n".join(out)

    emit(args, doc, text)
    return EXIT_ERRORS if problems else EXIT_OK


def _version_files(inv: Any, plan: Any, store: StoreId, version: int) -> dict[str, Any]:
    if plan is None or version not in plan.committed:
        raise UsageError(f"version {version} of store {store} is not committed (or its commit record was expired)")
    base = plan.base_for(version)
    files = inv.files_of(store)
    rows: list[dict[str, Any]] = []
    if base:
        cid = plan.committed[base]
        m = files.manifests[(base, cid)]
        rows.append({"path": m.path, "kind": m.kind, "version": base, "bytes": m.size})
        for sst in files.manifest_data[(base, cid)].sst_files:
            e = files.ssts.get(sst.remote_name)
            rows.append(
                {"path": store.sst(sst.remote_name), "kind": "sst", "version": None, "bytes": e.size if e else None}
            )
    previous = base  # over the committed versions, not every integer: a record's version is a claim (10**12)
    for v in sorted(u for u in plan.committed if base < u <= version):
        if v > previous + 1:
            gap = f"(no commit record names versions {previous + 1}..{v - 1})"
            rows.append({"path": gap, "kind": "changelog", "version": previous + 1, "bytes": None})
        previous, cid = v, plan.committed[v]
        e = files.changelogs.get((v, cid))
        rows.append(
            {
                "path": e.path if e else f"(missing changelog of version {v})",
                "kind": "changelog",
                "version": v,
                "bytes": e.size if e else None,
            }
        )
    return {"store": str(store), "version": version, "snapshot_version": base or None, "files": rows}


SNAPSHOT_COLUMNS = [
    "store",
    "version",
    "chain_length",
    "action",
    "build",
    "changelogs_replayed",
    "ssts_uploaded",
    "ssts_reused",
    "bytes_uploaded",
    "seconds",
]
RUN_COLUMNS = ["id", "kind", "status", "dry_run", "started_at", "seconds", "stores", "files", "bytes", "error_count"]


def _run_operation(
    args: argparse.Namespace, operation: Callable[..., Report], columns: Sequence[str] | None = None, **options: Any
) -> int:
    """Run a maintenance operation on the root with the command's settings, catalog, progress and stores."""
    settings, fm = settings_of(args), file_manager_of(args)
    with maybe_catalog(args) as catalog:
        report = operation(fm, settings, catalog=catalog, progress=show_progress(args), stores=args.stores, **options)
    return report_out(args, report, columns)


def cmd_verify(args: argparse.Namespace) -> int:
    from statekeeper.maintenance.fanout import verify_operation

    verify_root = verify_operation(args.engine, args.master)
    return _run_operation(args, verify_root, rebuild=args.rebuild, checksums=not args.no_checksums)


def cmd_snapshot(args: argparse.Namespace) -> int:
    from statekeeper.maintenance.fanout import snapshot_operation

    create_snapshots = snapshot_operation(args.engine, args.master)
    return _run_operation(args, create_snapshots, None if args.dry_run else SNAPSHOT_COLUMNS, dry_run=args.dry_run)


def cmd_expire(args: argparse.Namespace) -> int:
    from statekeeper.maintenance.expiry import expire_versions

    return _run_operation(args, expire_versions, ["action", "kind", "path", "bytes"], dry_run=args.dry_run)


def cmd_clean_orphans(args: argparse.Namespace) -> int:
    from statekeeper.maintenance.orphans import clean_orphans

    columns = ["action", "kind", "path", "bytes", "reason"]
    return _run_operation(args, clean_orphans, columns, dry_run=args.dry_run)


# -- catalog queries --------------------------------------------------------------------------------


def cmd_catalog_sync(args: argparse.Namespace, *, rebuild: bool = False) -> int:
    from statekeeper.maintenance.catalog_sync import rebuild_catalog, sync_catalog

    with open_catalog(args) as catalog:
        if rebuild:
            result = rebuild_catalog(catalog, file_manager_of(args), raise_on_error=False, record_run=True)
        else:
            result = sync_catalog(catalog, file_manager_of(args), full=args.full, raise_on_error=False, record_run=True)
    doc = result.to_json()

    def text() -> str:
        lines = [
            f"catalog {result.mode} of {result.root}: {result.commits} commit records, {result.files_new} new files, "
            f"{result.files_deleted} gone, {result.snapshots} snapshots ({result.seconds:.2f}s)"
        ]
        lines += [f"  error: {e}" for e in result.errors]
        return "\n".join(lines)

    emit(args, doc, text)
    return EXIT_ERRORS if result.errors else EXIT_OK


def cmd_catalog_rebuild(args: argparse.Namespace) -> int:
    return cmd_catalog_sync(args, rebuild=True)


def cmd_catalog_prune(args: argparse.Namespace) -> int:
    """Drop the root's catalog history older than --older-than (default: catalog_history_seconds)."""
    import datetime as dt
    from dataclasses import asdict

    from statekeeper.maintenance.settings import MaintenanceSettings

    seconds = MaintenanceSettings.from_env(catalog_history_seconds=args.older_than).catalog_history_seconds
    before = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)
    root = catalog_root(args)
    with open_catalog(args) as catalog:
        pruned = catalog.prune_history(root, before)
    doc = {"root": root, "before": before.isoformat(), "rows": pruned.total, **asdict(pruned)}
    emit(
        args,
        doc,
        lambda: (
            f"catalog history of {doc['root']} before {doc['before']}: dropped {pruned.total} rows "
            + ", ".join(f"{k} {v}" for k, v in asdict(pruned).items())
        ),
    )
    return EXIT_OK


def cmd_catalog_chains(args: argparse.Namespace) -> int:
    with open_catalog(args) as catalog:
        chains = catalog.chain_lengths(catalog_root(args), min_length=args.min_length)
    rows = [c.to_json() for c in chains]
    emit(args, rows, lambda: table(rows, limit=row_limit(args)))
    return EXIT_OK


def cmd_catalog_files(args: argparse.Namespace) -> int:
    with open_catalog(args) as catalog:
        vf = catalog.files_for_version(catalog_root(args), args.store.operator, args.store.partition, args.version)
    doc = vf.to_json()

    def text() -> str:
        rows = [{"path": f.path, "kind": f.kind, "bytes": f.size, "state": f.state} for f in vf.files]
        lines = [
            f"version {vf.version} of {args.store}: "
            + (f"base snapshot {vf.snapshot_version}" if vf.snapshot_version else "no base snapshot")
            + f", {vf.total_bytes:,} bytes",
            table(rows, limit=None),
        ]
        lines += [f"  missing: {m}" for m in vf.missing]
        return "\n".join(lines)

    emit(args, doc, text)
    return EXIT_OK if vf.loadable else EXIT_ERRORS


def cmd_catalog_retention(args: argparse.Namespace) -> int:
    retain = args.retain if args.retain is not None else settings_of(args).min_versions_to_retain
    if retain < 1:
        raise UsageError(f"--retain {retain}: at least 1 version must be retained")
    with open_catalog(args) as catalog:
        # State files only: `expire` keeps commit records from the lowest base snapshot on, which the
        # catalog's query does not model (`statekeeper expire --dry-run` lists exactly what would go).
        plan = catalog.retention_plan(catalog_root(args), retain, commit_records=False)
    doc = plan.to_json()
    rows = [{"path": f.path, "kind": f.kind, "bytes": f.size} for f in plan.files]

    def text() -> str:
        return (
            f"keeping {retain} version(s) per store would delete {plan.total_files} state file(s), "
            f"{plan.total_bytes:,} bytes (as the catalog knows them; 'statekeeper expire --dry-run' reads the "
            "location)\n" + table(rows, limit=row_limit(args))
        )

    emit(args, doc, text)
    return EXIT_OK


# -- the catalog database ---------------------------------------------------------------------------


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from statekeeper.sql.db import normalize_url, upgrade

    url = db_url(args)
    revision = upgrade(url)
    where = normalize_url(url).render_as_string(hide_password=True)
    emit(args, {"database": where, "revision": revision}, lambda: f"catalog database {where} is at {revision}")
    return EXIT_OK


def cmd_db_current(args: argparse.Namespace) -> int:
    from statekeeper.sql.db import current_revision, head_revision, normalize_url

    url = db_url(args)
    current, head = current_revision(url), head_revision()
    where = normalize_url(url).render_as_string(hide_password=True)
    doc = {"database": where, "revision": current, "head": head, "current": current == head}
    emit(args, doc, lambda: f"catalog database {where} is at {current} (this release: {head})")
    return EXIT_OK if current == head else EXIT_ERRORS


def cmd_runs(args: argparse.Namespace) -> int:
    with open_catalog(args) as catalog:
        root = catalog_root(args) if args.root else None
        runs = catalog.runs(root, kind=args.kind, status=args.status, limit=args.limit)
    rows = [r.to_json() for r in runs]
    emit(args, rows, lambda: table(rows, RUN_COLUMNS, limit=None))
    return EXIT_OK


def cmd_maintain(args: argparse.Namespace) -> int:
    from statekeeper.maintenance.loop import CycleResult, maintain

    settings = settings_of(args)
    failed = 0

    def on_cycle(result: CycleResult) -> None:
        nonlocal failed
        failed += not result.ok
        doc = {
            "cycle": result.cycle,
            "seconds": result.seconds,
            "listing_seconds": result.listing_seconds,
            "reports": [r.to_json() for r in result.reports],
        }
        emit(args, doc, result.summary, line=True)
        sys.stdout.flush()
        for r in result.reports:
            log_problems(r, warnings=False)

    with maybe_catalog(args) as catalog, _stopped_by_sigterm() as stop:
        maintain(
            [file_manager_of(args, r) for r in args.roots],
            settings,
            every=args.every,
            catalog=catalog,
            cycles=args.cycles,
            on_cycle=on_cycle,
            stores=args.stores,
            stop=stop,
        )
    return EXIT_ERRORS if failed else EXIT_OK


@contextmanager
def _stopped_by_sigterm() -> Iterator[threading.Event]:
    """An event SIGTERM sets (a service manager stopping the maintainer): the loop ends after the root it is
    working on, its leases released, and the command exits as after its last cycle. A second SIGTERM
    interrupts at once, as Ctrl-C does."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def on_sigterm(signum: int, frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        log.warning("SIGTERM: stopping after the current root's cycle (again to stop at once)")
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGTERM, previous)
