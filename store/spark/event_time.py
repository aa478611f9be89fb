"""Time modes, event time and watermarks of a stateful operator, computed the way Spark does.

PySpark's ``transformWithState`` takes ``timeMode="None" | "ProcessingTime" | "EventTime"``. In
event time the input declares an event-time column and a delay (``withWatermark(column, delay)``):

- the watermark of batch ``b`` is ``max(W[b-1], max event time of batches 0..b-1 - delay)``: it moves
  only at batch boundaries and never backwards; the first batch's watermark is 0 (Spark's default);
- in timeMode "EventTime" (only: Spark's transformWithState keeps late rows in the other modes), a row
  whose event time is at or before the *previous* batch's watermark is late and dropped before the
  processor sees it (Spark filters late rows with the previous batch's watermark, SPARK-40925), and
  counted (``num_rows_dropped_by_watermark`` in the progress);
- event-time timers fire when their time is at or before the batch's watermark.

The driver records each batch's watermark and cumulative max event time in the checkpoint
(``spark/<operator>/batches/<batch>.event_time.json``, written before the batch's commit record) so that a
restarted query continues from them and a re-run of a batch sees the same watermark.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from statekeeper.store.errors import CheckpointFileExistsError, ConfigurationError
from statekeeper.store.files import CheckpointFileManager
from statekeeper.store.layout import event_time_path
from statekeeper.store.spark.api import TimerValues
from statekeeper.store.spark.batch_records import read_json_record
from statekeeper.store.spark.time_mode import TimeMode

log = logging.getLogger(__name__)

INITIAL_WATERMARK_MS = 0
"""Spark's watermark before any event time was seen (``OffsetSeqMetadata.batchWatermarkMs``)."""


_UNITS_MS = {
    "millisecond": 1,
    "milliseconds": 1,
    "ms": 1,
    "second": 1000,
    "seconds": 1000,
    "s": 1000,
    "minute": 60_000,
    "minutes": 60_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
    "day": 86_400_000,
    "days": 86_400_000,
    "week": 7 * 86_400_000,
    "weeks": 7 * 86_400_000,
}
_INTERVAL_PART = re.compile(r"\s*(\d+)\s*([a-zA-Z]+)\s*")


def parse_delay_ms(delay: str | int, what: str = "watermark_delay") -> int:
    """A ``withWatermark`` delay ("10 seconds", "1 minute 30 seconds", "interval 5 minutes") or ms."""
    if isinstance(delay, bool):
        raise ConfigurationError(f"{what} must be an interval string or milliseconds, got {delay!r}")
    if isinstance(delay, int):
        if delay < 0:
            raise ConfigurationError(f"{what} must not be negative, got {delay}")
        return delay
    text = str(delay).strip()
    if text.lower().startswith("interval"):
        text = text[len("interval") :]
    total, pos = 0, 0
    for m in _INTERVAL_PART.finditer(text):
        if m.start() != pos or m.group(2).lower() not in _UNITS_MS:
            break
        total += int(m.group(1)) * _UNITS_MS[m.group(2).lower()]
        pos = m.end()
    if pos != len(text) or not text.strip():
        raise ConfigurationError(
            f"{what} {delay!r} is not an interval like '10 seconds' or '1 minute 30 seconds' "
            f"(units: {', '.join(sorted({u.rstrip('s') for u in _UNITS_MS if len(u) > 2}))})"
        )
    return total


@dataclass(frozen=True)
class EventTime:
    """The event-time column of the input and the watermark delay, as ``withWatermark`` declares them."""

    column: str
    delay_ms: int


@dataclass(frozen=True)
class TaskTime:
    """What a partition task needs to know about time (part of the pickled task spec)."""

    mode: TimeMode = TimeMode.PROCESSING_TIME
    event_time_column: str | None = None
    watermark_ms: int = -1
    """For event-time timers and ``TimerValues`` (-1 without event time)."""
    late_watermark_ms: int = -1
    """Rows at or before it are late (the previous batch's watermark); -1: nothing is late."""

    def timer_values(self, processing_ms: int) -> TimerValues:
        """As Spark's: (-1, -1) in time mode None; a query without event time has watermark 0 (Spark's
        initial one) in the other modes."""
        if self.mode is TimeMode.NONE:
            return TimerValues(-1, -1)
        return TimerValues(processing_ms, max(self.watermark_ms, INITIAL_WATERMARK_MS))

    def timer_deadline_ms(self, processing_ms: int) -> int:
        """Timers at or before this fire in the batch (-1: none, in time mode None)."""
        if self.mode is TimeMode.PROCESSING_TIME:
            return processing_ms
        if self.mode is TimeMode.EVENT_TIME:
            return self.watermark_ms
        return -1

    def drop_late(self, data: pa.Table) -> tuple[pa.Table, int, int | None]:
        """(rows that are not late, late rows dropped, max event time in ms of all rows).

        Only timeMode "EventTime" drops late rows, as Spark's transformWithState does; in the other modes
        the watermark still advances (the max event time is kept) but every row reaches the processor."""
        if self.event_time_column is None:
            return data, 0, None
        late = self.late_watermark_ms if self.mode is TimeMode.EVENT_TIME else -1
        return drop_late(data, self.event_time_column, late)


def next_watermark(previous_ms: int, max_event_ms: int | None, delay_ms: int) -> int:
    """Spark's rule: the watermark moves to max event time - delay when that is ahead, never back."""
    if max_event_ms is None:
        return previous_ms
    return max(previous_ms, max_event_ms - delay_ms)


def max_event_ms(values: Any) -> int | None:
    """The max of an Arrow timestamp (or integer ms) column in ms, None when empty or all null."""
    if len(values) == 0:
        return None
    typ = values.type
    m = pc.max(values)
    if not m.is_valid:
        return None
    if pa.types.is_timestamp(typ):
        raw = int(m.cast(pa.int64()).as_py())
        per_ms = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}[typ.unit]
        return raw * 1000 if per_ms is None else raw // per_ms
    v = m.as_py()
    return None if v is None else int(v)


def drop_late(data: pa.Table, column: str, late_watermark_ms: int) -> tuple[pa.Table, int, int | None]:
    """(rows that are not late, number of late rows, max event time in ms of all rows)."""
    col = data.column(column)
    m = max_event_ms(col)
    if late_watermark_ms < 0 or data.num_rows == 0:
        return data, 0, m
    typ = col.type
    if pa.types.is_timestamp(typ):
        threshold = pa.scalar(late_watermark_ms, pa.timestamp("ms", tz=typ.tz)).cast(typ)
    else:
        threshold = pa.scalar(late_watermark_ms, typ)
    keep = pc.fill_null(pc.greater(col, threshold), True)
    kept = data.filter(keep)
    return kept, data.num_rows - kept.num_rows, m


def check_event_time_column(schema_names: list[str], types: dict[str, str], event_time: EventTime) -> None:
    if event_time.column not in schema_names:
        raise ConfigurationError(
            f"event_time_column {event_time.column!r} is not among the input columns {schema_names}"
        )
    typ = types.get(event_time.column, "")
    if typ not in ("timestamp", "timestamp_ntz", "bigint"):
        raise ConfigurationError(
            f"event_time_column {event_time.column!r} is {typ}: it must be a timestamp (or a bigint of ms)"
        )


NEXT_WATERMARK_FIELD = "next_watermark_ms"
"""An event-time record's optional floor for the next batch's watermark: an imported Spark batch's
``nextBatchWatermarkMs`` (its max event time is not in Spark's checkpoint, only the watermark it gave)."""


class WatermarkLog:
    """Per batch, the watermark it ran with and the max event time seen through it, in the checkpoint.

    ``spark/<operator>/batches/<batch 20 digits>.event_time.json`` = ``{"watermark_ms", "max_event_ms"}``,
    written once (exclusive create) after the batch's tasks and before its commit record; a re-run of the
    batch computes the same figures from the same input. Like the batch file beside it, it belongs to the
    version the batch commits and maintenance expires it with that version.
    """

    def __init__(self, fm: CheckpointFileManager, operator: str, delay_ms: int) -> None:
        self.fm = fm
        self.operator = operator
        self.delay_ms = delay_ms

    def path(self, batch_id: int) -> str:
        return event_time_path(self.operator, batch_id)

    def _data(self, batch_id: int) -> dict[str, Any] | None:
        optional = ("max_event_ms", NEXT_WATERMARK_FIELD)
        return read_json_record(
            self.fm, self.path(batch_id), "event-time record", batch_id, ("watermark_ms",), optional
        )

    def read(self, batch_id: int) -> tuple[int, int | None] | None:
        data = self._data(batch_id)
        if data is None:
            return None
        m = data.get("max_event_ms")
        return int(data["watermark_ms"]), None if m is None else int(m)

    def times(self, batch_id: int) -> tuple[int, int, int | None]:
        """(watermark of the batch, watermark for late rows, max event time before the batch)."""
        if batch_id == 0:
            return INITIAL_WATERMARK_MS, INITIAL_WATERMARK_MS, None
        data = self._data(batch_id - 1)
        if data is None:
            if batch_id > 0 and self.read(batch_id - 2) is not None:
                log.warning("event-time record of batch %d is missing: the watermark restarts", batch_id - 1)
            return INITIAL_WATERMARK_MS, INITIAL_WATERMARK_MS, None
        prev_wm, m, carried = int(data["watermark_ms"]), data.get("max_event_ms"), data.get(NEXT_WATERMARK_FIELD)
        prev_max = None if m is None else int(m)
        watermark = next_watermark(prev_wm, prev_max, self.delay_ms)
        return (watermark if carried is None else max(watermark, int(carried))), prev_wm, prev_max

    def record(self, batch_id: int, watermark_ms: int, max_event: int | None) -> None:
        data = json.dumps({"batch_id": batch_id, "watermark_ms": watermark_ms, "max_event_ms": max_event})
        try:
            with self.fm.create(self.path(batch_id), exclusive=True) as f:
                f.write(data.encode())
        except CheckpointFileExistsError:
            pass  # a re-run of the batch: the same input gives the same figures


_WATERMARK_NODE = re.compile(
    r"EventTimeWatermark\s+(?:[0-9a-f-]{36},\s*)?'?`?([^#`,\s]+)`?(?:#\d+)?(?::\s*[\w()]+)?,\s*(.+)"
)


def watermark_of(df: Any) -> EventTime | None:
    """The ``withWatermark(column, delay)`` of a streaming DataFrame, when its plan shows one."""
    try:
        plan = str(df._jdf.queryExecution().logical().toString())
    except Exception:
        return None
    for line in plan.splitlines():
        m = _WATERMARK_NODE.search(line)
        if m:
            try:
                return EventTime(m.group(1), parse_delay_ms(m.group(2).strip()))
            except ConfigurationError:
                return None
    return None


__all__ = [
    "INITIAL_WATERMARK_MS",
    "NEXT_WATERMARK_FIELD",
    "EventTime",
    "TaskTime",
    "WatermarkLog",
    "drop_late",
    "max_event_ms",
    "next_watermark",
    "parse_delay_ms",
    "watermark_of",
]
