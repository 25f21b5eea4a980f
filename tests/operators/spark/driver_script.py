"""A Spark driver that runs the filter -> aggregate pipeline to the end: the process the driver-restart test
SIGKILLs and runs again. `python -m tests.operators.spark.driver_script ROOT COUNT KEYS PID_DIR RESULT_JSON`."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from operators.spark.host import SparkOperatorHost
from operators.spark.session import local_session
from tests.operators.spark.pipelines import filter_aggregate


def main(argv: list[str]) -> int:
    root, count, keys, pid_dir, result_path = argv
    spark = local_session("local[2,3]", app_name="cec-driver-script")
    pipeline = filter_aggregate({"type": "sqlite", "root": root}, count=int(count), keys=int(keys))
    result = SparkOperatorHost(spark, pipeline, pid_dir=pid_dir).run()
    out = Path(result_path)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(
        json.dumps({"job_attempts": result.job_attempts, "instances": [asdict(r) for r in result.instances]})
    )
    tmp.replace(out)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
