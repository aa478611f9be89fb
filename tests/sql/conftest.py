"""Catalog fixtures: every catalog test runs on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from statekeeper.sql import Catalog, upgrade
from tests.postgres_support import PostgresServer

DATABASES = ["sqlite", "postgresql"]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """STATEKEEPER_TEST_PG_URL, else a server started (and installed if needed) for this session."""
    server = PostgresServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture(params=DATABASES)
def db_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def new_db_url(
    db_backend: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[], str]]:
    """Makes empty databases of the test's backend (dropped afterwards)."""
    made: list[str] = []
    server: PostgresServer | None = None
    if db_backend == "postgresql":
        server = request.getfixturevalue("postgres_server")

    def make() -> str:
        if server is not None:
            url = server.new_database()
        else:
            url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'catalog.db'}"
        made.append(url)
        return url

    yield make
    if server is not None:
        for url in made:
            server.drop_database(url)


@pytest.fixture
def db_url(new_db_url: Callable[[], str]) -> str:
    """An empty database."""
    return new_db_url()


@pytest.fixture
def catalog_factory(new_db_url: Callable[[], str]) -> Iterator[Callable[[], Catalog]]:
    """Makes migrated catalogs on fresh databases of the test's backend."""
    opened: list[Catalog] = []

    def make() -> Catalog:
        url = new_db_url()
        upgrade(url)
        cat = Catalog.open(url)
        opened.append(cat)
        return cat

    yield make
    for cat in opened:
        cat.close()


@pytest.fixture
def catalog(catalog_factory: Callable[[], Catalog]) -> Catalog:
    return catalog_factory()


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A catalog on PostgreSQL over an S3 root proves nothing that PostgreSQL over a local root and SQLite over
    S3 do not (the catalog sees the same listing either way): those variants run with the slow suites."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if params.get("db_backend") == "postgresql" and params.get("checkpoint_root") in ("s3", "s3rver"):
            item.add_marker(pytest.mark.slow)
