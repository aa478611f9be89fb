"""The chain each snapshot ended, read from the maintainer's catalog after a fleet run.

The bench samples the chains every few seconds from outside; a chain is longest just before its snapshot
lands, which samples mostly miss. The catalog keeps a row for every snapshot it learned of (expired ones
too) with the time its manifest was written, and every version with its commit time: the chain a snapshot
ended is the newest version its store had committed by then, less the store's previous snapshot.
"""

from __future__ import annotations

import bisect
import datetime as dt
import glob
import os
from collections import defaultdict

from bench.commit import percentile


def chains_at_snapshots(base: str) -> list[int]:
    """The chain each snapshot ended, over every store of the catalog found under `base` (none: no catalog)."""
    from sqlalchemy import create_engine, select

    from statekeeper.sql.models import Snapshot, Version

    found = glob.glob(os.path.join(base, "**", "catalog.db"), recursive=True)
    if not found:
        return []
    engine = create_engine(f"sqlite:///{found[0]}")
    try:
        with engine.connect() as conn:
            commits: dict[int, tuple[list[dt.datetime], list[int]]] = defaultdict(lambda: ([], []))
            versions = select(Version.store_id, Version.version, Version.committed_at).order_by(Version.version)
            for sid, version, committed_at in conn.execute(versions):
                times, numbers = commits[sid]
                times.append(committed_at)
                numbers.append(version)
            snapshots = select(Snapshot.store_id, Snapshot.version, Snapshot.created_at).order_by(
                Snapshot.store_id, Snapshot.version
            )
            chains: list[int] = []
            previous: dict[int, int] = {}
            for sid, version, created_at in conn.execute(snapshots):
                times, numbers = commits[sid]
                newest = bisect.bisect_right(times, created_at)
                latest = max(numbers[newest - 1] if newest else version, version)
                chains.append(latest - previous.get(sid, 0))
                previous[sid] = version
            return chains
    finally:
        engine.dispose()


def landing_summary(chains: list[int], threshold: int) -> str:
    """``p50 / p90 / max (n of N over)`` of the chains snapshots ended; over: beyond 2 x threshold."""
    if not chains:
        return "-"
    over = sum(1 for c in chains if c > 2 * threshold)
    p50, p90 = percentile(chains, 50), percentile(chains, 90)
    return f"{p50:.0f} / {p90:.0f} / {max(chains)} ({over} of {len(chains)} over)"
