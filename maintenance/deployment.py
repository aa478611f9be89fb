"""Which catalog a root's deployment uses: recorded in the root (``_deployment.json``), so every maintainer
and every command on the root finds the same catalog without being told.

The first maintainer of a root that runs with a catalog records that catalog's URL there (an exclusive
create: the record is never replaced; delete it to record another). The URL is stored without its password
(and without any ``password`` query parameter): a record in a checkpoint location must never carry a
credential, so a server catalog's password comes from the environment of whoever reads the record
(``PGPASSWORD``, ``~/.pgpass``), or the command is given ``--db`` / ``STATEKEEPER_DB_URL``.

The catalog is not the lease authority (`statekeeper.maintenance.root_leases` is): a root whose maintainers
use different catalogs is still maintained by one at a time; only its history is then split between them.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from statekeeper.store.errors import CheckpointFileExistsError, CorruptFileError, StatekeeperError
from statekeeper.store.files import CheckpointFileManager
from statekeeper.store.formats.framing import parse_json
from statekeeper.store.layout import DEPLOYMENT_FILE

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

log = logging.getLogger(__name__)

FORMAT = "statekeeper-deployment"
MAX_BYTES = 4096
_recorded: set[tuple[str, str]] = set()
"""(root, url) pairs this process has recorded or found: one look at the root per pair and process."""
_recorded_lock = threading.Lock()


def shareable_url(url: str | URL) -> str:
    """`url` with its password and any ``password`` query parameter removed."""
    from sqlalchemy.engine import URL, make_url

    parsed = make_url(url if isinstance(url, str) else url.render_as_string(hide_password=False))
    query = {k: v for k, v in parsed.query.items() if "password" not in k.lower()}
    bare = URL.create(parsed.drivername, parsed.username, None, parsed.host, parsed.port, parsed.database, query)
    return bare.render_as_string(hide_password=False)


def recorded_catalog(fm: CheckpointFileManager) -> str | None:
    """The catalog URL the root's deployment recorded (None: none recorded); `CorruptFileError` if unreadable."""
    try:
        data = fm.read_bytes(DEPLOYMENT_FILE)
    except FileNotFoundError:
        return None
    uri = f"{fm.root_uri.rstrip('/')}/{DEPLOYMENT_FILE}"
    try:
        if len(data) > MAX_BYTES:
            raise ValueError(f"longer than {MAX_BYTES} bytes")
        doc = parse_json(data, "", "deployment record")
        url = doc.get("catalog_url") if isinstance(doc, dict) and doc.get("format") == FORMAT else None
        if not isinstance(url, str) or not url or len(url) > 1024:
            raise ValueError("no catalog_url")
        return url
    except (ValueError, CorruptFileError) as e:
        raise CorruptFileError(f"unreadable deployment record ({str(e)[:300]})", uri) from None


def record_catalog(fm: CheckpointFileManager, url: str | URL) -> None:
    """Record `url` (without its password) as the root's catalog unless one is recorded; a different one
    recorded is logged (this maintainer's runs then show in its own catalog, not the deployment's). Once per
    root, URL and process; a failure to record is logged, never fatal."""
    shared = shareable_url(url)
    key = (fm.root_uri, shared)
    with _recorded_lock:
        if key in _recorded:
            return
        _recorded.add(key)
    try:
        existing = recorded_catalog(fm)
        if existing is None:
            doc = {"format": FORMAT, "version": 1, "catalog_url": shared}
            try:
                with fm.create(DEPLOYMENT_FILE, exclusive=True) as out:
                    out.write(json.dumps(doc).encode())
                log.info("recorded catalog %s as the deployment's of %s", shared, fm.root_uri)
                return
            except CheckpointFileExistsError:
                existing = recorded_catalog(fm)
        if existing is not None and existing != shared:
            log.warning(
                "%s records catalog %s as its deployment's, this maintainer uses %s: its runs are not in the "
                "deployment's catalog (delete %s to record another)",
                fm.root_uri,
                existing,
                shared,
                DEPLOYMENT_FILE,
            )
    except (StatekeeperError, OSError) as e:
        log.warning("cannot record the catalog of %s: %s", fm.root_uri, e)


def chosen_catalog(explicit: str | None, roots: Iterable[CheckpointFileManager]) -> tuple[str, str]:
    """The catalog a command uses, and where the choice came from: `explicit` (``--db``), else
    ``STATEKEEPER_DB_URL``, else the first of `roots` that records its deployment's catalog, else the embedded
    SQLite default. `roots` is iterated only when it comes to that (the CLI opens them lazily)."""
    import os

    from statekeeper.sql.db import ENV_URL, default_url

    if explicit:
        return explicit, "--db"
    if os.environ.get(ENV_URL):
        return os.environ[ENV_URL], ENV_URL
    for fm in roots:
        url = recorded_catalog(fm)
        if url is not None:
            return url, f"recorded in {fm.root_uri.rstrip('/')}/{DEPLOYMENT_FILE}"
    return default_url(), "the embedded default"


__all__ = ["chosen_catalog", "record_catalog", "recorded_catalog", "shareable_url"]
