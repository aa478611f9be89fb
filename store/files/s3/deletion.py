"""Deleting from an S3 checkpoint root: objects in parallel DeleteObjects batches, and abandoned
multipart uploads.

DeleteObjects takes at most 1000 keys per request; batches of `delete_batch_size` keys go out on a
pool of `delete_parallelism` threads with a bounded number in flight. Keys are validated before
anything is deleted (one bad path deletes nothing) and a missing key counts as deleted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

import botocore.exceptions as bce

from statekeeper.store.errors import ConfigurationError
from statekeeper.store.faults import reached as fault_point
from statekeeper.store.files.base import DeleteResult
from statekeeper.store.files.paths import validate_paths_to_delete
from statekeeper.store.files.s3.errors import RETRYABLE_CODES, backoff, error_code
from statekeeper.store.files.s3.root import S3Root

log = logging.getLogger(__name__)


def delete_objects(root: S3Root, paths: Iterable[str]) -> DeleteResult:
    """DeleteObjects in batches of <= 1000 keys on a bounded pool; throttled keys are retried."""
    items = [(root.key_prefix + p, p) for p in validate_paths_to_delete(paths)]
    result = DeleteResult()
    if not items:
        return result
    size = root.options.delete_batch_size
    parallelism = root.options.delete_parallelism
    batches = (items[i : i + size] for i in range(0, len(items), size))
    pool = ThreadPoolExecutor(parallelism, thread_name_prefix="statekeeper-s3-delete")
    inflight: set[Future[DeleteResult]] = set()
    try:
        for batch in batches:
            if len(inflight) >= 2 * parallelism:
                done, inflight = wait(inflight, return_when=FIRST_COMPLETED)
                for f in done:
                    result.merge(f.result())
            inflight.add(pool.submit(_delete_batch, root, dict(batch)))
        for f in inflight:
            result.merge(f.result())
    finally:
        for f in inflight:
            f.cancel()
        pool.shutdown(wait=True)
    log.info("deleted %d objects under %s (%d errors)", len(result.deleted), root.root_uri, len(result.errors))
    return result


def _delete_batch(root: S3Root, pending: dict[str, str]) -> DeleteResult:
    """One DeleteObjects batch (key -> path); keys reported as throttled/5xx go again after a backoff.

    A hand loop, because botocore cannot do this: DeleteObjects answers 200 with per-key errors
    (SlowDown, InternalError ...), which its retry modes never see, and only the failed keys should
    go again. A request that failed as a whole after botocore's own attempts takes the same rounds
    (docs/s3.md), so a throttled bucket slows maintenance down instead of failing it.
    """
    result = DeleteResult()
    attempt = 0
    while pending:
        retry: dict[str, str] = {}
        fault_point("s3.delete", next(iter(pending.values())))
        try:
            resp = root.client.delete_objects(
                Bucket=root.bucket, Delete={"Objects": [{"Key": k} for k in pending], "Quiet": True}
            )
        except (bce.ClientError, bce.BotoCoreError) as e:
            code = error_code(e)[0] if isinstance(e, bce.ClientError) else type(e).__name__
            if code == "NoSuchBucket":
                raise root.missing_bucket() from e
            retryable = code in RETRYABLE_CODES or isinstance(e, bce.BotoCoreError)
            if retryable and attempt < root.options.delete_retries:
                retry = pending
            else:
                reason = str(root.translate(e, "DeleteObjects", None))
                for p in pending.values():
                    result.errors[p] = reason
                return result
        else:
            failed: set[str] = set()
            for err in resp.get("Errors", []):
                key, code = err.get("Key", ""), err.get("Code", "")
                if key not in pending:
                    continue
                failed.add(key)
                if code in RETRYABLE_CODES and attempt < root.options.delete_retries:
                    retry[key] = pending[key]
                else:
                    result.errors[pending[key]] = f"{code}: {err.get('Message', '')}".rstrip(": ")
            result.deleted.extend(p for k, p in pending.items() if k not in failed)
        if retry:
            log.debug("DeleteObjects: %d keys throttled, retry %d", len(retry), attempt + 1)
            time.sleep(backoff(attempt))
            attempt += 1
        pending = retry
    return result


def abort_upload(root: S3Root, path: str, upload_id: str) -> bool:
    """Abort one multipart upload; False if it was already gone (completed or aborted)."""
    if not isinstance(upload_id, str) or not upload_id:
        raise ConfigurationError(f"invalid multipart upload id {upload_id!r} for {root.uri_of(path)}")
    key = root.key(path)
    try:
        root.client.abort_multipart_upload(Bucket=root.bucket, Key=key, UploadId=upload_id)
    except bce.ClientError as e:
        if error_code(e)[0] == "NoSuchUpload":
            return False
        raise root.translate(e, "AbortMultipartUpload", path) from e
    except bce.BotoCoreError as e:
        raise root.translate(e, "AbortMultipartUpload", path) from e
    return True
