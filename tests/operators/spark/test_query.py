"""`CecAggregateQuery`'s lifetime: when the output logs are released.

The race covered here is Spark's own timing: `stop()` from another thread turns the query inactive (and the
timed `awaitTermination(t)` true) while the micro-batch in flight still runs; only the untimed wait follows
the query thread to its end (StreamExecution's termination latch). A real query cannot be made to hit that
window on demand, so the StreamingQuery here is a stand-in with exactly that contract."""

from __future__ import annotations

import threading

import pytest

from operators.spark.query import CecAggregateQuery

WAIT_S = 60.0  # bound on waits for the other thread (never reached when the code is right)


class StoppingQuery:
    """A StreamingQuery whose `stop()` was requested (inactive) but whose last batch has not finished."""

    def __init__(self) -> None:
        self.isActive = False
        self.ended = threading.Event()  # the termination latch
        self.untimed_wait = threading.Event()  # someone waits for the thread itself
        self.failure: Exception | None = None

    def awaitTermination(self, timeout: float | None = None) -> bool | None:
        if timeout is None:
            self.untimed_wait.set()
            self.ended.wait()
        else:
            if timeout <= 0:
                raise ValueError("Timeout has to be positive")
            self.ended.wait(timeout)
        if self.ended.is_set() and self.failure is not None:
            raise self.failure
        return None if timeout is None else not self.isActive

    def exception(self) -> Exception | None:
        return self.failure if self.ended.is_set() else None


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


def _in_thread(call: object) -> tuple[threading.Thread, dict[str, object]]:
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["result"] = call()  # type: ignore[operator]
        except Exception as exc:
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_a_timed_wait_on_a_stopping_query_releases_the_logs_only_after_its_last_batch() -> None:
    query = StoppingQuery()
    handle, sink, store = _handle(query)
    thread, out = _in_thread(lambda: handle.awaitTermination(1))
    assert query.untimed_wait.wait(WAIT_S), "the handle did not wait for the query thread"
    assert (sink.closed, store.closed) == (0, 0), "closed under the batch still in flight"
    query.ended.set()
    thread.join(WAIT_S)
    assert out == {"result": True}
    assert (sink.closed, store.closed) == (1, 1)
    handle.awaitTermination()
    assert (sink.closed, store.closed) == (1, 1), "close is idempotent"


def test_a_timed_wait_on_a_running_query_keeps_the_logs_open() -> None:
    query = StoppingQuery()
    query.isActive = True
    handle, sink, _ = _handle(query)
    assert handle.awaitTermination(0.01) is False
    assert sink.closed == 0 and not query.untimed_wait.is_set()


def test_a_failed_query_releases_its_logs_and_raises_its_failure() -> None:
    for timeout in (None, 1):
        query = StoppingQuery()
        query.failure = RuntimeError("batch failed")
        handle, sink, _ = _handle(query)
        query.ended.set()
        with pytest.raises(RuntimeError, match="batch failed"):
            handle.awaitTermination(timeout)
        assert sink.closed == 1, timeout


def test_a_wait_that_fails_before_the_query_ends_keeps_the_logs_open() -> None:
    query = StoppingQuery()
    handle, sink, _ = _handle(query)
    with pytest.raises(ValueError, match="positive"):
        handle.awaitTermination(-1)
    assert sink.closed == 0


def test_an_untimed_wait_releases_the_logs_when_the_thread_ends() -> None:
    query = StoppingQuery()
    handle, sink, _ = _handle(query)
    thread, out = _in_thread(handle.awaitTermination)
    assert query.untimed_wait.wait(WAIT_S)
    assert sink.closed == 0
    query.ended.set()
    thread.join(WAIT_S)
    assert out == {"result": None} and sink.closed == 1
