"""What tests/ and bench/ both run on, so that neither imports the other: local S3 servers (`testkit.s3`),
Spark's worker environment, cluster and Connect server (`testkit.spark`), and the stateful processors they
drive (`testkit.processors`)."""
