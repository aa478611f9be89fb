"""Processors written against PySpark's own ``StatefulProcessor`` API, run unchanged by both PySpark's
``transformWithState`` and statekeeper (the parity tests compare the two batch by batch)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

from statekeeper.store.spark import StatefulProcessor as SkProcessor

OUTPUT = "user string, kind string, count long, pages long, watermark long, expiry long"
INPUT = "user string, page string, ts timestamp"


class _Sessions:
    """Per user: events counted, pages in a map, event times in a list; an event-time timer 5 s after
    the user's latest event closes the session (output "timer", state cleared)."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "n long")
        self.times = handle.getListState("times", "ms long")
        self.pages = handle.getMapState("pages", "page string", "hits long")

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:
        self.count.update((int(initialState.n),))

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        from pyspark.sql import Row

        n = self.count.get()[0] if self.count.exists() else 0
        latest = max((t for (t,) in self.times.get()), default=0)
        for r in rows:
            n += 1
            ms = int(r.ts.timestamp() * 1000)
            latest = max(latest, ms)
            self.times.appendValue((ms,))
            hits = self.pages.getValue((r.page,))
            self.pages.updateValue((r.page,), ((hits[0] if hits else 0) + 1,))
        self.count.update((n,))
        for t in list(self.handle.listTimers()):
            self.handle.deleteTimer(t)
        self.handle.registerTimer(latest + 5000)
        pages = sum(1 for _ in self.pages.iterator())
        yield Row(
            user=key[0], kind="input", count=n, pages=pages, watermark=timerValues.getCurrentWatermarkInMs(), expiry=-1
        )

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
        from pyspark.sql import Row

        n = self.count.get()[0] if self.count.exists() else 0
        pages = sum(1 for _ in self.pages.values())
        self.count.clear()
        self.times.clear()
        self.pages.clear()
        yield Row(
            user=key[0],
            kind="timer",
            count=n,
            pages=pages,
            watermark=timerValues.getCurrentWatermarkInMs(),
            expiry=expiredTimerInfo.getExpiryTimeInMs(),
        )

    def close(self) -> None:
        pass


def pyspark_sessions() -> Any:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class PySparkSessions(_Sessions, StatefulProcessor):
        pass

    return PySparkSessions()


class Sessions(_Sessions, SkProcessor):
    """The same logic as statekeeper's processor."""


class SlowSessions(Sessions):
    """Sessions whose partition tasks take `sleep_s` (so a test can kill the driver mid-batch)."""

    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s

    def init(self, handle: Any) -> None:
        import time

        time.sleep(self.sleep_s)
        super().init(handle)


PANDAS_OUTPUT = "user string, events long, seeded long, distinct_pages long, recent string"


class _PageTally:
    """transformWithStateInPandas flavour, timeMode "None": pandas in and out, map and list operations."""

    def init(self, handle: Any) -> None:
        self.seeded = handle.getValueState("seeded", "n long")
        self.pages = handle.getMapState("pages", "page string", "hits long")
        self.recent = handle.getListState("recent", "page string")

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:
        self.seeded.update((int(initialState["n"].sum()),))
        self.recent.put([(p,) for p in initialState["page"]])
        for page, n in zip(initialState["page"], initialState["n"], strict=True):
            self.pages.updateValue((page,), (int(n),))

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        pd = importlib.import_module("pandas")
        events = 0
        for pdf in rows:
            events += len(pdf)
            pages = list(pdf["page"])
            for page in pages:
                hits = self.pages.getValue((page,)) if self.pages.containsKey((page,)) else (0,)
                self.pages.updateValue((page,), (hits[0] + 1,))
            self.recent.appendList([(p,) for p in pages])
        if self.pages.containsKey(("drop",)):
            self.pages.removeKey(("drop",))
        recent = [p for (p,) in self.recent.get()][-3:]
        self.recent.put([(p,) for p in recent])
        seeded = self.seeded.get()[0] if self.seeded.exists() else 0
        distinct = len(list(self.pages.keys()))
        yield pd.DataFrame(
            {
                "user": [key[0]],
                "events": [events],
                "seeded": [seeded],
                "distinct_pages": [distinct],
                "recent": [",".join(sorted(recent))],
            }
        )


def pyspark_page_tally() -> Any:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class PySparkPageTally(_PageTally, StatefulProcessor):
        pass

    return PySparkPageTally()


class PageTally(_PageTally, SkProcessor):
    """The same logic as statekeeper's processor."""
