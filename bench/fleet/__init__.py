"""The fleet suite: what rate one maintainer keeps up with, measured three ways.

- `beside` (suite `fleet`): writers commit in real time beside a maintainer as each deployment runs it
  (`maintainers`: the cron-style CLI, the `maintain` loop, Dagster in process, `dagster-daemon`), the roots
  sampled from outside (`sampling`), the chain each snapshot ended read from the catalog (`landing`), the raw
  RocksDB floor beside it (`floor`) and the fan-out over a Spark cluster (`fanout`);
- `sustain` (suite `sustain`, one run per row by `sustain_suite`): the versions written first and published at
  the rate asked (`publisher`), the loop or Dagster keeping the root;
- `lockstep` (suite `ceiling`): the loop in lock step with its writers, its CPU per store-commit (profiled on
  demand): the most it sustains;
- `caches`: the cost of the maintainer's caches as a fleet grows.

The writers (`writers`) and Dagster's maintainer (`dagster_runs`) serve them all. One entry point runs one
configuration of a mode: ``python -m bench.fleet MODE [flags]`` (``--list`` names the modes); ``python -m bench
fleet|sustain|ceiling`` runs a suite's tables.
"""
