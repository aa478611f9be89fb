"""The `statekeeper` command line: maintenance operations, catalog queries and database migrations.

Exit codes: 0 success; 1 the operation found or hit errors (named on stderr and in ``--json``);
2 bad usage or configuration (nothing was changed). ``--json`` prints one JSON document on stdout.
The catalog database comes from ``--db``, else ``STATEKEEPER_DB_URL``, else the embedded SQLite file
(``$STATEKEEPER_HOME/catalog.db``, migrated on first use); ``--no-catalog`` runs without one (then
leases are host-local lock files and no run is recorded). Settings default to the
``STATEKEEPER_<SETTING>`` environment variables (see docs/maintenance.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

from statekeeper.store.errors import ConfigurationError, StatekeeperError
from statekeeper.store.layout import StoreId

if TYPE_CHECKING:
    from statekeeper.maintenance.reports import Report
    from statekeeper.maintenance.settings import MaintenanceSettings
    from statekeeper.sql.catalog import Catalog

log = logging.getLogger("statekeeper")

EXIT_OK = 0
EXIT_ERRORS = 1
EXIT_USAGE = 2
MAX_ROWS = 40
"""Rows printed per table without --all."""


class UsageError(Exception):
    """Bad arguments or configuration: exit code 2."""


# -- argument parsing -------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _store_arg(text: str) -> StoreId:
    name, sep, number = text.rpartition("/")
    if not sep or not name or not number.isdigit():
        raise argparse.ArgumentTypeError(f"invalid store {text!r}: expected operator/partition, e.g. agg/0")
    try:
        return StoreId(name, int(number))
    except ConfigurationError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    return value


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    common.add_argument("--db", metavar="URL", help="catalog database URL (default: $STATEKEEPER_DB_URL or SQLite)")
    common.add_argument("-v", "--verbose", action="count", default=0, help="log more (repeat for debug)")
    common.add_argument("--all", action="store_true", help=f"print every row, not the first {MAX_ROWS}")

    op = _Parser(add_help=False)
    op.add_argument("root", help="checkpoint root: a local path, file:// or s3://bucket/prefix")
    op.add_argument("--no-catalog", action="store_true", help="run without the catalog (no run recorded)")
    op.add_argument(
        "--store",
        dest="stores",
        action="append",
        type=_store_arg,
        metavar="OP/PART",
        help="only this store (repeatable)",
    )
    bars = op.add_mutually_exclusive_group()
    bars.add_argument("--progress", dest="progress", action="store_true", default=None, help="progress bars")
    bars.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    op.add_argument("--parallelism", type=_positive_int, help="stores worked on at once")
    op.add_argument("--lease-ttl", type=_number, metavar="SECONDS", help="maintenance lease time to live")
    op.add_argument("--lease-timeout", type=_number, metavar="SECONDS", help="wait this long for a busy store")
    op.add_argument("--retain", type=_positive_int, metavar="N", help="min_versions_to_retain")
    op.add_argument("--grace", type=_number, metavar="SECONDS", help="orphan grace period")
    op.add_argument(
        "--load-grace", type=_number, metavar="SECONDS", help="age at which a new snapshot becomes the expiry base"
    )
    op.add_argument("--threshold", type=_positive_int, metavar="N", help="snapshot threshold (changelogs)")
    op.add_argument("--work-dir", metavar="DIR", help="directory for warm local copies of stores")
    op.add_argument("--delete-batch-size", type=_positive_int, metavar="N", help="paths per delete request")

    fan = _Parser(add_help=False)  # maintenance.fanout: --engine spark spreads the stores over Spark executors
    fan.add_argument("--engine", choices=("local", "spark"), default="local", help="where the stores are worked on")
    fan.add_argument("--master", metavar="URL", help="with --engine spark: spark://..., local[N] or sc://... (Connect)")

    dry = _Parser(add_help=False)
    dry.add_argument("--dry-run", action="store_true", help="report what would be done; change nothing")

    parser = _Parser(prog="statekeeper", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("inspect", parents=[common, op], help="what is under a checkpoint root, per store")
    p.add_argument("--version", type=_positive_int, dest="version", help="with one --store: the files of a version")
    p.set_defaults(func=cmd_inspect)
    p = sub.add_parser("verify", parents=[common, op, fan], help="check that every retained version is loadable")
    p.add_argument("--rebuild", action="store_true", help="also rebuild versions and compare with snapshots")
    p.add_argument("--no-checksums", action="store_true", help="check SST sizes only, not their SHA-256")
    p.set_defaults(func=cmd_verify)
    p = sub.add_parser("snapshot", parents=[common, op, dry, fan], help="snapshot stores with long changelog chains")
    p.set_defaults(func=cmd_snapshot)
    p = sub.add_parser("expire", parents=[common, op, dry], help="delete what no retained version needs")
    p.set_defaults(func=cmd_expire)
    p = sub.add_parser("clean-orphans", parents=[common, op, dry], help="delete orphans older than the grace period")
    p.set_defaults(func=cmd_clean_orphans)
    p = sub.add_parser("maintain", parents=[common, op], help="snapshot, expire and clean orphans in a loop")
    p.add_argument("--every", type=_number, default=10.0, metavar="SECONDS", help="start a cycle this often")
    p.add_argument("--cycles", type=_positive_int, metavar="N", help="stop after N cycles (default: run until killed)")
    p.set_defaults(func=cmd_maintain)
    from statekeeper.maintenance.relayout import add_commands

    add_commands(sub, common, _positive_int, _emit, _maybe_catalog)

    cat = sub.add_parser("catalog", help="the lineage catalog")
    csub = cat.add_subparsers(dest="catalog_command", required=True, parser_class=_Parser)
    p = csub.add_parser("sync", parents=[common], help="bring the catalog up to date with a root")
    p.add_argument("root")
    p.add_argument("--full", action="store_true", help="list the whole root (finds deletions and stray files)")
    p.set_defaults(func=cmd_catalog_sync)
    p = csub.add_parser("rebuild", parents=[common], help="forget a root and sync it from the location alone")
    p.add_argument("root")
    p.set_defaults(func=cmd_catalog_rebuild)
    p = csub.add_parser("chains", parents=[common], help="changelogs since the last snapshot, per store")
    p.add_argument("root")
    p.add_argument("--min-length", type=_positive_int, default=0)
    p.set_defaults(func=cmd_catalog_chains)
    p = csub.add_parser("files", parents=[common], help="the files that make up version V of a store")
    p.add_argument("root")
    p.add_argument("--store", required=True, type=_store_arg, metavar="OP/PART")
    p.add_argument("--version", required=True, type=_positive_int, dest="version")
    p.set_defaults(func=cmd_catalog_files)
    p = csub.add_parser("retention", parents=[common], help="what keeping N versions per store would delete")
    p.add_argument("root")
    p.add_argument("--retain", type=_positive_int, metavar="N", help="default: $STATEKEEPER_MIN_VERSIONS_TO_RETAIN")
    p.set_defaults(func=cmd_catalog_retention)

    db = sub.add_parser("db", help="the catalog database")
    dsub = db.add_subparsers(dest="db_command", required=True, parser_class=_Parser)
    p = dsub.add_parser("upgrade", parents=[common], help="migrate the catalog database to this release")
    p.set_defaults(func=cmd_db_upgrade)
    p = dsub.add_parser("current", parents=[common], help="the schema revision of the catalog database")
    p.set_defaults(func=cmd_db_current)

    p = sub.add_parser("runs", parents=[common], help="maintenance run history, newest first")
    p.add_argument("root", nargs="?", help="only runs of this root")
    p.add_argument("--kind", help="e.g. snapshot, expire, clean-orphans, verify, catalog-full")
    p.add_argument("--status", choices=["running", "succeeded", "failed"])
    p.add_argument("--limit", type=_positive_int, default=50)
    p.set_defaults(func=cmd_runs)
    return parser


# -- helpers ----------------------------------------------------------------------------------------


def _settings(args: argparse.Namespace) -> MaintenanceSettings:
    from statekeeper.maintenance.settings import MaintenanceSettings

    return MaintenanceSettings.from_env(
        snapshot_threshold=getattr(args, "threshold", None),
        min_versions_to_retain=getattr(args, "retain", None),
        orphan_grace_seconds=getattr(args, "grace", None),
        load_grace_seconds=getattr(args, "load_grace", None),
        parallelism=getattr(args, "parallelism", None),
        lease_ttl_seconds=getattr(args, "lease_ttl", None),
        lease_timeout_seconds=getattr(args, "lease_timeout", None),
        work_dir=getattr(args, "work_dir", None),
        delete_batch_size=getattr(args, "delete_batch_size", None),
    )


def _db_url(args: argparse.Namespace) -> str:
    from statekeeper.sql.db import default_url

    return str(args.db) if args.db else default_url()


def _open_catalog(args: argparse.Namespace) -> Catalog:
    """The catalog; the embedded SQLite default is migrated on first use, a server database is not."""
    from statekeeper.sql.catalog import Catalog
    from statekeeper.sql.db import normalize_url

    url = _db_url(args)
    auto = normalize_url(url).get_backend_name() == "sqlite" and not args.db
    return Catalog.open(url, upgrade=auto)


@contextmanager
def _maybe_catalog(args: argparse.Namespace) -> Iterator[Catalog | None]:
    if getattr(args, "no_catalog", False):
        yield None
        return
    catalog = _open_catalog(args)
    try:
        yield catalog
    finally:
        catalog.close()


def _progress(args: argparse.Namespace) -> bool:
    chosen = getattr(args, "progress", None)
    return bool(sys.stderr.isatty()) if chosen is None else bool(chosen)


def _emit(args: argparse.Namespace, document: Any, text: Callable[[], str]) -> None:
    if args.json:
        json.dump(document, sys.stdout, indent=2, default=str, sort_keys=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(text() + "\n")


def _table(
    rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None, *, limit: int | None = MAX_ROWS
) -> str:
    if not rows:
        return "(none)"
    cols = list(columns or rows[0].keys())
    shown = rows if limit is None else rows[:limit]

    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.3f}"
        return str(v)

    cells = [[cell(r.get(c)) for c in cols] for r in shown]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    if len(rows) > len(shown):
        lines.append(f"... and {len(rows) - len(shown)} more (--all or --json shows every row)")
    return "\n".join(lines)


def _report_out(args: argparse.Namespace, report: Report, columns: Sequence[str] | None = None) -> int:
    def text() -> str:
        parts = [report.summary()]
        rows = report.rows()
        if rows:
            parts.append(_table(rows, columns, limit=None if args.all else MAX_ROWS))
        counts = ", ".join(f"{k}={v}" for k, v in report.metadata().items() if k not in ("seconds",))
        parts.append(counts)
        if report.errors:
            parts.append("errors:")
            parts += [f"  {e}" for e in report.errors[: None if args.all else MAX_ROWS]]
        if report.warnings:
            parts.append("warnings (not a failure):")
            parts += [f"  {w}" for w in report.warnings[: None if args.all else MAX_ROWS]]
        return "\n".join(parts)

    _emit(args, report.to_json(), text)
    for e in report.errors[:10]:
        log.error("%s", e)
    for w in report.warnings[:10]:
        log.warning("%s", w)
    return EXIT_OK if report.ok else EXIT_ERRORS


# -- commands ---------------------------------------------------------------------------------------


def cmd_inspect(args: argparse.Namespace) -> int:
    from statekeeper.maintenance.inventory import Inventory
    from statekeeper.maintenance.plan import plan_root

    settings = _settings(args)
    inv = Inventory.scan(args.root, parallelism=settings.parallelism, progress=_progress(args), stores=args.stores)
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
    from statekeeper.maintenance.relayout import describe_layouts, layout_history

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
        out = [
            f"{inv.root_uri}: latest version {inv.latest}, {len(rows)} store(s), "
            f"commit records from {inv.oldest_record} (floor {plan.floor})",
            _table(rows, limit=None if args.all else MAX_ROWS),
        ]
        if any(s.change for s in layouts):
            out += describe_layouts(layouts)
        if "version_files" in doc:
            vf = doc["version_files"]
            out.append(f"version {args.version} of {args.stores[0]} (base snapshot {vf['snapshot_version']}):")
            out.append(_table(vf["files"], limit=None))
        if problems:
            out.append("problems:")
            out += [f"  {p}" for p in problems]
        if warnings:
            out.append("warnings (someone else's files; left alone, not a failure):")
            out += [f"  {w}" for w in warnings[: None if args.all else MAX_ROWS]]
        return "\n".join(out)

    _emit(args, doc, text)
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
    for v in range(base + 1, version + 1):
        cid = plan.committed.get(v)
        e = files.changelogs.get((v, cid)) if cid else None
        rows.append(
            {
                "path": e.path if e else f"(missing changelog of version {v})",
                "kind": "changelog",
                "version": v,
                "bytes": e.size if e else None,
            }
        )
    return {"store": str(store), "version": version, "snapshot_version": base or None, "files": rows}


def cmd_verify(args: argparse.Namespace) -> int:
    from statekeeper.maintenance.fanout import verify_operation

    settings = _settings(args)
    verify_root = verify_operation(args.engine, args.master)
    with _maybe_catalog(args) as catalog:
        report = verify_root(
            args.root,
            settings,
            catalog=catalog,
            rebuild=args.rebuild,
            checksums=not args.no_checksums,
            progress=_progress(args),
            stores=args.stores,
        )
    return _report_out(args, report)


def cmd_snapshot(args: argparse.Namespace) -> int:
    from statekeeper.maintenance.fanout import snapshot_operation

    settings = _settings(args)
    create_snapshots = snapshot_operation(args.engine, args.master)
    with _maybe_catalog(args) as catalog:
        report = create_snapshots(
            args.root, settings, catalog=catalog, dry_run=args.dry_run, progress=_progress(args), stores=args.stores
        )
    return _report_out(
        args,
        report,
        [
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
        if not args.dry_run
        else None,
    )


def cmd_expire(args: argparse.Namespace) -> int:
    from statekeeper.maintenance.expiry import expire_versions

    settings = _settings(args)
    with _maybe_catalog(args) as catalog:
        report = expire_versions(
            args.root, settings, catalog=catalog, dry_run=args.dry_run, progress=_progress(args), stores=args.stores
        )
    return _report_out(args, report, ["action", "kind", "path", "bytes"])


def cmd_clean_orphans(args: argparse.Namespace) -> int:
    from statekeeper.maintenance.orphans import clean_orphans

    settings = _settings(args)
    with _maybe_catalog(args) as catalog:
        report = clean_orphans(
            args.root, settings, catalog=catalog, dry_run=args.dry_run, progress=_progress(args), stores=args.stores
        )
    return _report_out(args, report, ["action", "kind", "path", "bytes", "reason"])


def cmd_catalog_sync(args: argparse.Namespace, *, rebuild: bool = False) -> int:
    from statekeeper.maintenance.catalog_sync import rebuild_catalog, sync_catalog

    catalog = _open_catalog(args)
    try:
        if rebuild:
            result = rebuild_catalog(catalog, args.root, raise_on_error=False, record_run=True)
        else:
            result = sync_catalog(catalog, args.root, full=args.full, raise_on_error=False, record_run=True)
    finally:
        catalog.close()
    doc = result.to_json()

    def text() -> str:
        lines = [
            f"catalog {result.mode} of {result.root}: {result.commits} commit records, {result.files_new} new files, "
            f"{result.files_deleted} gone, {result.snapshots} snapshots ({result.seconds:.2f}s)"
        ]
        lines += [f"  error: {e}" for e in result.errors]
        return "\n".join(lines)

    _emit(args, doc, text)
    return EXIT_ERRORS if result.errors else EXIT_OK


def cmd_catalog_rebuild(args: argparse.Namespace) -> int:
    return cmd_catalog_sync(args, rebuild=True)


def _catalog_root(args: argparse.Namespace) -> str:
    from statekeeper.store.files import open_file_manager

    return open_file_manager(args.root).root_uri


def cmd_catalog_chains(args: argparse.Namespace) -> int:
    catalog = _open_catalog(args)
    try:
        chains = catalog.chain_lengths(_catalog_root(args), min_length=args.min_length)
    finally:
        catalog.close()
    rows = [c.to_json() for c in chains]
    _emit(args, rows, lambda: _table(rows, limit=None if args.all else MAX_ROWS))
    return EXIT_OK


def cmd_catalog_files(args: argparse.Namespace) -> int:
    catalog = _open_catalog(args)
    try:
        vf = catalog.files_for_version(_catalog_root(args), args.store.operator, args.store.partition, args.version)
    finally:
        catalog.close()
    doc = vf.to_json()

    def text() -> str:
        rows = [{"path": f.path, "kind": f.kind, "bytes": f.size, "state": f.state} for f in vf.files]
        lines = [
            f"version {vf.version} of {args.store}: base snapshot {vf.snapshot_version}, {vf.total_bytes:,} bytes",
            _table(rows, limit=None),
        ]
        lines += [f"  missing: {m}" for m in vf.missing]
        return "\n".join(lines)

    _emit(args, doc, text)
    return EXIT_OK if vf.loadable else EXIT_ERRORS


def cmd_catalog_retention(args: argparse.Namespace) -> int:
    retain = args.retain if args.retain is not None else _settings(args).min_versions_to_retain
    if retain < 1:
        raise UsageError(f"--retain {retain}: at least 1 version must be retained")
    catalog = _open_catalog(args)
    try:
        # State files only: `expire` keeps commit records from the lowest base snapshot on, which the
        # catalog's query does not model (`statekeeper expire --dry-run` lists exactly what would go).
        plan = catalog.retention_plan(_catalog_root(args), retain, commit_records=False)
    finally:
        catalog.close()
    doc = plan.to_json()
    rows = [{"path": f.path, "kind": f.kind, "bytes": f.size} for f in plan.files]

    def text() -> str:
        return (
            f"keeping {retain} version(s) per store would delete {plan.total_files} state file(s), "
            f"{plan.total_bytes:,} bytes (as the catalog knows them; `expire --dry-run` reads the location)\n"
            + _table(rows, limit=None if args.all else MAX_ROWS)
        )

    _emit(args, doc, text)
    return EXIT_OK


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from statekeeper.sql.db import normalize_url, upgrade

    url = _db_url(args)
    revision = upgrade(url)
    where = normalize_url(url).render_as_string(hide_password=True)
    _emit(args, {"database": where, "revision": revision}, lambda: f"catalog database {where} is at {revision}")
    return EXIT_OK


def cmd_db_current(args: argparse.Namespace) -> int:
    from statekeeper.sql.db import current_revision, head_revision, normalize_url

    url = _db_url(args)
    current, head = current_revision(url), head_revision()
    where = normalize_url(url).render_as_string(hide_password=True)
    doc = {"database": where, "revision": current, "head": head, "current": current == head}
    _emit(args, doc, lambda: f"catalog database {where} is at {current} (this release: {head})")
    return EXIT_OK if current == head else EXIT_ERRORS


def cmd_runs(args: argparse.Namespace) -> int:
    catalog = _open_catalog(args)
    try:
        root = _catalog_root(args) if args.root else None
        runs = catalog.runs(root, kind=args.kind, status=args.status, limit=args.limit)
    finally:
        catalog.close()
    rows = [r.to_json() for r in runs]
    columns = ["id", "kind", "status", "dry_run", "started_at", "seconds", "stores", "files", "bytes", "error_count"]
    _emit(args, rows, lambda: _table(rows, columns, limit=None))
    return EXIT_OK


def cmd_maintain(args: argparse.Namespace) -> int:
    from statekeeper.maintenance.loop import CycleResult, maintain

    settings = _settings(args)
    failed = 0

    def on_cycle(result: CycleResult) -> None:
        nonlocal failed
        failed += not result.ok
        doc = {"cycle": result.cycle, "seconds": result.seconds, "reports": [r.to_json() for r in result.reports]}
        _emit(args, doc, result.summary)
        sys.stdout.flush()
        for r in result.reports:
            for e in r.errors[:10]:
                log.error("%s", e)

    with _maybe_catalog(args) as catalog:
        maintain(args.root, settings, every=args.every, catalog=catalog, cycles=args.cycles, on_cycle=on_cycle)
    return EXIT_ERRORS if failed else EXIT_OK


# -- entry point ------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING if args.verbose == 0 else logging.INFO if args.verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    if args.verbose == 0:
        logging.getLogger("statekeeper.maintenance").setLevel(logging.CRITICAL)  # errors are printed once, below
    from sqlalchemy.exc import SQLAlchemyError

    from statekeeper.sql.errors import CatalogConfigError, CatalogError, NotInCatalogError

    try:
        return int(args.func(args))
    except (UsageError, ConfigurationError, CatalogConfigError) as e:
        _fail(args, e, EXIT_USAGE)
        return EXIT_USAGE
    except NotInCatalogError as e:
        _fail(args, e, EXIT_ERRORS)
        return EXIT_ERRORS
    except CatalogError as e:
        _fail(args, e, EXIT_USAGE if "statekeeper db upgrade" in str(e) else EXIT_ERRORS)
        return EXIT_USAGE if "statekeeper db upgrade" in str(e) else EXIT_ERRORS
    except (StatekeeperError, OSError, SQLAlchemyError) as e:
        _fail(args, e, EXIT_ERRORS)
        return EXIT_ERRORS
    except KeyboardInterrupt:
        sys.stderr.write("statekeeper: interrupted\n")
        return 130


def _fail(args: argparse.Namespace, e: BaseException, code: int) -> None:
    sys.stderr.write(f"statekeeper {args.command}: error: {e}\n")
    if getattr(args, "json", False):
        json.dump({"ok": False, "error": str(e), "error_type": type(e).__name__, "exit_code": code}, sys.stdout)
        sys.stdout.write("\n")


if __name__ == "__main__":
    sys.exit(main())
