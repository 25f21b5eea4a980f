"""`transform=`'s plan check (`check_plan`): the analyzed plan above the decoded input may hold only
row-wise, deterministic steps, and `partition` and `offset` must come through unchanged (why:
`operators.spark.transform`'s docstring)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from cec.exceptions import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["check_plan", "first_line"]

_WHY = "transform= must be row-wise and deterministic, because recovery re-reads the input through it"
# Plan nodes a row-wise transform is made of (everything else is refused, `check_plan`).
_ROW_WISE = {
    "Project",
    "Filter",
    "SubqueryAlias",
    "Repartition",
    "RepartitionByExpression",
    "RebalancePartitions",
    "ResolvedHint",
    "View",
}
_REFUSED = {
    "Aggregate": "it aggregates",
    "Join": "it joins",
    "LateralJoin": "it joins",
    "GlobalLimit": "it has a limit",
    "LocalLimit": "it has a limit",
    "Tail": "it has a limit",
    "Offset": "it has a limit",
    "Deduplicate": "it deduplicates (state across rows)",
    "DeduplicateWithinWatermark": "it deduplicates (state across rows)",
    "Distinct": "it deduplicates (state across rows)",
    "Window": "it has a window function (state across rows)",
    "WindowGroupLimit": "it has a window function (state across rows)",
    "Sort": "it sorts (state across rows)",
    "Generate": "one record becomes several rows (explode), so (partition, offset) no longer names one row",
    "Expand": "one record becomes several rows, so (partition, offset) no longer names one row",
    "Union": "it unions another input",
    "Intersect": "it intersects with another input",
    "Except": "it subtracts another input",
    "Sample": "it samples (non-deterministic)",
    "EventTimeWatermark": "it sets a watermark (cec_aggregate's allowed_lateness does that)",
}
# Expressions whose value depends on when or where they run, whatever their `deterministic` flag says.
_NOT_REPLAYABLE = {
    "CurrentTimestamp",
    "CurrentDate",
    "CurrentBatchTimestamp",
    "LocalTimestamp",
    "Now",
    "CurrentTime",
    "Uuid",
    "Rand",
    "Randn",
    "Shuffle",
    "MonotonicallyIncreasingID",
    "SparkPartitionID",
    "InputFileName",
    "InputFileBlockStart",
    "InputFileBlockLength",
}


def check_plan(base: DataFrame, transformed: DataFrame) -> None:
    """One ConfigError unless `transformed` is `base` through row-wise, deterministic steps with
    `partition` and `offset` passed through unchanged (module doc)."""
    from pyspark.sql import DataFrame

    if not isinstance(transformed, DataFrame):
        raise ConfigError(f"transform must return a DataFrame, got {type(transformed).__name__}")
    if not transformed.isStreaming:
        raise ConfigError("transform must return the streaming DataFrame it was given, transformed")
    try:
        analyzed = transformed._jdf.queryExecution().analyzed()
    except Exception as exc:  # an analysis error (a column that does not exist...): its first line
        raise ConfigError(f"transform: {first_line(exc)}") from None
    below = base._jdf.queryExecution().analyzed()
    reached = False
    for node in _nodes(analyzed, below):
        if node is None:
            reached = True
            continue
        name = str(node.nodeName())
        if name not in _ROW_WISE:
            why = _REFUSED.get(name, f"its plan has a {name} step, which is not a row-wise one")
            raise ConfigError(f"{_WHY}: {why}")
        _check_expressions(node)
    if not reached:
        raise ConfigError("transform must build on the DataFrame it was given (not read another input)")
    given = {str(a.name()): int(a.exprId().id()) for a in _seq(below.output())}
    out = {str(a.name()): int(a.exprId().id()) for a in _seq(analyzed.output())}
    for column in ("partition", "offset"):
        if column not in out:
            raise ConfigError(
                f"transform dropped the column {column!r}: keep partition and offset (recovery keys every "
                "tuple by them)"
            )
        if out[column] != given[column]:
            raise ConfigError(
                f"transform changed the column {column!r}: pass partition and offset through unchanged "
                "(recovery keys every tuple by them)"
            )


def _nodes(plan: Any, stop: Any) -> Iterator[Any]:
    """The plan's nodes above `stop` (yielded as None where it is reached)."""
    stack = [plan]
    while stack:
        node = stack.pop()
        if node.equals(stop):
            yield None
            continue
        yield node
        stack.extend(_seq(node.children()))


def _check_expressions(node: Any) -> None:
    """One ConfigError naming the first non-deterministic expression of `node` (the innermost one whose
    inputs are deterministic), or one of `_NOT_REPLAYABLE`."""
    stack = list(_seq(node.expressions()))
    while stack:
        expr = stack.pop()
        children = _seq(expr.children())
        culprit = not bool(expr.deterministic()) and all(bool(c.deterministic()) for c in children)
        if culprit or str(expr.nodeName()) in _NOT_REPLAYABLE:
            raise ConfigError(f"{_WHY}: {_sql(expr)} is not deterministic (its value differs at a replay)")
        stack.extend(children)


def _sql(expr: Any) -> str:
    try:
        return str(expr.sql())
    except Exception:
        return str(expr.prettyName())


def _seq(seq: Any) -> list[Any]:
    """A Scala Seq over Py4J as a list."""
    return [seq.apply(i) for i in range(seq.size())]


def first_line(exc: BaseException) -> str:
    """The first line of an error Spark or Py4J raised (its `desc` when it has one): many lines, one is enough."""
    text = str(getattr(exc, "desc", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
