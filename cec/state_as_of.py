"""`cec state TOPIC --as-of AT`: the state of every window open at a past point of a log, rebuilt exactly.

AT, and where the log is cut for it, is `recovery.as_of.AsOf`. This application runs the operator over
that cut (`operators.runtime`), which is why it is not part of `recovery/`.

How. A window's state at a point is its latest footprint before the point plus the input applied to it
since, which the log alone does not hold. So the state is rebuilt the way a recovery would rebuild it
had the operator crashed right there (which is exact: DESIGN-NOTES section 2):
1. the log is cut at the point (`recovery.as_of`: what the point means, and the cut);
2. that prefix is copied into a scratch store, where its stream index is rebuilt (the closed-window
   directory gives a key that reopens its next window sequence);
3. the operator recorded with the log (`recovery.identity`) recovers from the prefix (EC build, EC load)
   and replays its input, recorded with the log too, from the replay start up to the point (a CSV file
   must be given again, `input_path`: the log keeps its content hash, not its bytes; it is checked; a
   Kafka topic is read again as the log's `source` attachment says, at the offsets its identity pins,
   `recovery.identity.record_source`; client `config` such as credentials is not kept);
4. the windows open then, with their state, are the answer. Nothing of the original log is changed.

Cost: the prefix is read and copied once, and the input is replayed from the oldest footprint before
the point, as a recovery there would.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cec.exceptions import BadTupleError, CecError, ConfigError
from cec.records import AvroCodec
from operators.base import InputTuple, Operator
from operators.job import SCHEMAS, build_operator
from operators.runtime import OperatorRuntime
from operators.sources import CsvSource, InputSource, PurchaseGenerator, QueueSource
from queuestore.base import QueueStore
from queuestore.output import OutputQueue
from queuestore.sqlite import SqliteQueueStore
from recovery.as_of import AsOf, copy_prefix
from recovery.exceptions import RecoveryError
from recovery.identity import ATTACHMENT, SOURCE_ATTACHMENT, canonical, differences

__all__ = ["AsOf", "WindowState", "state_as_of"]


@dataclass(frozen=True)
class WindowState:
    partition: int  # the output partition (operator instance)
    key: str
    window: int  # the key's window sequence
    state: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {"partition": self.partition, "key": self.key, "window": self.window, "state": self.state}


class _Bounded(InputSource):
    """The replay input, ending at the as-of point: on partition j nothing at or past `positions[j]`, or
    nothing from the first tuple whose event time (or, without one, logical time) passes `time`."""

    def __init__(self, inner: InputSource, operator: Operator, at: AsOf) -> None:
        self.inner = inner
        self.operator = operator
        self.at = at
        self.partitions = inner.partitions
        self.global_partitions = tuple(getattr(inner, "global_partitions", range(inner.partitions)))
        if at.positions is not None and len(at.positions) != self.partitions:
            raise ConfigError(
                f"--as-of {at.describe()}: the log was written reading {self.partitions} input partition(s), "
                f"so pos: takes {self.partitions} offset(s)"
            )
        self._next = [0] * self.partitions
        self._done = [False] * self.partitions

    def seek(self, positions: Sequence[int]) -> None:
        self.inner.seek(positions)
        self._next = list(positions)
        limit = self.at.positions
        self._done = [limit is not None and p >= limit[j] for j, p in enumerate(positions)]

    def _past_time(self, tup: InputTuple) -> bool:
        assert self.at.time is not None
        if tup.value is None:
            return False
        try:
            event_time = self.operator.event_time(tup.value)
        except BadTupleError:
            return False  # dead-lettered: it does not move the clock
        if event_time is None:  # logical time is the sum of positions
            return sum(self._next) - self._next[tup.partition] + tup.offset + 1 > self.at.time
        return event_time > self.at.time

    def poll(self, max_records: int) -> list[InputTuple] | None:
        if all(self._done):
            return None
        batch = self.inner.poll(max_records)
        if batch is None:
            return None
        out: list[InputTuple] = []
        limit = self.at.positions
        for tup in batch:
            j = tup.partition
            if self._done[j]:
                continue
            if (limit is not None and tup.offset >= limit[j]) or (
                self.at.time is not None and self._past_time(tup)
            ):
                self._done[j] = True
                continue
            self._next[j] = tup.offset + 1
            out.append(tup)
        return out

    def close(self) -> None:
        self.inner.close()

    def describe(self) -> str:
        return f"{self.inner.describe()} up to {self.at.describe()}"

    def identity(self) -> dict[str, Any]:
        return self.inner.identity()


def _recorded(store: QueueStore, topic: str, partition: int) -> dict[str, Any]:
    raw = store.read_attachment(topic, partition, ATTACHMENT)
    if raw is None:
        raise RecoveryError(f"{topic}[{partition}] records no input or operator: its state cannot be rebuilt")
    recorded = json.loads(raw)
    if (
        not isinstance(recorded, dict)
        or not isinstance(recorded.get("input"), dict)
        or not recorded.get("operator")
    ):
        raise RecoveryError(f"{topic}[{partition}]: the record of its input and operator is unreadable")
    return recorded


def _kept_source(store: QueueStore, topic: str, partition: int) -> dict[str, Any] | None:
    """How the log's input is read, when it records it (`recovery.identity.record_source`)."""
    raw = store.read_attachment(topic, partition, SOURCE_ATTACHMENT)
    if raw is None:
        return None
    kept = json.loads(raw)
    if not isinstance(kept, dict):
        raise RecoveryError(f"{topic}[{partition}]: the record of how its input is read is unreadable")
    return kept


def _topic_source(recorded: Mapping[str, Any], kept: Mapping[str, Any] | None, where: str) -> InputSource:
    """A Kafka topic input again: read as the log kept it, at the offsets its identity pins."""
    if kept is None:
        raise ConfigError(
            f"{where} was written before cec kept how its Kafka topic input is read (key/value/time fields, "
            "schema, columns, partitions read): cec state cannot replay it; a log started by this release can"
        )
    from operators.topic_source import open_topic_source

    spec = {**kept, "type": "topic"}
    spec.update({k: recorded[k] for k in ("start_offsets", "end_offsets") if k in recorded})
    if recorded.get("follow"):  # a following run recorded no end offsets (an empty list): read as it did
        spec.pop("end_offsets", None)
        spec["follow"] = True
    source = open_topic_source(spec, SCHEMAS)
    # `follow` is not replayed (the as-of point bounds the replay)
    current = canonical(source.identity())
    wanted = {k: v for k, v in recorded.items() if k != "follow"}
    diff = differences(wanted, {k: current.get(k) for k in wanted})
    if diff:
        source.close()
        raise ConfigError(
            f"{where}: the topic read now is not the input the log was built from ({'; '.join(diff)})"
        )
    return source


def _replay_source(
    store: QueueStore,
    recorded: Mapping[str, Any],
    input_path: Path | None,
    kept: Mapping[str, Any] | None,
    where: str,
) -> InputSource:
    """The input the log was built from, to replay (checked against what the log recorded)."""
    kind = recorded.get("type")
    if kind == "topic":
        return _topic_source(recorded, kept, where)
    if kind == "csv":
        if input_path is None:
            raise ConfigError("this log was built from a CSV file: give it again with --input FILE")
        if not input_path.is_file():
            raise ConfigError(f"input file not found: {input_path}")
        source = CsvSource(input_path)
        if canonical(source.identity()) != canonical(dict(recorded)):
            source.close()
            raise ConfigError(f"{input_path} is not the input this log was built from (its content differs)")
        return source
    if kind == "generator":
        return PurchaseGenerator(
            recorded["count"],
            recorded["keys"],
            seed=recorded["seed"],
            partitions=recorded["partitions"],
            bad_every=recorded.get("bad_every", 0),
            invalid_every=recorded.get("invalid_every", 0),
            only=recorded.get("read"),
        )
    if kind == "queue":
        return QueueSource(store, recorded["topic"], SCHEMAS[recorded["schema"]], recorded.get("read"))
    raise ConfigError(
        f"cec state cannot replay a {kind!r} input yet (CSV files, generators, cec queues and Kafka topics)"
    )


def _partition_state(
    store: QueueStore, topic: str, partition: int, at: AsOf, input_path: Path | None, scratch_root: Path
) -> list[WindowState]:
    recorded = _recorded(store, topic, partition)
    operator = build_operator(recorded["operator"])
    if operator.state_schema is None:
        raise ConfigError(
            f"{topic} is written by a stateless operator ({operator.describe()}): it has no window state"
        )
    scratch = SqliteQueueStore(scratch_root / f"p{partition}")
    kept = _kept_source(store, topic, partition) if recorded["input"].get("type") == "topic" else None
    source = _replay_source(store, recorded["input"], input_path, kept, f"{topic}[{partition}]")
    try:
        bounded = _Bounded(source, operator, at)  # checks the point first
        copy_prefix(store, topic, partition, at, scratch)
        output = OutputQueue(scratch, topic, 0)
        try:
            runtime = OperatorRuntime(operator, bounded, output, batch_size=4096)
            runtime.run()
        finally:
            output.close()
    finally:
        source.close()
        scratch.close()
    # An operator whose state is not flat (several aggregates' exact sums) says how it reads.
    fields = getattr(operator, "state_fields", None)
    if fields is None:
        states = AvroCodec(operator.state_schema)
        fields = lambda state: states.decode(operator.encode_state(state))  # noqa: E731
    return [
        WindowState(partition, w.key, w.seq, fields(w.state))
        for w in sorted(runtime.registry, key=lambda w: w.key)
    ]


def state_as_of(
    store: QueueStore, topic: str, at: AsOf, *, input_path: Path | None = None
) -> list[WindowState]:
    """The windows open at `at` in every partition of `topic`, with their state, by partition and key."""
    scratch_root = Path(tempfile.mkdtemp(prefix="cec-state-"))
    try:
        out: list[WindowState] = []
        for p in range(store.partitions(topic)):
            out.extend(_partition_state(store, topic, p, at, input_path, scratch_root))
        return out
    except RuntimeError as exc:  # the runtime's own consistency checks: never a traceback
        raise CecError(f"cannot rebuild the state of {topic} at {at.describe()}: {exc}") from None
    finally:
        shutil.rmtree(scratch_root, ignore_errors=True)
