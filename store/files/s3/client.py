"""The process-wide boto3 S3 clients and part-upload threads every S3 checkpoint root shares.

Making a boto3 client costs ~0.1-0.5 s of CPU, most of it reading the service models (read once per process
here), and a Spark executor opens a manager per partition, so there is one client per process and distinct
client settings. Its botocore `Config` carries the
retry mode (`standard`, or `adaptive` for client-side rate limiting) and the attempt budget: every
request statekeeper sends is retried by botocore, never by a loop of ours.

Its response parser reads timestamps with `parse_timestamp` instead of botocore's default (dateutil's
general parser): every listed object carries a LastModified, and parsing those was a quarter of the
CPU a maintainer spent on an S3 root.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, cast

import boto3
import botocore.loaders
import botocore.session
import botocore.utils
from botocore.config import Config

from statekeeper.store.files.s3.options import S3Options

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

log = logging.getLogger(__name__)

_shared_lock = threading.Lock()
_clients: dict[tuple[Any, ...], S3Client] = {}
_loader = botocore.loaders.create_loader()
_loader_lock = threading.Lock()  # apart from _shared_lock, which is held around new_session
"""The service models every client of the process reads: loaded once, they are most of a client's making."""
_upload_pool: tuple[int, ThreadPoolExecutor] | None = None
UPLOAD_THREADS = 32
"""Part uploads in flight per process; each open output has at most one (memory stays bounded)."""


def parse_timestamp(value: str) -> dt.datetime:
    """A timestamp of an S3 response as botocore's parser returns it (aware datetime), fast for the two
    forms S3 sends: ISO 8601 in XML bodies (``2026-11-23T12:34:56.000Z``) and RFC 7231 in headers."""
    try:
        if value.endswith("Z"):
            return dt.datetime.fromisoformat(value[:-1]).replace(tzinfo=dt.UTC)
        if value[:1].isalpha():
            return parsedate_to_datetime(value)
    except (TypeError, ValueError):
        pass
    return botocore.utils.parse_timestamp(value)  # anything else: botocore's own


def new_session(core: botocore.session.Session | None = None) -> boto3.session.Session:
    """A boto3 session over `core` (default: a new botocore session) reading the process's one copy of the service
    models: most of what making a client costs. Sessions are not shared, so each client resolves the credentials
    (the boto3 chain) when it is made."""
    core = core or botocore.session.get_session()
    core.register_component("data_loader", _loader)
    with _loader_lock:
        session = boto3.session.Session(botocore_session=core)
        _loader.search_paths[:] = dict.fromkeys(_loader.search_paths)  # boto3 adds its own on every session
    return session


def shared_client(options: S3Options) -> S3Client:
    """One boto3 client per process and client settings: making one costs ~0.1-0.5 s of CPU, and a
    Spark executor opens a manager per partition. boto3 clients are thread-safe; refreshable
    credentials (roles, SSO) refresh inside the client."""
    style = options.addressing_style or ("path" if options.endpoint_url else "auto")
    key = (
        os.getpid(),
        options.endpoint_url,
        options.region_name,
        style,
        options.retry_mode,
        options.max_attempts,
        options.connect_timeout,
        options.read_timeout,
        options.max_pool_connections,
    )
    with _shared_lock:
        client = _clients.get(key)
        if client is not None:
            return client
        config = Config(
            retries=cast(Any, {"mode": options.retry_mode, "total_max_attempts": options.max_attempts}),
            connect_timeout=options.connect_timeout,
            read_timeout=options.read_timeout,
            max_pool_connections=options.max_pool_connections,
            s3=cast(Any, {"addressing_style": style}),
        )
        core = botocore.session.get_session()
        core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=parse_timestamp)
        session = new_session(core)
        region = options.region_name or session.region_name or "us-east-1"
        client = session.client("s3", endpoint_url=options.endpoint_url, region_name=region, config=config)
        _clients[key] = client
        # Endpoint and settings only: credentials are never logged.
        log.info(
            "new S3 client: endpoint %s, region %s, addressing %s, retries %s x%d",
            client.meta.endpoint_url,
            region,
            style,
            options.retry_mode,
            options.max_attempts,
        )
        return client


def shared_upload_pool() -> ThreadPoolExecutor:
    global _upload_pool
    with _shared_lock:
        if _upload_pool is None or _upload_pool[0] != os.getpid():  # a forked child needs its own threads
            _upload_pool = (os.getpid(), ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="statekeeper-s3-upload"))
        return _upload_pool[1]
