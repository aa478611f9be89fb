"""A writer process for the crash tests: it is killed with SIGKILL at arbitrary instants.

    python -m tests.store.helpers.crash_writer files ROOT PROGRESS [--run N] [--die-at SYSCALL:N[:after]]
    python -m tests.store.helpers.crash_writer store ROOT PROGRESS WORKDIR [--die-at ...]

`files` writes self-verifying blobs through the checkpoint file manager: many writes per file,
published exclusively, by `put_file`, or replacing a name non-exclusively. `store` runs the store's
micro-batch loop on two partitions (load the latest committed version, apply the updates of the next
batch, commit both changelogs, write the commit record, every few versions a snapshot) and resumes
where the previous, killed, writer stopped.

Both append a line to PROGRESS once something is durable ("published NAME", "committed V"), after
"ready" once set up, so the test knows what a killed writer reported as done.

`--die-at fsync:3` makes the process SIGKILL itself just before its 3rd `os.fsync` (`:after`: just
after it returns): a crash exactly between two steps of a publish, deterministically.

Everything written is a deterministic function of its name or version (`blob_body`, `batch_updates`),
so the test can check any file and any committed version without having seen the writer run.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import random
import signal
import struct
import sys
from collections.abc import Callable
from typing import Any

BLOB_MAGIC = b"SKTB"
BLOB_HEAD = struct.Struct("<4sH32sQ32s")  # magic, name length, name (padded), body length, sha256(body)
OPERATOR = "crash"
PARTITIONS = 2
CF2 = "second"
SNAPSHOT_EVERY = 4
KEYSPACE = 3000


# -- deterministic content --------------------------------------------------------------------------


def blob_size(name: str) -> int:
    return 64_000 + int(hashlib.sha256(name.encode()).hexdigest()[:6], 16) % 900_000


def blob_body(name: str) -> bytes:
    seed = hashlib.sha256(name.encode()).digest()
    n = blob_size(name)
    block = hashlib.sha512(seed).digest() * 64  # 4 KiB
    reps = n // len(block) + 1
    return (block * reps)[:n]


def blob_bytes(name: str) -> bytes:
    body = blob_body(name)
    return BLOB_HEAD.pack(BLOB_MAGIC, len(name), name.encode(), len(body), hashlib.sha256(body).digest()) + body


def check_blob(data: bytes, path: str) -> str:
    """Raise AssertionError unless `data` is a complete blob; returns the name it was written as."""
    assert len(data) >= BLOB_HEAD.size, f"{path}: {len(data)} bytes, shorter than the blob header"
    magic, name_len, name_b, length, digest = BLOB_HEAD.unpack_from(data)
    assert magic == BLOB_MAGIC, f"{path}: bad magic {magic!r}"
    name = str(name_b[:name_len].decode())
    body = data[BLOB_HEAD.size :]
    assert len(body) == length, f"{path}: body has {len(body)} bytes, header says {length}"
    assert hashlib.sha256(body).digest() == digest, f"{path}: body does not match its checksum"
    assert body == blob_body(name), f"{path}: body is not the content of blob {name}"
    return name


Updates = dict[str, list[tuple[bytes, bytes | None]]]


@functools.lru_cache(maxsize=4096)
def batch_updates(partition: int, version: int) -> Updates:
    """The updates of the batch that produces `version` (>= 1) of `partition`, per column family."""
    rng = random.Random(f"{partition}:{version}")
    default: list[tuple[bytes, bytes | None]] = []
    for _ in range(1200):
        k = rng.randrange(KEYSPACE)
        default.append((b"k%05d" % k, b"%d:%d:%d|" % (partition, version, k) * rng.randrange(1, 30)))
    for _ in range(200):
        default.append((b"k%05d" % rng.randrange(KEYSPACE), None))
    second: list[tuple[bytes, bytes | None]] = [(b"s%03d" % rng.randrange(100), b"v%d" % version) for _ in range(15)]
    if version % 3 == 0:
        second.append((b"s%03d" % rng.randrange(100), None))
    return {"default": default, CF2: second}


def apply(state: dict[str, dict[bytes, bytes]], updates: Updates) -> None:
    for cf, records in updates.items():
        target = state.setdefault(cf, {})
        for k, v in records:
            if v is None:
                target.pop(k, None)
            else:
                target[k] = v


# -- crash injection --------------------------------------------------------------------------------


def install_die_at(spec: str) -> None:
    """SIGKILL this process at the N-th call of os.<syscall> (before it, or after with ':after')."""
    parts = spec.split(":")
    name, nth, when = parts[0], int(parts[1]), (parts[2] if len(parts) > 2 else "before")
    real: Callable[..., Any] = getattr(os, name)
    calls = 0

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == nth and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        result = real(*args, **kwargs)
        if calls == nth and when == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(os, name, wrapper)


class Progress:
    def __init__(self, path: str) -> None:
        self._f = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process

    def say(self, line: str) -> None:
        self._f.write(line + "\n")
        self._f.flush()


# -- the two writers --------------------------------------------------------------------------------


def run_files(root: str, progress: Progress, run: int, count: int) -> None:
    from statekeeper.store.files import open_file_manager

    fm = open_file_manager(root)
    local = os.path.join(os.path.dirname(progress._f.name), f"upload-{run}.tmp")
    progress.say("ready")
    for i in range(count):
        name = f"r{run:03d}-{i:05d}"
        data = blob_bytes(name)
        kind = i % 4
        if kind == 3:  # put_file of a complete local file (a new one: published sources stay unchanged)
            if os.path.exists(local):
                os.unlink(local)
            with open(local, "wb") as f:
                f.write(data)
            fm.put_file(local, f"blobs/{name}.blob")
            published = f"blobs/{name}.blob"
        elif kind == 2:  # a non-exclusive replace of a shared name (content-addressed files do this)
            published = f"shared/slot{i % 3}.blob"
            with fm.create(published, exclusive=False) as out:
                out.write(data)
        else:  # exclusive create, written in many pieces
            published = f"blobs/{name}.blob"
            with fm.create(published) as out:
                for off in range(0, len(data), 16_384):
                    out.write(data[off : off + 16_384])
        progress.say(f"published {published} {name}")


def run_store(root: str, progress: Progress, work: str, max_versions: int) -> None:
    from statekeeper.store import CommitLog, StateStore, StoreConfig
    from statekeeper.store.snapshot import write_snapshot

    config = StoreConfig(block_bytes=4096, snapshot_check_interval=3)
    stores = [
        StateStore(root, OPERATOR, p, config=StoreConfig(**{**config.__dict__, "local_dir": f"{work}/p{p}"}))
        for p in range(PARTITIONS)
    ]
    log = CommitLog(stores[0].fm)
    latest = log.latest()
    prev_ids: list[str | None] = [None] * PARTITIONS  # None: read the committed id from the commit record
    for s in stores:
        s.load(latest)  # rebuilds from the checkpoint: this run starts with an empty work dir
    progress.say(f"ready {latest}")
    for version in range(latest + 1, latest + 1 + max_versions):
        ids = []
        for p, s in enumerate(stores):
            s.load(version - 1, prev_ids[p])  # after the first batch: reuses the local DB it just committed
            for cf, records in batch_updates(p, version).items():
                for k, v in records:
                    if v is None:
                        s.delete(k, cf)
                    else:
                        s.put(k, v, cf)
            ids.append(s.commit().checkpoint_id)
        log.commit(version, {OPERATOR: ids})
        prev_ids = list(ids)
        progress.say(f"committed {version}")
        if version % SNAPSHOT_EVERY == 0:
            for p, s in enumerate(stores):
                write_snapshot(s.fm, s.store_id, version, ids[p], s.db, s.local_dir)
            progress.say(f"snapshot {version}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("files", "store"))
    ap.add_argument("root")
    ap.add_argument("progress")
    ap.add_argument("work", nargs="?")
    ap.add_argument("--run", type=int, default=0)
    ap.add_argument("--count", type=int, default=10**9)
    ap.add_argument("--die-at")
    args = ap.parse_args(argv)
    if args.die_at:
        install_die_at(args.die_at)
    progress = Progress(args.progress)
    if args.mode == "files":
        run_files(args.root, progress, args.run, args.count)
    else:
        assert args.work, "store mode needs a work directory"
        run_store(args.root, progress, args.work, args.count)
    progress.say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
