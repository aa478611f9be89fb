"""Settings of the maintenance operations, validated once so a bad value never reaches a deletion.

Every field has a ``STATEKEEPER_<FIELD>`` environment variable (`MaintenanceSettings.from_env`), so
the command line, a Dagster resource and a cron job configure the same thing the same way.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from enum import Enum, StrEnum
from typing import Any

from statekeeper.store.errors import ConfigurationError

ENV_PREFIX = "STATEKEEPER_"


class SnapshotSchedule(StrEnum):
    """When a store is due for its next snapshot (`MaintenanceSettings.snapshot_due_at`)."""

    THRESHOLD = "threshold"
    """Once its chain reaches the threshold, less up to `snapshot_spread` of it (a point drawn per store and chain)."""
    PHASE = "phase"
    """At the versions of the store's own phase, one in every `threshold`: the stores of an operator are due
    evenly over the versions, one threshold's share a version, whatever rounds built their last snapshots."""


def _fraction(key: str) -> float:
    """A number in [0, 1) drawn from `key`: the same in every process and run."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") / 2**64


@dataclass(frozen=True)
class MaintenanceSettings:
    snapshot_threshold: int = 10
    """Snapshot a store once this many changelogs were committed since its last snapshot."""
    snapshot_spread: float = 0.0
    """Snapshot up to this fraction of `snapshot_threshold` early, at a point drawn per store and snapshot
    (`snapshot_due_at`). The partitions of one operator commit in lock step, so with 0 they all become due in the
    same cycle, whose round builds every one while their chains grow; with 0.5 each is due somewhere between half
    the threshold and the threshold, a cycle builds its share and a fleet's snapshot work is spread over the
    cycles. No chain gets longer for it; a store snapshots up to 1 / (1 - spread) times as often."""
    snapshot_schedule: SnapshotSchedule = SnapshotSchedule.THRESHOLD
    """When a store is due (`SnapshotSchedule`): at the threshold (less the spread's draw), or at its own phase of
    the versions, every `snapshot_threshold` of them. With `PHASE` a store is due early once after a round that built
    it off its phase, and every round after that builds a steady share of the fleet."""
    snapshot_round_seconds: float = 0.0
    """How long a snapshot run starts the builds of stores still under the threshold (due early by
    `snapshot_spread`, or at their phase); later ones are left for the next run ("deferred"), so a long round does
    not hold up the maintenance loop's next cycle and the expiry it starts with. A store at the threshold,
    requested, or needing a repair is always built. 0: no bound. Builds on this process or its build processes
    only (not Spark's)."""
    min_versions_to_retain: int = 20
    """Newest committed versions of each store that stay loadable (at least 1)."""
    orphan_grace_seconds: float = 3600.0
    """Files that are not committed are deleted only when older than this (they may be in flight)."""
    load_grace_seconds: float = 0.0
    """A new snapshot becomes the expiry base only when older than this. Loads need no wait (one that
    loses a file to expiry starts over from the newer snapshot); a grace longer than the slowest load
    spares such a load the second start, at the cost of keeping the older snapshot that long."""
    parallelism: int = 4
    """Stores worked on at once, and delete batches in flight at once."""
    build_processes: int = 0
    """Worker processes that build snapshots, each holding the replicas of its share of the stores
    (`statekeeper.maintenance.build_processes`): a long-running maintainer of many stores then uses more
    than one core. 0: the builds run on this process's threads."""
    lease_ttl_seconds: float = 600.0
    """A crashed maintainer blocks a store for at most this long (the lease is renewed while running)."""
    lease_timeout_seconds: float = 0.0
    """How long to wait for another maintainer's lease on a store; 0 fails at once."""
    work_dir: str | None = None
    """Local directory for replicas of stores between snapshot runs; None: a per-process temp dir."""
    delete_batch_size: int = 1000
    """Paths per delete request (S3 DeleteObjects takes at most 1000)."""
    catalog_history_seconds: float = 86400.0
    """The catalog drops the rows of deleted files, snapshots and expired versions, and the maintenance runs,
    once older than this (expiry prunes it): a fleet's catalog stays bounded as its checkpoints do."""

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, why: str) -> None:
            if not ok:
                raise ConfigurationError(f"invalid maintenance setting {name}={getattr(self, name)!r}: {why}")

        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "work_dir":
                need(value is None or (isinstance(value, str) and value.strip() != ""), f.name, "empty path")
                continue
            if f.name == "snapshot_schedule":
                object.__setattr__(self, f.name, _schedule(value, f.name))
                continue
            numeric = isinstance(value, int | float) and not isinstance(value, bool)
            need(numeric and math.isfinite(value), f.name, "expected a finite number")
            if f.type in ("int", int):
                need(isinstance(value, int), f.name, "expected an integer")
        need(self.snapshot_threshold >= 1, "snapshot_threshold", "must be >= 1")
        need(0 <= self.snapshot_spread < 1, "snapshot_spread", "must be within [0, 1)")
        need(
            not (self.snapshot_spread and self.snapshot_schedule is SnapshotSchedule.PHASE),
            "snapshot_spread",
            "applies to the threshold schedule; the phase schedule (snapshot_schedule=phase) spreads the stores itself",
        )
        need(self.snapshot_round_seconds >= 0, "snapshot_round_seconds", "must be >= 0 (0: no bound)")
        need(self.min_versions_to_retain >= 1, "min_versions_to_retain", "at least 1 version must be retained")
        need(self.orphan_grace_seconds >= 0, "orphan_grace_seconds", "must be >= 0")
        need(self.load_grace_seconds >= 0, "load_grace_seconds", "must be >= 0")
        need(1 <= self.parallelism <= 256, "parallelism", "must be within [1, 256]")
        need(0 <= self.build_processes <= 64, "build_processes", "must be within [0, 64]")
        need(self.lease_ttl_seconds > 0, "lease_ttl_seconds", "must be > 0")
        need(self.lease_timeout_seconds >= 0, "lease_timeout_seconds", "must be >= 0")
        need(1 <= self.delete_batch_size <= 1000, "delete_batch_size", "must be within [1, 1000]")
        need(self.catalog_history_seconds >= 0, "catalog_history_seconds", "must be >= 0")

    @staticmethod
    def env_name(field_name: str) -> str:
        return ENV_PREFIX + field_name.upper()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> MaintenanceSettings:
        """Defaults, overridden by ``STATEKEEPER_<FIELD>`` variables, overridden by `overrides` (not None)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(cls.env_name(f.name))
            if raw is None or raw.strip() == "":
                continue
            if f.name == "work_dir":
                values[f.name] = raw
                continue
            if f.name == "snapshot_schedule":
                values[f.name] = _schedule(raw.strip(), cls.env_name(f.name))
                continue
            try:
                values[f.name] = int(raw) if f.type in ("int", int) else float(raw)
            except ValueError:
                raise ConfigurationError(
                    f"invalid maintenance setting {cls.env_name(f.name)}={raw!r}: expected a number"
                ) from None
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise ConfigurationError(f"unknown maintenance setting(s) {sorted(unknown)}")
        from_env = set(values)
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls(**values)
        except ConfigurationError:
            for name in sorted(from_env - {k for k, v in overrides.items() if v is not None}):
                try:  # name the variable a bad value came from
                    cls(**{name: values[name]})
                except ConfigurationError as e:
                    raise ConfigurationError(f"{e} (from the environment variable {cls.env_name(name)})") from None
            raise

    def snapshot_due_at(self, operator: str, partition: int, since: int) -> int:
        """The chain length at which the store is due for a snapshot, its chain starting at version `since` (its
        newest snapshot, or a full-state changelog; 0: none). The same in every process and run (the maintenance
        loop and the checkpoint sensor draw the same points).

        `THRESHOLD`: the threshold, less up to `snapshot_spread` of it by a hash of the store and `since`; the stores
        of one operator spread evenly over the range, and each store draws a new point for each snapshot, so stores
        whose points a cycle's cadence rounds alike do not stay in step. A round that built many stores at once (a
        fleet's first) still lumps the next rounds into the spread's range, and they even out only over several
        snapshots.

        `PHASE`: the distance to the store's next phase version, `v % threshold == phase`, the phase being the
        operator's hash plus the partition (the partitions of an operator take the phases in turn). Within the
        threshold always; a store built on its phase is due again a threshold later, and one built off it (a
        lumped round, a deferral) once early, back on its phase: a fleet's builds are a steady share of its stores
        a version."""
        threshold = self.snapshot_threshold
        if self.snapshot_schedule is SnapshotSchedule.PHASE:
            phase = (int(_fraction(operator) * threshold) + partition) % threshold
            return (phase - since - 1) % threshold + 1
        if not self.snapshot_spread:
            return threshold
        drawn = _fraction(f"{operator}/{partition}/{since}")
        return max(1, threshold - int(self.snapshot_spread * threshold * drawn))

    def with_(self, **changes: Any) -> MaintenanceSettings:
        """A copy with some settings changed (validated again)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_json(self) -> dict[str, Any]:
        return {f.name: (v.value if isinstance(v := getattr(self, f.name), Enum) else v) for f in fields(self)}


def _schedule(value: str, name: str) -> SnapshotSchedule:
    """`value` as a `SnapshotSchedule`, or a `ConfigurationError` naming the setting and the choices."""
    try:
        return SnapshotSchedule(value)
    except ValueError:
        choices = ", ".join(s.value for s in SnapshotSchedule)
        raise ConfigurationError(f"invalid maintenance setting {name}={value!r}: expected one of {choices}") from None


__all__ = ["MaintenanceSettings", "SnapshotSchedule"]
