"""cec's own errors raised on the far side of Py4J, back as the one line they were.

A `CecError` raised inside a Python data source (its `schema()` runs in a Python worker the JVM starts) or a
Python worker on an executor (a `mapInArrow` step, the processor) reaches the driver as a Py4J error or a
`StreamingQueryException` of 40-80 lines: Spark's error class, the JVM stack and the worker's Python
traceback, whose last line is the one a user needs (`cec.exceptions.ConfigError: the key field ...`).
`cec_errors()` turns such an exception back into that `CecError` (the same class where it is one of
`cec.exceptions`' or `operators.exceptions`', else `ConfigError`), raised without the chain; any other
exception passes unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from cec.exceptions import CecError, ConfigError

__all__ = ["cec_error_of", "cec_errors"]


def _error_classes() -> dict[str, type[CecError]]:
    """Every CecError subclass known now, by name."""
    import operators.exceptions  # noqa: F401 - its classes are CecErrors a worker raises too

    found: dict[str, type[CecError]] = {}
    stack: list[type[CecError]] = [CecError]
    while stack:
        cls = stack.pop()
        found[cls.__name__] = cls
        stack.extend(cls.__subclasses__())
    return found


def cec_error_of(exc: BaseException) -> CecError | None:
    """The CecError a Spark-side exception carries (the last `<module>.<CecError class>: message` line of
    its text), or None."""
    if isinstance(exc, CecError):
        return exc
    classes = _error_classes()
    pattern = re.compile(
        r"^(?:[A-Za-z_][\w.]*\.)?(" + "|".join(map(re.escape, classes)) + r"): (.+)$", re.MULTILINE
    )
    texts = [str(exc)]
    java = getattr(exc, "java_exception", None)
    if java is not None:
        with suppress(Exception):  # a dead gateway: the Python text is all there is
            texts.append(str(java.toString()))
    found = None
    for text in texts:
        for match in pattern.finditer(text):
            found = match
    if found is None:
        return None
    cls, message = classes[found.group(1)], found.group(2).strip()
    try:
        return cls(message)
    except TypeError:  # a class whose constructor takes more than a message
        return ConfigError(message)


@contextmanager
def cec_errors() -> Iterator[None]:
    """Raise a CecError that crossed Py4J as itself, in one line (module doc)."""
    try:
        yield
    except CecError:
        raise
    except Exception as exc:
        error = cec_error_of(exc)
        if error is None:
            raise
        raise error from None
