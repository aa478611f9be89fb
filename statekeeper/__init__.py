"""statekeeper: a changelog-committing RocksDB state store for Spark Structured Streaming, and the
maintenance platform that keeps its checkpoints small.

The repository keeps the product's four areas as top-level folders (``store/``, ``maintenance/``,
``orchestration/``, ``sql/``); this package links them under one import namespace so that nothing named
``store`` or ``sql`` lands at the top level of site-packages: ``statekeeper.store``,
``statekeeper.maintenance``, ``statekeeper.orchestration``, ``statekeeper.sql``.
"""

__version__ = "0.1.0"
