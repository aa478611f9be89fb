"""The `statekeeper` command line: maintenance operations, catalog queries and database migrations.

Exit codes: 0 success; 1 the operation found or hit errors (named on stderr and in ``--json``);
2 bad usage or configuration (nothing was changed; the ``STATEKEEPER_*`` settings, the root, ``--store`` and
``--operator`` are checked before any work); 141 stdout was closed early (``| head``). ``--json`` prints one JSON
document on stdout (``maintain``: one line per cycle, JSON Lines); a report's errors and warnings go to stderr, once
each. ``COMMAND --help`` lists the flags that command reads.
The catalog database comes from ``--db``, else ``STATEKEEPER_DB_URL``, else the embedded SQLite file
(``$STATEKEEPER_HOME/catalog.db``, migrated on first use); ``--no-catalog`` runs without one (no run is
recorded; the stores' leases are kept in the checkpoint root either way). Settings default to the
``STATEKEEPER_<SETTING>`` environment variables (see docs/maintenance.md).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from statekeeper.maintenance.cli_checks import (
    check_environment,
    check_operator,
    check_roots,
    check_stores,
    flags_of,
    in_flag_terms,
)
from statekeeper.maintenance.cli_commands import (
    cmd_catalog_chains,
    cmd_catalog_files,
    cmd_catalog_prune,
    cmd_catalog_rebuild,
    cmd_catalog_retention,
    cmd_catalog_sync,
    cmd_clean_orphans,
    cmd_db_current,
    cmd_db_upgrade,
    cmd_expire,
    cmd_inspect,
    cmd_maintain,
    cmd_runs,
    cmd_snapshot,
    cmd_verify,
    file_manager_of,
    maybe_catalog,
)
from statekeeper.maintenance.cli_output import (
    EXIT_ERRORS,
    EXIT_USAGE,
    MAX_ROWS,
    UsageError,
    emit,
    print_failure,
)
from statekeeper.maintenance.settings import SnapshotSchedule
from statekeeper.store.errors import ConfigurationError, StatekeeperError
from statekeeper.store.layout import StoreId

__all__ = ["build_parser", "main"]

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


Help = Callable[[str], str]
"""A flag's help text, or `argparse.SUPPRESS` for a flag a command accepts but does not use."""


def _scope(p: argparse.ArgumentParser, h: Help) -> None:
    p.add_argument(
        "--store",
        dest="stores",
        action="append",
        type=_store_arg,
        metavar="OP/PART",
        help=h("only this store (repeatable)"),
    )
    bars = p.add_mutually_exclusive_group()
    bars.add_argument("--progress", dest="progress", action="store_true", default=None, help=h("progress bars"))
    bars.add_argument("--no-progress", dest="progress", action="store_false", help=h("no progress bars"))
    p.add_argument("--parallelism", type=_positive_int, metavar="N", help=h("stores worked on at once"))


def _catalog(p: argparse.ArgumentParser, h: Help) -> None:
    p.add_argument("--no-catalog", action="store_true", help=h("run without the catalog (no run recorded)"))


def _plan(p: argparse.ArgumentParser, h: Help) -> None:
    p.add_argument("--retain", type=_positive_int, metavar="N", help=h("min_versions_to_retain"))
    p.add_argument("--grace", type=_number, metavar="SECONDS", help=h("orphan grace period"))
    p.add_argument(
        "--load-grace", type=_number, metavar="SECONDS", help=h("age at which a new snapshot becomes the expiry base")
    )


def _work(p: argparse.ArgumentParser, h: Help) -> None:
    p.add_argument("--lease-ttl", type=_number, metavar="SECONDS", help=h("maintenance lease time to live"))
    p.add_argument("--lease-timeout", type=_number, metavar="SECONDS", help=h("wait this long for a busy store"))
    p.add_argument("--work-dir", metavar="DIR", help=h("directory for local replicas of stores"))


def _snapshots(p: argparse.ArgumentParser, h: Help) -> None:
    p.add_argument("--threshold", type=_positive_int, metavar="N", help=h("snapshot threshold (changelogs)"))
    p.add_argument(
        "--snapshot-spread",
        type=_number,
        metavar="FRACTION",
        help=h("snapshot each store up to this fraction of the threshold early, at a point drawn per store (0-1)"),
    )
    p.add_argument(
        "--snapshot-schedule",
        choices=[s.value for s in SnapshotSchedule],
        help=h(
            "when a store is due: at the threshold (less the spread), or at its own phase of the versions, one in "
            "every threshold (a fleet's builds a steady share a version)"
        ),
    )
    p.add_argument(
        "--round-seconds",
        type=_number,
        metavar="SECONDS",
        help=h(
            "a snapshot round starts builds of stores still under the threshold (due early by the spread) for "
            "this long; later ones wait for the next round (default 0: no bound)"
        ),
    )


def _deletion(p: argparse.ArgumentParser, h: Help) -> None:
    p.add_argument("--delete-batch-size", type=_positive_int, metavar="N", help=h("paths per delete request"))


def _history(p: argparse.ArgumentParser, h: Help) -> None:
    p.add_argument(
        "--catalog-history",
        type=_number,
        metavar="SECONDS",
        help=h("keep the catalog's rows of what is gone this long"),
    )


_OPTION_GROUPS = {
    "scope": _scope,
    "catalog": _catalog,
    "plan": _plan,
    "work": _work,
    "snapshots": _snapshots,
    "deletion": _deletion,
    "history": _history,
}
"""The options of the operations on a root, by what reads them."""


def _options(*used: str) -> list[_Parser]:
    """Parent parsers of a root operation: the groups in `used` shown in its help; the others accepted but not
    shown (a script passes one set of options to every command; they change nothing where they are unread)."""
    parents: list[_Parser] = []
    for name, add in _OPTION_GROUPS.items():
        parent = _Parser(add_help=False)
        add(parent, (lambda text: text) if name in used else (lambda text: argparse.SUPPRESS))
        parents.append(parent)
    return parents


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument(
        "--json", action="store_true", help="print one JSON document on stdout (maintain: one line per cycle)"
    )
    common.add_argument("--db", metavar="URL", help="catalog database URL (default: $STATEKEEPER_DB_URL or SQLite)")
    common.add_argument("-v", "--verbose", action="count", default=0, help="log more (repeat for debug)")
    common.add_argument("--all", action="store_true", help=f"print every row, not the first {MAX_ROWS}")

    one_root = _Parser(add_help=False)
    one_root.add_argument("root", help="checkpoint root: a local path, file:// or s3://bucket/prefix")

    fan = _Parser(add_help=False)  # maintenance.fanout: --engine spark spreads the stores over Spark executors
    fan.add_argument("--engine", choices=("local", "spark"), default="local", help="where the stores are worked on")
    fan.add_argument("--master", metavar="URL", help="with --engine spark: spark://..., local[N] or sc://... (Connect)")

    dry = _Parser(add_help=False)
    dry.add_argument("--dry-run", action="store_true", help="report what would be done; change nothing")

    parser = _Parser(prog="statekeeper", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    ops = ("scope", "catalog", "plan", "work")  # what expire and clean-orphans read
    p = sub.add_parser(
        "inspect",
        parents=[common, one_root, *_options("scope", "plan")],
        help="what is under a checkpoint root, per store",
    )
    p.add_argument("--version", type=_positive_int, dest="version", help="with one --store: the files of a version")
    p.set_defaults(func=cmd_inspect)
    p = sub.add_parser(
        "verify",
        parents=[common, one_root, *_options("scope", "catalog", "plan"), fan],
        help="check that every retained version is loadable",
    )
    p.add_argument("--rebuild", action="store_true", help="also rebuild versions and compare with snapshots")
    p.add_argument("--no-checksums", action="store_true", help="check SST sizes only, not their SHA-256")
    p.set_defaults(func=cmd_verify)
    p = sub.add_parser(
        "snapshot",
        parents=[common, one_root, *_options(*ops, "snapshots"), dry, fan],
        help="snapshot stores with long changelog chains",
    )
    p.set_defaults(func=cmd_snapshot)
    p = sub.add_parser(
        "expire",
        parents=[common, one_root, *_options(*ops, "deletion", "history"), dry],
        help="delete what no retained version needs",
    )
    p.set_defaults(func=cmd_expire)
    p = sub.add_parser(
        "clean-orphans",
        parents=[common, one_root, *_options(*ops, "deletion"), dry],
        help="delete orphans older than the grace period",
    )
    p.set_defaults(func=cmd_clean_orphans)
    p = sub.add_parser(
        "maintain",
        parents=[common, *_options(*_OPTION_GROUPS)],
        help="expire, snapshot and clean orphans of one or more roots in a loop",
    )
    p.add_argument("roots", nargs="+", metavar="root", help="checkpoint roots, maintained one after the other")
    p.add_argument("--every", type=_number, default=10.0, metavar="SECONDS", help="start a cycle this often")
    p.add_argument("--cycles", type=_positive_int, metavar="N", help="stop after N cycles (default: run until killed)")
    p.add_argument(
        "--build-processes",
        type=int,
        metavar="N",
        help="build snapshots in N worker processes, each keeping its stores' replicas (default 0: threads here)",
    )
    p.set_defaults(func=cmd_maintain)
    from statekeeper.maintenance.offline_rescale import add_commands

    add_commands(sub, [common, fan], _positive_int, emit, maybe_catalog, file_manager_of)
    from statekeeper.maintenance.cli_import import add_commands as add_import

    add_import(sub, [common], _positive_int, emit)

    cat = sub.add_parser("catalog", help="the lineage catalog")
    csub = cat.add_subparsers(dest="catalog_command", required=True, parser_class=_Parser)
    p = csub.add_parser("sync", parents=[common], help="bring the catalog up to date with a root")
    p.add_argument("root")
    p.add_argument("--full", action="store_true", help="list the whole root (finds deletions and stray files)")
    p.set_defaults(func=cmd_catalog_sync)
    p = csub.add_parser("rebuild", parents=[common], help="forget a root and sync it from the location alone")
    p.add_argument("root")
    p.set_defaults(func=cmd_catalog_rebuild)
    p = csub.add_parser("prune", parents=[common], help="drop the catalog's rows of what left the root long ago")
    p.add_argument("root")
    p.add_argument(
        "--older-than", type=_number, metavar="SECONDS", help="default: $STATEKEEPER_CATALOG_HISTORY_SECONDS (1 day)"
    )
    p.set_defaults(func=cmd_catalog_prune)
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


# -- entry point ------------------------------------------------------------------------------------

EXIT_BROKEN_PIPE = 141
"""The reader of stdout went away (``statekeeper ... | head``): 128 + SIGPIPE, as a shell reports a Unix tool."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit code. A closed stdout ends it quietly, as it ends a Unix tool."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here, not in a traceback as the interpreter exits
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush of stdout finds nowhere to fail
        return EXIT_BROKEN_PIPE
    return code


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING if args.verbose == 0 else logging.INFO if args.verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    if args.verbose == 0:
        logging.getLogger("statekeeper.maintenance").setLevel(logging.CRITICAL)  # errors are printed once, below
    from sqlalchemy.exc import SQLAlchemyError

    from statekeeper.sql.errors import CatalogConfigError, CatalogError, NotInCatalogError

    try:
        check_environment(args)
        check_roots(args)
        check_stores(args)
        check_operator(args)
        return int(args.func(args))
    except BrokenPipeError:
        raise
    except (UsageError, ConfigurationError, CatalogConfigError) as e:
        return _failure(parser, args, e, EXIT_USAGE)
    except NotInCatalogError as e:
        return _failure(parser, args, e, EXIT_ERRORS)
    except CatalogError as e:
        return _failure(parser, args, e, EXIT_USAGE if "statekeeper db upgrade" in str(e) else EXIT_ERRORS)
    except (StatekeeperError, OSError, SQLAlchemyError) as e:
        return _failure(parser, args, e, EXIT_ERRORS)
    except KeyboardInterrupt:
        sys.stderr.write("statekeeper: interrupted\n")
        return 130


def _failure(parser: argparse.ArgumentParser, args: argparse.Namespace, e: BaseException, code: int) -> int:
    """`print_failure` in the command's terms: its flags, not the Python parameters they set."""
    return print_failure(args, e, code, in_flag_terms(str(e), flags_of(_command_parser(parser, args)._actions)))


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the command `args` was parsed for."""
    for name in ("command", "catalog_command", "db_command"):
        chosen = getattr(args, name, None)
        subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if chosen is None or not subparsers:
            break
        parser = subparsers[0].choices[chosen]
    return parser


if __name__ == "__main__":
    sys.exit(main())
