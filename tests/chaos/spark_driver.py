"""The Spark driver the chaos runs of `cec_aggregate` start, SIGKILL and start again:
`python -m tests.chaos.spark_driver ARGS.json`, ARGS the plain-data keyword arguments of `cec_aggregate`.
It runs the query with Trigger.AvailableNow to the end of its input and exits 0; if the query fails it
says so in one line, `chaos-driver: error: <the cec error the failure carries>`, and exits 2 (what a user's
driver would report: Spark's own log lines around it are Spark's)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

# The error a failed query carries: the last "module.Error: message" line of its text (Spark wraps the
# Python error of the task or of the sink in its own exception and stack).
_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.+)$")


def _one_line(exc: BaseException) -> str:
    found = [m for m in map(_ERROR_LINE.match, str(exc).splitlines()) if m is not None]
    if found:
        return f"{found[-1].group(1)}: {found[-1].group(2)}"
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def main(argv: list[str]) -> int:
    from operators.spark.attach import cec_aggregate
    from operators.spark.session import local_session

    args = json.loads(Path(argv[0]).read_text())
    spark = local_session("local[2,3]", app_name="cec-chaos-driver")
    try:
        query = cec_aggregate(spark, available_now=True, **args)
        query.awaitTermination()
        failure = query.exception()
        if failure is not None:
            raise RuntimeError(str(failure))
    except Exception as exc:
        print(f"chaos-driver: error: {_one_line(exc)}", file=sys.stderr, flush=True)
        return 2
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
