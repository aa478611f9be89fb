"""What changes when a query runs through Spark Connect (``SparkSession.builder.remote("sc://...")``).

Over Connect the client holds no SparkContext: ``foreachBatch`` functions are pickled and run in a
Python process the Connect server starts, next to the server's driver. For the stateful operator that
means its batches -- and the sink and ``on_progress`` callbacks it calls -- run on the server, in a copy
of the operator. Everything that touches data works the same (``mapInArrow`` tasks on the executors,
commit records written by the server-side copy, ``read_state`` through the Python Data Source API), but
the progress the server-side copy records never comes back to the client's object. Reading
``last_progress`` on the client therefore raises :class:`ConnectProgressError` instead of returning a
silently empty answer; pass ``on_progress=`` (it runs on the server) or read the driver's log.
``initial_state`` (a client DataFrame) is collected on the client at ``start`` and sent with the operator
(store/spark/initial_state.py, `Seed`).
"""

from __future__ import annotations

from typing import Any

from statekeeper.store.errors import ConfigurationError


class ConnectProgressError(ConfigurationError):
    """Progress of an operator started over Spark Connect is only known in the Connect server's process."""


def is_connect_dataframe(df: Any) -> bool:
    """True for a DataFrame of a Spark Connect session (checked without importing the Connect client)."""
    return type(df).__module__.startswith("pyspark.sql.connect.")


def progress_unavailable(operator: str) -> ConnectProgressError:
    return ConnectProgressError(
        f"statekeeper operator {operator!r} was started over Spark Connect: its batches run in the Connect "
        "server's Python process, so their progress is recorded there, not in this client. Pass on_progress= "
        "(called on the server for every batch, e.g. to write the progress to a file or a table) or read the "
        "server driver's log (logger store.spark.driver)."
    )


__all__ = [
    "ConnectProgressError",
    "is_connect_dataframe",
    "progress_unavailable",
]
