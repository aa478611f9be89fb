"""Every statekeeper error crosses to another process as it is (a rescale's build processes, Spark's executors):
rebuilt with its type, message and attributes whatever its constructor takes."""

from __future__ import annotations

import datetime as dt
import pickle
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statekeeper.errors import StatekeeperError
from statekeeper.sql.errors import LeaseUnavailableError
from statekeeper.store.errors import CheckpointWriteError, ConfigurationError, CorruptFileError
from statekeeper.store.formats.typed_scalars import CorruptStateError
from statekeeper.store.rescale_plan import RescaleError

WHEN = dt.datetime(2026, 12, 5, tzinfo=dt.UTC)
ERRORS: dict[str, Callable[[str], StatekeeperError]] = {
    "a message": RescaleError,
    "a message, a ValueError too": ConfigurationError,
    "a message and a path": lambda text: CorruptFileError(text, "agg/0/1.changelog"),
    "a path and an OSError": lambda text: CheckpointWriteError("agg/0/1.changelog", OSError(28, text)),
    "fields only": lambda text: LeaseUnavailableError("s3://b/ckpt", "agg/0", text, "*", WHEN, 1.5),
    "the typed state's": CorruptStateError,
}


@pytest.mark.parametrize("kind", sorted(ERRORS))
@given(text=st.text(max_size=40))
def test_an_error_crosses_processes_as_it_is(kind: str, text: str) -> None:
    error = ERRORS[kind](text)
    crossed = pickle.loads(pickle.dumps(error))
    assert type(crossed) is type(error) and isinstance(crossed, StatekeeperError)
    assert str(crossed) == str(error) and crossed.args == error.args
    assert vars(crossed) == vars(error) and getattr(crossed, "errno", None) == getattr(error, "errno", None)
