"""``statekeeper import-spark-state``: move a Spark streaming query's state into a statekeeper operator.

One Spark job reads the Spark checkpoint's state (its last committed batch) through Spark's state data
source and writes it into the operator's stores, all partitions or none
(`statekeeper.store.spark.spark_import`). Progress lines go to stderr; the summary (keys, rows, bytes,
seconds) to stdout, or as one JSON document with ``--json``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from statekeeper.store.extras import require


def add_commands(sub: Any, parents: list[argparse.ArgumentParser], positive_int: Any, emit: Any) -> None:
    """Register ``import-spark-state`` (`parents`: the CLI's common options; `emit`: its output helper)."""
    p = sub.add_parser(
        "import-spark-state",
        parents=parents,
        help="import a Spark streaming checkpoint's state into a new statekeeper operator",
        description=(
            "One Spark job reads the Spark checkpoint's state (its last committed batch) through Spark's state data "
            "source and writes it into the operator's stores, all partitions or none. Progress goes to stderr, the "
            "summary (keys, rows, bytes, seconds) to stdout."
        ),
    )
    p.add_argument("--spark-checkpoint", required=True, metavar="PATH", help="the Spark query's checkpoint location")
    p.add_argument("--root", required=True, help="the new state root: a local path, file:// or s3://bucket/prefix")
    p.add_argument("--operator", required=True, help="the statekeeper operator's name")
    p.add_argument(
        "--continuation-checkpoint",
        metavar="PATH",
        help="a new, empty location: the Spark query's progress is copied there for the statekeeper query",
    )
    p.add_argument("--operator-id", type=int, default=0, help="the Spark stateful operator (default 0)")
    p.add_argument(
        "--state-name",
        help="the ValueState taking an applyInPandasWithState's group state (group_state) or an aggregation (agg)",
    )
    p.add_argument("--partitions", type=positive_int, help="state partitions (default: the Spark operator's)")
    p.add_argument("--max-key-groups", type=positive_int, default=None, help="key groups (default 4096)")
    p.add_argument(
        "--batch-id",
        type=int,
        help="import this committed batch's state (default: the last committed, which a continuation needs)",
    )
    p.add_argument("--master", metavar="URL", help="Spark master (local[N], spark://...); default: Spark's own")
    p.set_defaults(func=cmd_import_spark_state, emit=emit)


def cmd_import_spark_state(args: argparse.Namespace) -> int:
    require(("pyspark", "pandas"), "spark", "statekeeper import-spark-state")
    from pyspark.sql import SparkSession

    from statekeeper.store.spark.schemas import DEFAULT_MAX_KEY_GROUPS
    from statekeeper.store.spark.spark_import import import_spark_state

    builder = SparkSession.builder.appName("statekeeper-import")
    if args.master:
        builder = builder.master(args.master)
    spark = builder.getOrCreate()
    summary = import_spark_state(
        spark,
        args.spark_checkpoint,
        args.root,
        args.operator,
        operator_id=args.operator_id,
        state_name=args.state_name,
        num_partitions=args.partitions,
        max_key_groups=args.max_key_groups or DEFAULT_MAX_KEY_GROUPS,
        continuation_checkpoint=args.continuation_checkpoint,
        batch_id=args.batch_id,
        on_progress=_progress,
    )
    args.emit(args, summary.to_dict(), summary.summary)
    return 0


def _progress(line: str) -> None:
    sys.stderr.write(f"statekeeper import: {line}\n")
    sys.stderr.flush()


__all__ = ["add_commands", "cmd_import_spark_state"]
