"""Checkpoint files in S3 or any S3-compatible store (`s3://bucket/prefix`, also `s3a://`).

One module per responsibility, composed by `manager.S3FileManager`:

| module | what it does |
|---|---|
| `options.py` | `S3Options`: settings from keyword options / `STATEKEEPER_S3_*`, validated; S3's limits |
| `uri.py` | `parse_s3_uri`: bucket and prefix of a root URI, checked and never echoing secrets |
| `client.py` | the process-wide boto3 clients (botocore retry mode and attempts) and upload threads |
| `errors.py` | what S3's error codes mean, which are transient, and the back-off for our own retries |
| `root.py` | `S3Root`: bucket + prefix + client; path -> key, HEAD, bucket checks, error translation |
| `upload.py` | atomic publish: one PutObject or a streamed multipart upload, `If-None-Match` for exclusive |
| `download.py` | streamed GetObject that resumes a broken body with a ranged GET pinned by ETag |
| `listing.py` | ListObjectsV2 and ListMultipartUploads through botocore's paginators |
| `deletion.py` | DeleteObjects in parallel batches of <= 1000 keys, throttled keys retried; upload aborts |
| `manager.py` | `S3FileManager`: the checkpoint file manager contract of `store/files/base.py` on S3 |

Configuration is described in docs/s3.md. Credentials come only from the standard boto3 chain and
are never logged.
"""

from __future__ import annotations

from statekeeper.store.files.s3.listing import IncompleteUpload
from statekeeper.store.files.s3.manager import S3FileManager
from statekeeper.store.files.s3.options import MAX_DELETE_BATCH, MAX_PART_SIZE, MAX_PARTS, MIN_PART_SIZE, MiB, S3Options
from statekeeper.store.files.s3.root import WRITE_ID_META, write_id_of
from statekeeper.store.files.s3.uri import parse_s3_uri

__all__ = [
    "MAX_DELETE_BATCH",
    "MAX_PARTS",
    "MAX_PART_SIZE",
    "MIN_PART_SIZE",
    "WRITE_ID_META",
    "IncompleteUpload",
    "MiB",
    "S3FileManager",
    "S3Options",
    "parse_s3_uri",
    "write_id_of",
]
