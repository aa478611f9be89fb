"""The crash-point sweep's rescale scenario: an offline rescale (`statekeeper rescale`) killed at every
point it reaches, then a restart that finishes or redoes it and commits the next batch.

The model is the operator's whole state, not one partition's: each batch writes updates to keys led
by their key group (`group_prefix`), each partition applying the keys its layout gives it. A version's
expected state is the fold of the batches up to it (a rescale version changes nothing); the check loads
every partition of the layout each committed version names, and asserts that together they hold
exactly that state and that each holds only the key groups it owns. A kill may leave the old layout or
the new one, never a mix (DESIGN invariant 11).
"""

from __future__ import annotations

import functools
import os
import random
import shutil
import zlib
from typing import TYPE_CHECKING

from statekeeper.maintenance.verify import verify_root
from statekeeper.store import CommitLog, StateStore
from statekeeper.store.files import open_file_manager
from statekeeper.store.formats.commit import CommitRecord
from statekeeper.store.key_groups import KeyGroupLayout, group_at, group_prefix
from statekeeper.store.rescale import execute_rescale, plan_rescale

if TYPE_CHECKING:
    from types import ModuleType

OPERATOR = "rescaled"
GROUPS = 64
KEYSPACE = 60
State = dict[bytes, bytes]


def _base() -> ModuleType:
    """The sweep's shared settings (`tests.reliability.scenarios` registers this scenario: imported late)."""
    from tests.reliability import scenarios

    return scenarios


def stored_key(i: int) -> bytes:
    key = b"r%03d" % i
    return group_prefix(zlib.crc32(key) % GROUPS) + key


@functools.lru_cache(maxsize=1024)
def batch_updates(batch: int) -> tuple[tuple[bytes, bytes | None], ...]:
    """The operator-wide updates of batch `batch` (each key goes to the partition owning its group)."""
    rng = random.Random(f"rescale:{batch}")
    return tuple(
        (stored_key(rng.randrange(KEYSPACE)), None if rng.random() < 0.2 else b"%d:" % batch * rng.randint(1, 30))
        for _ in range(24)
    )


def target_partitions(partitions: int) -> int:
    """Where the sweep rescales to: uneven, so groups both stay in place and move (8 -> 5, 2 -> 3)."""
    return partitions + 1 if partitions < 4 else partitions // 2 + 1


class GroupWriter:
    """The job's driver: commits batches on the layout the head names (the first one: `partitions`)."""

    def __init__(self, root: str, work: str) -> None:
        self.fm = open_file_manager(root)
        self.work = work
        self.log = CommitLog(self.fm)

    def commit(self, count: int) -> int:
        latest = self.log.latest()
        for version in range(latest + 1, latest + 1 + count):
            head = self.log.get(version - 1) if version > 1 else None
            layout = head.layouts[OPERATOR] if head else KeyGroupLayout(_base().PARTITIONS, GROUPS)
            batch = head.batch + 1 if head else 0
            ids: list[str] = []
            for p in range(layout.partitions):
                tag = f"w{p}-{os.urandom(4).hex()}"
                store = StateStore(self.fm, OPERATOR, p, config=_base().store_config(self.work, tag))
                try:
                    store.load(version - 1, head.checkpoint_ids[OPERATOR][p] if head else None)
                    for k, v in batch_updates(batch):
                        if layout.owner(group_at(k)) != p:
                            continue
                        if v is None:
                            store.delete(k)
                        else:
                            store.put(k, v)
                    ids.append(store.commit().checkpoint_id)
                finally:
                    store.close()
                    shutil.rmtree(store.local_dir, ignore_errors=True)
            self.log.commit(version, {OPERATOR: ids}, layouts={OPERATOR: layout})
        return latest + count


def prepare(root: str, work: str) -> None:
    GroupWriter(root, work).commit(_base().TEMPLATE_VERSIONS)


def rescale(root: str, work: str) -> None:
    fm = open_file_manager(root)
    plan = plan_rescale(fm, OPERATOR, target_partitions(_base().PARTITIONS))
    execute_rescale(fm, plan, config=_base().store_config(work, f"rescale-{os.urandom(4).hex()}"), workers=1)


def recover(root: str, work: str) -> None:
    """A restart: redo the rescale unless its commit record landed, then run the next batch."""
    head = CommitLog(open_file_manager(root)).latest()
    if head == _base().TEMPLATE_VERSIONS:
        rescale(root, work)
    GroupWriter(root, work).commit(1)


def expected(records: list[CommitRecord]) -> State:
    """The operator's state after `records` (versions 1.. in order): a rescale changes nothing."""
    state: State = {}
    for record in records:
        if record.change.get(OPERATOR):
            continue
        for k, v in batch_updates(record.batch):
            if v is None:
                state.pop(k, None)
            else:
                state[k] = v
    return state


def check(root: str, work: str, committed_before: int) -> list[str]:
    problems: list[str] = []
    fm = open_file_manager(root)
    log = CommitLog(fm)
    latest = log.latest()
    if latest < committed_before:
        problems.append(f"latest committed version {latest} < {committed_before} committed before the kill")
    records: list[CommitRecord] = []
    for version in range(1, latest + 1):
        record = log.get(version)
        if record is None:
            return [*problems, f"version {version} has no commit record"]
        records.append(record)
        layout, got = record.layouts[OPERATOR], {}
        for p, ckpt in enumerate(record.checkpoint_ids[OPERATOR]):
            tag = f"check-{p}-{os.urandom(4).hex()}"
            probe = StateStore(fm, OPERATOR, p, config=_base().store_config(work, tag))
            try:
                probe.load(version, ckpt)
                items = dict(probe.items())
            except Exception as e:  # a lost file shows here as a load error
                problems.append(f"partition {p} version {version} does not load: {type(e).__name__}: {e}")
                continue
            finally:
                probe.close()
                shutil.rmtree(probe.local_dir, ignore_errors=True)
            if any(layout.owner(group_at(k)) != p for k in items):
                problems.append(f"partition {p} version {version} holds key groups it does not own")
            got.update(items)
        if got != expected(records):
            problems.append(f"version {version} ({layout.partitions} partitions) differs from the model")
    report = verify_root(fm, _base().settings(work))
    return problems + [f"verify: {e}" for e in report.errors]
