"""A Spark driver that runs several `cec_aggregate` queries at once, each with Trigger.AvailableNow to the
end of its input: the process tests/spark/test_attach_rto.py SIGKILLs mid-run (a kill plan
attach.sink.mid_batch:n, tests/killpoints: the first query to reach its n-th micro-batch kills the driver's process group
from a write task, so every query dies mid-run, between or inside its writes).

`python -m tests.spark.rto_driver ARGS.json`; ARGS: {"queries": [cec_aggregate keyword arguments that are
plain data, ...], "done": a file written once every query finished (the kill must prevent it)}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from operators.spark.attach import cec_aggregate
from operators.spark.session import local_session


def main(argv: list[str]) -> int:
    args = json.loads(Path(argv[0]).read_text())
    spark = local_session("local[2,3]", app_name="cec-rto-driver")
    queries = [cec_aggregate(spark, available_now=True, **kwargs) for kwargs in args["queries"]]
    for query in queries:
        query.awaitTermination()
    Path(args["done"]).write_text("finished")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
