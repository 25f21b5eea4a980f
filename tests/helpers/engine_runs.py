"""The real engine (`OperatorInstance` over the local sink) run in memory over a list of tuples, and the
any-value rows the fuzz tests feed it: shared by the tests of every aggregate (tumbling, hopping, sessions)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from cec.records import AvroCodec, Kind, OutputRecord, RecordCodec
from operators.base import InputTuple, Operator
from operators.engine.instance import OperatorInstance
from operators.local_sink import OutputQueueSink
from queuestore.base import RecordMeta

__all__ = [
    "ANY_VALUE",
    "ROW",
    "AvroResults",
    "MemoryQueue",
    "engine_results",
    "every_record",
    "open_counts",
]


class MemoryQueue:
    """An output queue in a list: what the local sink appends, in order."""

    def __init__(self) -> None:
        self.stored: list[tuple[bytes, RecordMeta]] = []

    def append(self, value: bytes, meta: RecordMeta) -> None:
        self.stored.append((value, meta))

    def append_run(self, kind: str, time: int, keys: list[str], seqs: list[int], values: list[bytes]) -> None:
        for key, seq, value in zip(keys, seqs, values, strict=True):
            self.stored.append((value, RecordMeta(kind, time, key, seq)))


class AvroResults:
    """An R record's result, decoded with its operator's result schema."""

    def __init__(self, operator: Operator) -> None:
        self.codec = AvroCodec(operator.result_schema)

    def __call__(self, record: OutputRecord) -> dict[str, Any]:
        assert record.payload is not None
        return self.codec.decode(record.payload)


def _instance(operator: Operator, queue: MemoryQueue, codec: RecordCodec) -> OperatorInstance:
    return OperatorInstance(operator, OutputQueueSink(queue, codec, 2), 2)  # type: ignore[arg-type]


def engine_results(operator: Operator, tuples: list[InputTuple]) -> list[dict[str, Any]]:
    """Results of the real engine over `tuples` (two input partitions), in the order given (an R without a
    result, a session's slice folded into a later one, is none)."""
    queue, codec = MemoryQueue(), RecordCodec()
    _instance(operator, queue, codec).apply_run(tuples)
    payloads = AvroResults(operator)
    records = [codec.decode(v, m) for v, m in queue.stored if m.kind == Kind.R.value]
    return [payloads(r) for r in records if r.payload is not None]


def every_record(operator: Operator, tuples: list[InputTuple], *, one_by_one: bool) -> list[tuple[Any, ...]]:
    """(kind, key, seq, state, payload) of every record the engine makes over `tuples`, applied in one run
    or tuple by tuple."""
    queue, codec = MemoryQueue(), RecordCodec()
    instance = _instance(operator, queue, codec)
    if one_by_one:
        for tup in tuples:
            instance.apply_run([tup])
    else:
        instance.apply_run(tuples)
    out = []
    for value, meta in queue.stored:
        record = codec.decode(value, meta)
        out.append((record.kind, record.key, record.seq, record.state, record.payload))
    return out


def open_counts(operator: Operator, tuples: list[InputTuple]) -> int:
    """Tuples in the windows still open after `tuples` (from the engine's own registry; states with a
    `count`)."""
    queue = MemoryQueue()
    instance = _instance(operator, queue, RecordCodec())
    instance.apply_run(tuples)
    return sum(w.state.count for w in instance.registry)


# Any value a decoded record may hold in a field, and a row of such fields (keys a, b; values v, w; time t).
ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(width=64),
    st.text(max_size=6),
    st.sampled_from(["12.5", " 3", "1e400", "nan", "-0", "1_000", "", "   ", "0x10"]),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
)
ROW = st.fixed_dictionaries(
    {
        "a": ANY_VALUE,
        "b": st.sampled_from(["x", "y", 7, None]),
        "v": ANY_VALUE,
        "w": ANY_VALUE,
        "t": st.one_of(st.integers(0, 60), ANY_VALUE),
    }
)
