"""The Dagster code location for statekeeper maintenance."""

from statekeeper.store.extras import require

require(("sqlalchemy", "alembic", "tqdm"), "maintenance", "the Dagster code location (it runs maintenance)")
require(("dagster",), "dagster", "the Dagster code location")
