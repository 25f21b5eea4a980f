"""`CecAggregateQuery`'s lifetime: when the output logs are released.

The race covered here is Spark's own timing (a `stop()` from another thread turns `isActive` false while the
micro-batch in flight still runs), which a real query cannot be made to hit on demand; the StreamingQuery
is therefore a stand-in with Spark's documented contract: `awaitTermination(timeout)` returns True only once
the query thread has ended."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from operators.spark.query import CecAggregateQuery


class StoppingQuery:
    """A StreamingQuery whose `stop()` was requested (inactive) but whose last batch has not finished."""

    def __init__(self) -> None:
        self.isActive = False
        self.ended = threading.Event()
        self.failure: Exception | None = None

    def awaitTermination(self, timeout: float | None = None) -> bool | None:
        done = self.ended.wait(timeout)
        if done and self.failure is not None:
            raise self.failure
        return done if timeout is not None else None


class Closable:
    def __init__(self) -> None:
        self.closed = 0
        self.resumed = False

    def close(self) -> None:
        self.closed += 1

    def release(self) -> None:
        pass


def _handle(query: StoppingQuery) -> tuple[CecAggregateQuery, Closable, Closable]:
    sink, store, recovery = Closable(), Closable(), Closable()
    handle = CecAggregateQuery(query, sink, store, recovery)  # type: ignore[arg-type]
    return handle, sink, store


def test_logs_stay_open_while_a_stopping_query_still_runs_its_batch() -> None:
    query = StoppingQuery()
    handle, sink, store = _handle(query)
    assert handle.awaitTermination(0) is False
    assert (sink.closed, store.closed) == (0, 0), "closed under the batch still in flight"
    query.ended.set()
    assert handle.awaitTermination(0) is True
    assert (sink.closed, store.closed) == (1, 1)
    handle.awaitTermination()
    assert (sink.closed, store.closed) == (1, 1), "close is idempotent"


def test_a_failed_query_releases_its_logs_and_raises_its_failure() -> None:
    query = StoppingQuery()
    query.failure = RuntimeError("batch failed")
    handle, sink, _ = _handle(query)
    query.ended.set()
    with pytest.raises(RuntimeError, match="batch failed"):
        handle.awaitTermination()
    assert sink.closed == 1


def test_waiting_without_a_timeout_releases_the_logs_at_the_end() -> None:
    query = StoppingQuery()
    handle, sink, _ = _handle(query)
    waiter: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: waiter.setdefault("r", handle.awaitTermination()))
    thread.start()
    assert sink.closed == 0
    query.ended.set()
    thread.join(timeout=60)
    assert not thread.is_alive() and waiter == {"r": None} and sink.closed == 1
