"""The Python worker daemon of the kill tests' jobs (``spark.python.daemon.module``): PySpark's own daemon
with the ``JOB_KILL_AT`` hook armed first, so a kill point can also be reached inside an executor's task
(an online rescale builds the new partitions there). The hook kills the job's whole process group."""

from __future__ import annotations

import os

from pyspark import daemon

from tests.spark.driver_job import arm_kill

if __name__ == "__main__":
    if os.environ.get("JOB_KILL_AT"):
        arm_kill(os.environ["JOB_KILL_AT"])
    daemon.manager()
