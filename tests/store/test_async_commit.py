"""Asynchronous checkpointing: commit returns when the changelog is durable locally; upload in background."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from statekeeper.store import CommitLog, StateStore, StoreConfig
from statekeeper.store.async_upload import AsyncUploader
from statekeeper.store.files import CheckpointFileManager, open_file_manager


class _GatedFM:
    """Delegates to a real manager; put_file blocks until released, or fails when told to."""

    def __init__(self, inner: CheckpointFileManager) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.fail = False
        self.started = threading.Event()

    def put_file(self, local_path: str, path: str, *, exclusive: bool = True) -> int:
        self.started.set()
        assert self.gate.wait(10)
        if self.fail:
            raise OSError(f"injected upload failure for {path}")
        return self.inner.put_file(local_path, path, exclusive=exclusive)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _store(fm: Any, tmp_path: Any, name: str) -> StateStore:
    return StateStore(fm, "op", 0, config=StoreConfig(local_dir=str(tmp_path / name)))


def test_uploader_is_a_file_manager(checkpoint_root: str, tmp_path: Any) -> None:
    up = AsyncUploader(open_file_manager(checkpoint_root), str(tmp_path / "stage"))
    assert isinstance(up, CheckpointFileManager)
    assert up.root_uri == open_file_manager(checkpoint_root).root_uri
    up.close()


def test_commit_returns_before_upload_and_wait_makes_it_durable(checkpoint_root: str, tmp_path: Any) -> None:
    real = open_file_manager(checkpoint_root)
    gated = _GatedFM(real)
    up = AsyncUploader(gated, str(tmp_path / "stage"))
    store = _store(up, tmp_path, "a").load(0)
    store.column_family("c").put(b"k", b"v1")
    result = store.commit()  # returns although the upload is blocked
    path = store.store_id.changelog(result.version, result.checkpoint_id)
    pending = up.pending(path)
    assert pending is not None and not pending.done()
    assert not real.exists(path)
    # the changelog is durable locally under the staging name while the upload waits
    staged = os.listdir(tmp_path / "stage")
    assert len(staged) == 1 and os.path.getsize(tmp_path / "stage" / staged[0]) == pending.size
    gated.gate.set()
    done = pending.result(10)
    assert done.size == pending.size and done.upload_ms >= 0
    assert real.exists(path) and real.info(path).size == pending.size
    assert os.listdir(tmp_path / "stage") == []
    CommitLog(real).commit(1, {"op": [result.checkpoint_id]})
    # the same store goes on warm; a fresh one rebuilds from the uploaded changelog
    store.load(1, result.checkpoint_id)
    assert store.last_load is not None and store.last_load.reused_local
    fresh = _store(real, tmp_path, "b").load(1)
    assert fresh.column_family("c").get(b"k") == b"v1"
    fresh.close()
    store.close()
    up.close()


def test_failed_upload_raises_and_publishes_nothing(checkpoint_root: str, tmp_path: Any) -> None:
    real = open_file_manager(checkpoint_root)
    store = _store(real, tmp_path, "s").load(0)
    store.column_family("c").put(b"k", b"v1")
    r1 = store.commit()
    CommitLog(real).commit(1, {"op": [r1.checkpoint_id]})
    store.close()

    gated = _GatedFM(real)
    gated.fail = True
    gated.gate.set()
    up = AsyncUploader(gated, str(tmp_path / "stage"))
    s2 = _store(up, tmp_path, "t").load(1)
    s2.column_family("c").put(b"k", b"v2")
    r2 = s2.commit()
    pending = up.pending(s2.store_id.changelog(2, r2.checkpoint_id))
    assert pending is not None
    with pytest.raises(OSError, match="injected upload failure"):
        pending.result(10)
    with pytest.raises(OSError):
        up.wait_all(10)
    assert not real.exists(pending.path)
    assert os.listdir(tmp_path / "stage") == []
    # nothing was lost: version 1 still loads, version 2 is simply not there to commit
    again = _store(real, tmp_path, "u").load(1)
    assert again.column_family("c").get(b"k") == b"v1"
    again.close()
    s2.close()
    up.close()


def test_sync_use_waits_in_place(checkpoint_root: str, tmp_path: Any) -> None:
    real = open_file_manager(checkpoint_root)
    up = AsyncUploader(real, str(tmp_path / "stage"), max_workers=1)
    store = _store(up, tmp_path, "a").load(0)
    for i in range(3):
        store.column_family("c").put(b"k%d" % i, b"v")
        r = store.commit()
        up.wait_all(10)
        CommitLog(real).commit(r.version, {"op": [r.checkpoint_id]})
        store.load(r.version, r.checkpoint_id)
    assert len(up.wait_all(10)) == 3
    up.close()
    with pytest.raises(Exception, match="closed"):
        up.put_file(__file__, "x")
    store.close()
