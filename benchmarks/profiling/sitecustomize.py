"""Profiling of an attached query's Python work, from outside the product (it has no profiling switch).

    CEC_SPARK_PROFILE=DIR PYTHONPATH=benchmarks/profiling:. python benchmarks/bench_spark.py ...

Every Python process started with this directory first on its PYTHONPATH (the driver, and the Python
workers Spark starts from it in local mode) wraps, once they are imported, the attached processor's
`handleInputRows` and the executor writers' `BatchWriter.__call__`: each call dumps a cProfile of its work
to DIR (`processor-<pid>-<ns>.prof`, `writer-<pid>-<ns>.prof`).
"""

import os

if os.environ.get("CEC_SPARK_PROFILE"):
    import cProfile
    import time
    from pathlib import Path

    from tests.killpoints import on_import

    def _profiled(name, method):  # type: ignore[no-untyped-def]
        def wrapper(self, *args):  # type: ignore[no-untyped-def]
            profile = cProfile.Profile()
            profile.enable()
            try:
                out = list(method(self, *args))
            finally:
                profile.disable()
                target = Path(os.environ["CEC_SPARK_PROFILE"]) / f"{name}-{os.getpid()}-{time.time_ns()}.prof"
                profile.dump_stats(str(target))
            yield from out

        return wrapper

    def _processor(module):  # type: ignore[no-untyped-def]
        cls = module.CecAggregateProcessor
        cls.handleInputRows = _profiled("processor", cls.handleInputRows)

    def _writer(module):  # type: ignore[no-untyped-def]
        cls = module.BatchWriter
        cls.__call__ = _profiled("writer", cls.__call__)

    on_import("operators.spark.processor", _processor)
    on_import("operators.spark.writer", _writer)
