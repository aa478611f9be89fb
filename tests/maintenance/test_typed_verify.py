"""`statekeeper verify --rebuild` decodes typed state: a pickle payload is refused, naming its changelog."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from statekeeper.store import CommitLog, StateStore, StoreConfig
from statekeeper.store.formats.typed_schema import parse_ddl
from statekeeper.store.spark.handle import StatefulProcessorHandle
from statekeeper.store.spark.state import StateContext
from tests.cli_support import run_cli


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def _batch(root: str, tmp: Path, version: int, write: Any) -> None:
    store = StateStore(root, "op", 0, config=StoreConfig(local_dir=str(tmp / f"w{version}")))
    store.load(version)
    write(store)
    result = store.commit()
    store.close()
    CommitLog(store.fm).commit(result.version, {"op": [result.checkpoint_id]})


def _typed_writes(version: int) -> Any:
    def write(store: StateStore) -> None:
        ctx = StateContext(store, 0, parse_ddl("user string"))
        totals = StatefulProcessorHandle(ctx).getValueState("totals", "count long, total long")
        for u in range(5):
            ctx.set_key((f"u{u}",))
            totals.update((version, u))

    return write


def test_verify_rebuild_refuses_a_pickle_value(tmp_path: Path) -> None:
    root = (tmp_path / "root").as_uri()
    for v in range(2):
        _batch(root, tmp_path, v, _typed_writes(v))
    home = tmp_path / "home"
    work = ["--work-dir", str(tmp_path / "work")]
    run_cli("verify", root, "--rebuild", *work, home=home)

    marker = tmp_path / "executed"

    def inject(store: StateStore) -> None:
        cf = store.column_family("totals")
        cf.put(next(k for k, _ in cf.items()), pickle.dumps(_Exploit(marker)))

    _batch(root, tmp_path, 2, inject)
    proc = run_cli("verify", root, "--rebuild", *work, home=home, check=None)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "not a statekeeper typed value" in out and "op/00000/" in out and "changelog" in out
    assert not marker.exists()
