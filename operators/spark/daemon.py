"""The PySpark daemon that `local_session` names for local masters (`spark.python.daemon.module`).

PySpark's daemon forks one worker per Python task and, when a worker is reused (the default), runs a
full `gc.collect()` in it after every task (`pyspark/daemon.py`). A worker that has imported pandas,
pyarrow, pyspark's workers and cec's task code holds a few hundred thousand objects, so that collection
alone cost ~50 ms of CPU per task, and every freshly forked worker first paid those imports itself:
measured on the tests' `cec_aggregate` (3 partitions, 9 Python tasks a micro-batch), the Python workers
spent 0.75-0.88 s of CPU per steady micro-batch with pyspark's own daemon and 0.12-0.19 s with this one,
a micro-batch 2.17 -> 1.69 s of CPU in all (benchmarks/RESULTS.md, "CI time").

So this daemon imports what cec's Python tasks import (the input reader, the processor, the write task),
collects once and freezes what it holds (`gc.freeze()`: objects that exist before the fork are never
traversed again by the collector, in the daemon or in any worker forked from it), then runs pyspark's
own daemon loop unchanged. Only those imports happen before the fork: none starts a thread or opens a
connection (a worker creates its Kafka clients in its task), so every forked worker starts as pyspark's
would, with the modules already loaded. The results cannot differ: the same code runs in the same worker
protocol; only what is imported when changes.

It is only named for a local master (`local_session`): there the module is importable by the very
interpreter Spark starts (the launcher of `python_exec`), which is not known for other hosts.
"""

from __future__ import annotations

import gc

# The modules a cec Python task imports (reader, processor, writer, and the pyspark workers that run them).
import pandas  # noqa: F401
import pyarrow  # noqa: F401
import pyspark.worker  # noqa: F401
from pyspark.daemon import manager

import operators.spark.datasource
import operators.spark.processor
import operators.spark.writer  # noqa: F401

gc.collect()
gc.freeze()

if __name__ == "__main__":
    manager()
