"""Timers that fire while the input is quiet: a tick stream that makes Spark run a batch when one is due.

A ``foreachBatch`` query gets no no-data batches, so without help a timer the clock or the watermark has
passed fires only when the next row arrives. With ``quiet_timers=True`` :meth:`StatefulOperator.start`
unions the user's stream with a one-column stream from this module's Python data source
(``statekeeper_ticks``), whose offset moves only when the operator has a timer due:

- after each batch the driver writes a small **tick record** on the driver host (:class:`TickChannel`): the
  batch id and when the earliest pending timer is due -- a processing-time timer at its time; an event-time
  timer "now" when it is at or below the watermark the next batch will run with (the max event time so far
  minus the delay, as Spark's own no-data batch uses), else never (only new input moves the watermark) -- or
  the earliest TTL'd value expires (processing time, in either mode), whichever comes first;
- Spark polls the source every trigger; its reader (``latestOffset``, run in a Python process Spark starts on
  the driver host, hence a file rather than memory) returns the next offset when the record is due and was
  not ticked yet (the offset remembers the batch it ticked after), else the committed offset: no batch;
- the tick row makes Spark run a micro-batch; the driver drops tick rows before anything else, so the batch
  is a batch with no input rows: every partition runs, due timers fire, and it commits its version like any
  other batch. Spark checkpoints the tick offsets, so a restart re-runs an unfinished tick batch with the
  same commit semantics (the commit record of its version decides, as for every batch).

The record lives outside the checkpoint root (a temp directory of the driver host, one small file per query,
keyed by root, operator and checkpoint location): it is a hint, never state. A restarted query whose record
is gone (another host) ticks once at its first poll so that a timer that fell due while it was down fires
without waiting for input; a brand-new query does not. Over Spark Connect the server runs both the batches
and the reader, so the record is on the server's host; the path is chosen on the client (its temp directory
name must exist or be creatable on the server).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from statekeeper.store.spark.time_mode import TimeMode

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

TICK_COL = "__sk_tick"
SOURCE_NAME = "statekeeper_ticks"
CHANNEL_OPTION = "channel"
CHANNEL_DIR = "statekeeper-ticks"
_MAX_RECORD_BYTES = 4096


@dataclass(frozen=True)
class TickRecord:
    """What the driver knew after batch `batch_id`: when its earliest pending timer is due (None: never
    without new input)."""

    batch_id: int
    due_at_ms: int | None

    def due(self, now_ms: int) -> bool:
        return self.due_at_ms is not None and now_ms >= self.due_at_ms


def due_at_ms(
    mode: TimeMode, next_timer_ms: int | None, next_watermark_ms: int | None, next_expiry_ms: int | None = None
) -> int | None:
    """When the next batch would fire a timer or evict TTL'd state with no new input (0: now; None: not without
    input). A TTL expires by processing time in every time mode, as Spark's no-data batches evict it."""
    due: int | None = None
    if next_timer_ms is not None and mode is TimeMode.PROCESSING_TIME:
        due = next_timer_ms
    elif next_timer_ms is not None and next_watermark_ms is not None and mode is TimeMode.EVENT_TIME:
        due = 0 if next_timer_ms <= next_watermark_ms else None
    if next_expiry_ms is not None and mode is not TimeMode.NONE:
        due = next_expiry_ms if due is None else min(due, next_expiry_ms)
    return due


def channel_path(root: str, operator: str, checkpoint_location: str, directory: str | None = None) -> str:
    """The driver-host file of one query's tick record: the same on a restart of the query on this host."""
    digest = hashlib.sha256(f"{root}\0{operator}\0{checkpoint_location}".encode()).hexdigest()[:32]
    return os.path.join(directory or tempfile.gettempdir(), CHANNEL_DIR, f"{digest}.json")


@dataclass(frozen=True)
class TickChannel:
    """The tick record file: written by the driver after each batch, read by the tick source's reader."""

    path: str

    def write(self, record: TickRecord) -> None:
        """Replace the record atomically (a reader sees the old one or the new one, never a part)."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"batch_id": record.batch_id, "due_at_ms": record.due_at_ms}, f)
        os.replace(tmp, self.path)

    def read(self) -> TickRecord | None:
        """The current record; None when there is none or it does not parse (then no tick is raised)."""
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.loads(f.read(_MAX_RECORD_BYTES))
            due = data["due_at_ms"]
            return TickRecord(int(data["batch_id"]), None if due is None else int(due))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:  # a file anyone may write
            log.warning("statekeeper ticks: unreadable tick record %s (%s): no tick raised", self.path, e)
            return None

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)


def next_offset(start: dict[str, Any], record: TickRecord | None, now_ms: int, *, first_poll: bool) -> dict[str, Any]:
    """The tick source's latest offset: one more tick when a timer is due and this record was not ticked yet.

    ``start`` is the offset Spark committed last (``{"tick": n, "after": batch ticked after}``); returning it
    unchanged means no new data, so no batch. `first_poll` (a restarted query's reader, with no record to go
    by) ticks once so that timers that fell due while the query was down fire."""
    tick, after = int(start.get("tick", 0)), int(start.get("after", -1))
    if record is None:
        return {"tick": tick + 1, "after": after} if first_poll else start
    if record.batch_id != after and record.due(now_ms):
        return {"tick": tick + 1, "after": record.batch_id}
    return start


def register(spark: Any) -> None:
    """Register the tick source with `spark` (classic or Connect); a second registration is harmless."""
    spark.dataSource.register(_source_class())


def with_ticks(df: DataFrame, channel: TickChannel) -> DataFrame:
    """`df` with a null `TICK_COL`, unioned with the tick stream (null user columns, the tick number)."""
    from pyspark.sql import functions as sf

    spark = df.sparkSession
    register(spark)
    ticks = spark.readStream.format(SOURCE_NAME).option(CHANNEL_OPTION, channel.path).load()
    fields = df.schema.fields
    ticks = ticks.select(*[sf.lit(None).cast(f.dataType).alias(f.name) for f in fields], sf.col(TICK_COL))
    return df.withColumn(TICK_COL, sf.lit(None).cast("long")).unionByName(ticks)


def without_ticks(df: DataFrame) -> DataFrame:
    """The batch's user rows: tick rows dropped, the tick column removed (part of the batch's plan, no job)."""
    from pyspark.sql import functions as sf

    if TICK_COL not in df.columns:
        return df
    return df.filter(sf.col(TICK_COL).isNull()).drop(TICK_COL)


def _source_class() -> type:
    """The data source classes, built on first use so that this module imports without PySpark."""
    global _SOURCE
    if _SOURCE is not None:
        return _SOURCE
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class TickPartition(InputPartition):
        def __init__(self, tick: int) -> None:
            self.tick = tick

    class TickReader(DataSourceStreamReader):
        """Runs in the Python process Spark starts for the source on the driver host."""

        def __init__(self, options: dict[str, str]) -> None:
            self.channel = TickChannel(options[CHANNEL_OPTION])
            self.fresh = False
            self.polled = False

        def initialOffset(self) -> dict[str, Any]:  # noqa: N802 - PySpark's API
            self.fresh = True  # called for a new query only: nothing can be due before its first batch
            return {"tick": 0, "after": -1}

        def latestOffset(self, start: dict[str, Any], limit: Any = None) -> dict[str, Any]:  # noqa: N802
            first = not self.polled and not self.fresh
            self.polled = True
            return next_offset(start, self.channel.read(), int(time.time() * 1000), first_poll=first)

        def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[TickPartition]:
            return [] if start == end else [TickPartition(int(end["tick"]))]

        def read(self, partition: InputPartition) -> Iterator[tuple[int]]:
            yield (int(getattr(partition, "tick")),)  # noqa: B009 - a TickPartition

        def commit(self, end: dict[str, Any]) -> None:
            """Nothing to release: a tick is a number."""

    class TickSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return SOURCE_NAME

        def schema(self) -> str:
            return f"{TICK_COL} long"

        def streamReader(self, schema: Any) -> TickReader:  # noqa: N802 - PySpark's API
            return TickReader(dict(self.options))

    _SOURCE = TickSource
    return TickSource


_SOURCE: type | None = None


__all__ = [
    "CHANNEL_DIR",
    "SOURCE_NAME",
    "TICK_COL",
    "TickChannel",
    "TickRecord",
    "channel_path",
    "due_at_ms",
    "next_offset",
    "register",
    "with_ticks",
    "without_ticks",
]
