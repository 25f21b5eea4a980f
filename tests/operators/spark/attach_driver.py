"""A Spark driver that runs `cec_aggregate` with Trigger.AvailableNow to the end of its input: the process the
attach kill tests SIGKILL (a kill plan `attach.sink.mid_batch:n` in its environment, tests/killpoints), or
whose write tasks are killed (`attach.writer.kill_task:n`).

`python -m tests.operators.spark.attach_driver ARGS.json`; ARGS holds the keyword arguments of `cec_aggregate` that
are plain data, plus `done`: a file written (atomically) with the run's summary once the query finished,
and `transform` names one of tests/operators/spark/transforms.py's functions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from operators.spark.attach import cec_aggregate
from operators.spark.session import local_session
from tests.operators.spark.transforms import TRANSFORMS


def main(argv: list[str]) -> int:
    args = json.loads(Path(argv[0]).read_text())
    done = Path(args.pop("done"))
    if "transform" in args:
        args["transform"] = TRANSFORMS[args["transform"]]
    spark = local_session("local[2,3]", app_name="cec-attach-driver")
    query = cec_aggregate(spark, available_now=True, **args)
    query.awaitTermination()
    tmp = done.with_name(done.name + ".tmp")
    sink = query._sink
    summary = {
        "batches": query.batches,
        "resumed": query.recovery.resumed,
        "cec": query.cec_progress,
        # The executor path: messages a retried write task found already written by its killed attempt,
        # and records the driver appended itself (none: the write tasks did).
        "found": getattr(sink, "found", None),
        "driver_appends": sum(out.appended for out in sink.outputs),
    }
    tmp.write_text(json.dumps(summary))
    tmp.replace(done)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
