"""One SparkSession (local[2], up to 4 attempts per task) for the whole Spark suite."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from testkit.spark import spark_env


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    import pyspark.sql as pyspark_sql  # a hard dependency: a broken install must fail here, not skip

    os.environ.update(spark_env())
    os.environ["STATEKEEPER_SPARK_LOCAL_DIR"] = str(tmp_path_factory.mktemp("spark-local"))
    session = (
        pyspark_sql.SparkSession.builder.master("local[2,4]")
        .appName("statekeeper-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A Spark standalone master and two one-core workers on 127.0.0.1, stopped by pid at the end."""
    from testkit.spark import StandaloneCluster

    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster")).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def spark_connect_url(tmp_path_factory: pytest.TempPathFactory, s3_endpoint: str) -> Iterator[str]:
    """A Spark Connect server on 127.0.0.1 (local[2,4] inside, S3 settings pointing at moto); its sc:// URL."""
    from testkit.spark import ConnectServer

    server = ConnectServer(tmp_path_factory.mktemp("spark-connect")).start()
    yield server.url
    server.stop()
