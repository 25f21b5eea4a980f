"""The public surface: `cec` exports its main names; `cec.spark` is what a PySpark user imports, resolved on
use (importing it imports no PySpark) and the same objects as the Spark host's own import paths."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import cec
import cec.spark
from tests.helpers import child_env


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )


def test_cec_exports_its_main_names() -> None:
    for name in cec.__all__:
        assert getattr(cec, name) is not None, name
    assert issubclass(cec.ConfigError, cec.CecError) and issubclass(cec.RunStoppedError, cec.CecError)


def test_importing_cec_spark_imports_no_pyspark() -> None:
    out = _python(
        """
        import json, sys
        import cec.spark
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "pyspark"
                                or m.startswith("operators.spark"))))
        """
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def test_cec_spark_names_are_the_spark_hosts_own() -> None:
    pytest.importorskip("pyspark")
    from operators.spark import attach

    for name in ("cec_aggregate", "read_results", "CecAggregateQuery", "list_generations", "Generation"):
        assert getattr(cec.spark, name) is getattr(attach, name), name
    assert cec.spark.Checkpointing is cec.Checkpointing
    assert set(cec.spark.__all__) <= set(dir(cec.spark))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'cec_join'"):
        cec.spark.cec_join  # noqa: B018


def test_without_pyspark_a_name_is_one_line_saying_what_to_install() -> None:
    # PySpark made unimportable in a child process (the state of a machine without the spark extra).
    out = _python(
        """
        import sys
        sys.modules["pyspark"] = None
        from cec.exceptions import ConfigError
        try:
            from cec.spark import cec_aggregate
        except ConfigError as exc:
            print(exc)
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines() == [
        "cec.spark needs PySpark (pyspark is not installed): pip install 'cec-stream[spark]' (and Java 17)"
    ]
