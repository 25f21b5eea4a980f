"""The purchase generator as a live stream (`PurchaseGenerator(rate=...)`), on an injected clock: tuples
arrive in the stream's order at the rate, a poll returns what has arrived and [] at the live end, a replay
reads arrived tuples at once, two generators on the same epoch see the same stream, and the rate changes
neither the tuples nor the input's identity."""

from __future__ import annotations

import pytest

from cec.exceptions import ConfigError
from operators.base import InputTuple
from operators.job_builders import build_source
from operators.sources import PurchaseGenerator


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _drain(source: PurchaseGenerator) -> list[InputTuple]:
    """Poll until the live end ([]) or the end of the input (None)."""
    got: list[InputTuple] = []
    while batch := source.poll(64):
        got.extend(batch)
    return got


def _time(t: InputTuple) -> int:
    assert t.value is not None
    return int(t.value["item_time"])


def _key(t: InputTuple) -> tuple[int, int]:
    return t.partition, t.offset


@pytest.mark.parametrize("partitions", [1, 3])
def test_tuples_arrive_in_the_streams_order_at_the_rate_and_equal_the_unpaced_ones(partitions: int) -> None:
    clock = Clock()
    live = PurchaseGenerator(100, 7, partitions=partitions, rate=10.0, arrival_epoch=clock.now, clock=clock)
    plain = PurchaseGenerator(100, 7, partitions=partitions)
    assert live.identity() == plain.identity()
    assert live.poll(64) == []  # nothing arrived at the epoch itself
    got: list[InputTuple] = []
    for second in range(1, 11):
        clock.now += 1.0
        batch = _drain(live)
        # Ten tuples a second: the stream's tuples below 10 * second, each partition's in order.
        times = sorted(_time(t) for t in batch)
        assert times == list(range(10 * (second - 1), 10 * second))
        got.extend(batch)
    assert live.poll(64) is None  # all 100 arrived and were read: the end of the input
    assert sorted(got, key=_key) == sorted(_drain(plain), key=_key)


def test_a_replay_reads_what_arrived_at_once_and_a_second_reader_on_the_epoch_sees_the_same_stream() -> None:
    clock = Clock()
    first = PurchaseGenerator(60, 5, partitions=3, rate=20.0, arrival_epoch=clock.now, clock=clock)
    clock.now += 1.5  # 30 of the stream's tuples arrived: 10 per partition
    assert [first.arrived(j) for j in range(3)] == [10, 10, 10]
    read = _drain(first)
    assert len(read) == 30
    first.seek([2, 0, 5])  # a replay: the arrived tuples are there again at once
    again = _drain(first)
    assert sorted(map(_key, again)) == sorted((j, o) for j, n in enumerate((2, 0, 5)) for o in range(n, 10))
    # Another process (a standby) on the same epoch, started later: the same tuples have arrived for it.
    second = PurchaseGenerator(60, 5, partitions=3, rate=20.0, arrival_epoch=first.arrival_epoch, clock=clock)
    assert sorted(_drain(second), key=_key) == sorted(read, key=_key)
    clock.now += 100.0
    assert [first.arrived(j) for j in range(3)] == [20, 20, 20]  # never past the input's end


def test_the_rate_is_read_from_a_job_spec_and_must_be_positive(tmp_path: object) -> None:
    source = build_source(
        {"type": "generator", "count": 10, "keys": 3, "rate": 5.0, "arrival_epoch": 123.0},
        None,  # type: ignore[arg-type]
    )
    assert isinstance(source, PurchaseGenerator)
    assert (source.rate, source.arrival_epoch) == (5.0, 123.0)
    with pytest.raises(ConfigError, match="rate must be > 0"):
        PurchaseGenerator(10, 3, rate=0.0)
