"""Bad input and configuration of S3 checkpoint roots: every error names what is wrong, none leaks
a credential, and nothing is written or deleted because of it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import statekeeper.store.files.s3.client as s3_client_module
from statekeeper.store.errors import CheckpointError, ConfigurationError
from statekeeper.store.files import open_file_manager
from statekeeper.store.files.s3 import S3FileManager, S3Options, parse_s3_uri
from testkit.s3 import DENY, TEST_CREDENTIALS, FaultProxy, free_port

SECRETS = (TEST_CREDENTIALS["AWS_SECRET_ACCESS_KEY"], TEST_CREDENTIALS["AWS_SESSION_TOKEN"])


def assert_no_secret(text: str) -> None:
    for secret in (*SECRETS, TEST_CREDENTIALS["AWS_ACCESS_KEY_ID"], "supersecret"):
        assert secret not in text


@pytest.mark.parametrize(
    ("uri", "named"),
    [
        ("gs://bucket/x", "unsupported checkpoint root scheme 'gs'"),
        ("hdfs://nn/x", "'hdfs'"),
        ("s3://", "names no bucket"),
        ("s3:///prefix", "names no bucket"),
        ("s3a://", "names no bucket"),
        ("s3://Bad_Bucket/x", "invalid S3 bucket name 'Bad_Bucket'"),
        ("s3://ab/x", "invalid S3 bucket name 'ab'"),
        ("s3://" + "b" * 64 + "/x", "invalid S3 bucket name"),
        ("s3://-bucket/x", "invalid S3 bucket name '-bucket'"),
        ("s3://my..bucket/x", "invalid S3 bucket name 'my..bucket'"),
        ("s3://192.168.1.10/x", "invalid S3 bucket name '192.168.1.10'"),
        ("s3://bucket/a/../b", "invalid prefix in S3 checkpoint root 's3://bucket/a/../b'"),
        ("s3://bucket/a/.hidden", "'.hidden'"),
        ("s3://bucket/a b", "invalid prefix"),
        ("s3://bucket/x?versionId=1", "query or fragment"),
    ],
)
def test_bad_uris_are_refused_naming_the_problem(uri: str, named: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        open_file_manager(uri)
    assert named in str(err.value)


def test_credentials_in_uri_are_refused_without_echoing_them() -> None:
    for uri in ("s3://AKIAEXAMPLE:supersecret@bucket/x", "s3a://user:supersecret@bucket"):
        with pytest.raises(ConfigurationError, match="embeds credentials") as err:
            open_file_manager(uri)
        assert "supersecret" not in str(err.value)
    with pytest.raises(ConfigurationError, match="embeds credentials") as err:
        open_file_manager("s3://bucket/x", endpoint_url="https://key:supersecret@minio.local:9000")
    assert "supersecret" not in str(err.value)


def test_parse_uri() -> None:
    assert parse_s3_uri("s3://bucket") == ("s3", "bucket", "")
    assert parse_s3_uri("s3a://my.bucket-1/a/b/") == ("s3a", "my.bucket-1", "a/b")


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"regoin": "x"}, "unknown S3 option(s) ['regoin']"),
        ({"retry_mode": "legacy"}, "retry_mode='legacy'"),
        ({"addressing_style": "dns"}, "addressing_style='dns'"),
        ({"multipart_part_size": 1 << 20}, "multipart_part_size=1048576"),
        ({"multipart_threshold": 0}, "multipart_threshold=0"),
        ({"delete_batch_size": 1001}, "DeleteObjects takes 1..1000 keys"),
        ({"list_page_size": 0}, "list_page_size=0"),
        ({"max_attempts": 0}, "max_attempts=0"),
        ({"read_timeout": -1}, "read_timeout"),
        ({"delete_parallelism": 64, "max_pool_connections": 8}, "delete_parallelism=64"),
        ({"max_attempts": "many"}, "invalid S3 setting max_attempts from option 'max_attempts'"),
        ({"max_attempts": 2.5}, "expected an integer"),
        ({"head_before_create": "maybe"}, "head_before_create"),
        ({"endpoint_url": "minio:9000"}, "expected http(s)://host[:port]"),
    ],
)
def test_bad_options_are_refused(options: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        S3FileManager("s3://bucket/x", **options)
    assert named in str(err.value)


def test_options_from_environment_and_precedence() -> None:
    env = {
        "STATEKEEPER_S3_ENDPOINT_URL": "http://minio.local:9000",
        "AWS_REGION": "eu-west-1",
        "AWS_DEFAULT_REGION": "us-west-2",
        "STATEKEEPER_S3_RETRY_MODE": "adaptive",
        "AWS_MAX_ATTEMPTS": "4",
        "STATEKEEPER_S3_MULTIPART_PART_SIZE": str(16 << 20),
        "STATEKEEPER_S3_HEAD_BEFORE_CREATE": "true",
        "STATEKEEPER_S3_READ_TIMEOUT": "2.5",
    }
    o = S3Options.resolve({}, env)
    assert o.endpoint_url == "http://minio.local:9000"
    assert o.region_name == "eu-west-1", "AWS_REGION before AWS_DEFAULT_REGION"
    assert (o.retry_mode, o.max_attempts, o.multipart_part_size) == ("adaptive", 4, 16 << 20)
    assert o.head_before_create is True and o.read_timeout == 2.5
    o = S3Options.resolve({"region_name": "ap-south-1", "max_attempts": 9}, {**env, "STATEKEEPER_S3_REGION": "x"})
    assert (o.region_name, o.max_attempts) == ("ap-south-1", 9), "options override the environment"
    assert S3Options.resolve({}, {"STATEKEEPER_S3_REGION": "sa-east-1", **env}).region_name == "sa-east-1"
    assert S3Options.resolve({}, {}) == S3Options()
    with pytest.raises(ConfigurationError, match="environment variable STATEKEEPER_S3_LIST_PAGE_SIZE"):
        S3Options.resolve({}, {"STATEKEEPER_S3_LIST_PAGE_SIZE": "seven"})
    with pytest.raises(ConfigurationError, match="list_page_size=5000"):
        S3Options.resolve({}, {"STATEKEEPER_S3_LIST_PAGE_SIZE": "5000"})


def test_default_addressing_style(s3_endpoint: str) -> None:
    def config(fm: S3FileManager) -> Any:
        return fm.client.meta.config

    fm = S3FileManager("s3://some-bucket/x")
    assert config(fm).s3["addressing_style"] == "path", "custom endpoint: path style"
    aws = S3FileManager("s3://some-bucket/x", addressing_style="virtual")
    assert config(aws).s3["addressing_style"] == "virtual"
    assert config(fm).retries == {"mode": "standard", "total_max_attempts": 8}, "max_attempts counts every try"


@pytest.mark.usefixtures("s3_endpoint")
def test_missing_bucket_is_named_at_first_use(tmp_path: Path) -> None:
    fm = S3FileManager("s3://no-such-bucket-here/ckpt")
    src = tmp_path / "f"
    src.write_bytes(b"x")
    for call in (
        fm.check,
        lambda: fm.exists("a"),
        lambda: fm.info("a"),
        lambda: fm.read_bytes("a"),
        lambda: list(fm.list()),
        lambda: fm.put_file(str(src), "a"),
        lambda: fm.delete_many(["a"]),
        lambda: list(fm.list_incomplete_uploads()),
    ):
        with pytest.raises(ConfigurationError, match=r"S3 bucket 'no-such-bucket-here' .* does not exist \(endpoint"):
            call()


def test_access_denied_names_bucket_and_key_without_credentials(s3_endpoint: str, s3_bucket: str) -> None:
    with FaultProxy(s3_endpoint, rules=[lambda req: DENY]) as proxy:
        fm = S3FileManager(f"s3://{s3_bucket}/ckpt", endpoint_url=proxy.endpoint_url)
        errors = []
        for call in (
            fm.check,
            lambda: fm.read_bytes("commits/1.commit"),
            lambda: list(fm.list("commits/")),
            lambda: fm.exists("commits/1.commit"),
        ):
            with pytest.raises(CheckpointError, match="access denied by S3") as err:
                call()
            errors.append(str(err.value))
        with pytest.raises(CheckpointError, match="access denied") as err, fm.create("commits/2.commit") as out:
            out.write(b"x")
        errors.append(str(err.value))
        result = fm.delete_many(["a", "b"])
        assert result.deleted == [] and set(result.errors) == {"a", "b"}
        assert "access denied" in result.errors["a"]
    assert f"bucket '{s3_bucket}'" in errors[0]
    assert f"s3://{s3_bucket}/ckpt/commits/1.commit" in errors[1]
    for text in errors:
        assert_no_secret(text)
    assert proxy.injected[DENY] >= 6


@pytest.mark.usefixtures("s3_endpoint")
def test_unreachable_endpoint_names_it() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    fm = S3FileManager("s3://bucket/x", endpoint_url=dead, max_attempts=2, connect_timeout=0.5)
    with pytest.raises(CheckpointError, match=f"cannot reach the S3 endpoint {dead}"):
        fm.read_bytes("a")


def test_missing_credentials_are_a_configuration_error(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in TEST_CREDENTIALS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(s3_client_module, "_clients", {})
    fm = S3FileManager("s3://bucket/x", max_attempts=1)
    with pytest.raises(ConfigurationError, match="no usable AWS credentials for s3://bucket/x"):
        fm.exists("a")


def test_logs_name_endpoint_and_bucket_but_never_credentials(
    s3_bucket: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(s3_client_module, "_clients", {})
    caplog.set_level(logging.DEBUG, logger="statekeeper.store")
    fm = S3FileManager(f"s3://{s3_bucket}/ckpt", multipart_threshold=5 << 20)
    with fm.create("a") as out:
        out.write(b"x" * (6 << 20))
    fm.read_bytes("a")
    fm.delete_many(["a"])
    ours = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("statekeeper.store"))
    assert "new S3 client: endpoint http://127.0.0.1:" in ours
    assert s3_bucket in ours
    assert_no_secret(ours)
