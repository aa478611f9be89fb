"""What an S3-compatible store can do that statekeeper relies on, checked before it is relied on.

No overwrite (DESIGN invariant 2) rests on `If-None-Match: *`, and some stores (s3rver, older
MinIO/Ceph releases) ignore the header and silently replace the object. `probe_conditional_writes`
tells (two conditional PUTs of a probe object under the root, then a delete). With a custom endpoint
(`conditional_writes="auto"`, the default) or `conditional_writes="probe"`, the first exclusive
publish per process, endpoint and bucket runs the probe, and a store that ignores the header is
refused with an error naming the capability and the setting that accepts the weaker, racy HEAD check
(`head_before_create`; docs/s3.md). AWS itself honours the header and is not probed.
"""

from __future__ import annotations

import contextlib
import threading
import uuid

import botocore.exceptions as bce

from statekeeper.store.errors import ConfigurationError
from statekeeper.store.files.s3.errors import is_conflict
from statekeeper.store.files.s3.root import S3Root

PROBE_PREFIX = "_statekeeper_probe_"
"""Name prefix of the probe object (written under the root and deleted at once)."""

_checked: dict[tuple[str, str], bool] = {}
_lock = threading.Lock()


def probe_conditional_writes(root: S3Root) -> bool:
    """Whether the store refuses a second `If-None-Match: *` PUT of the same key."""
    key = f"{root.key_prefix}{PROBE_PREFIX}{uuid.uuid4().hex}"
    try:
        for body in (b"1", b"2"):
            try:
                root.client.put_object(Bucket=root.bucket, Key=key, Body=body, IfNoneMatch="*")
            except bce.ClientError as e:
                if is_conflict(e):  # refused: on the second PUT, or on a retry of a first one that took effect
                    return True
                raise root.translate(e, "PutObject", None) from e
            except bce.BotoCoreError as e:
                raise root.translate(e, "PutObject", None) from e
        return False
    finally:
        with contextlib.suppress(Exception):
            root.client.delete_object(Bucket=root.bucket, Key=key)


def require_conditional_writes(root: S3Root) -> None:
    """Before an exclusive publish: refuse a store that ignores If-None-Match (checked once per bucket)."""
    if not root.options.probes_conditional_writes:
        return
    where = (str(root.client.meta.endpoint_url), root.bucket)
    with _lock:
        honoured = _checked.get(where)
        if honoured is None:
            honoured = _checked[where] = probe_conditional_writes(root)
    if not honoured:
        raise ConfigurationError(
            f"the S3 store at {where[0]} (bucket {root.bucket!r}) ignores If-None-Match, the conditional write "
            f"statekeeper relies on to never replace a published file of {root.root_uri}; set the S3 option "
            "head_before_create=True (STATEKEEPER_S3_HEAD_BEFORE_CREATE=true) to accept a HEAD check before "
            "each exclusive publish instead, which is racy between concurrent writers (docs/s3.md)"
        )
