"""The Dagster code location for statekeeper maintenance."""

if __name__ != "statekeeper.orchestration":  # one path per module: a bare `orchestration` would be a second copy
    raise ImportError(f"import statekeeper.orchestration, not {__name__}: the folders import only as statekeeper.*")

from statekeeper.store.extras import require

require(("sqlalchemy", "alembic", "tqdm"), "maintenance", "the Dagster code location (it runs maintenance)")
require(("dagster",), "dagster", "the Dagster code location")
