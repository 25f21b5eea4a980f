"""Replayable inputs. Every input tuple has a position (partition, offset); a source can seek to any
position vector, which is how recovery asks "upstream" to replay from T.

Every source also states its identity: what it reads, as JSON-able data, such that two sources with equal
identities yield the same tuple at every position. A log records the identity of the input it was built
from and refuses to resume against another (`recovery.identity`, checked by `operators.job.run_job`).
"""

from __future__ import annotations

import abc
import csv
import hashlib
import math
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import repeat
from pathlib import Path
from typing import Any, ClassVar, TextIO

from cec.exceptions import CodecError, ConfigError
from cec.records import AvroCodec, Kind, OutputRecord, RecordCodec
from cec.verified import LogVerifier
from operators.base import InputTuple
from queuestore.base import PartitionReader, QueueStore

__all__ = [
    "PURCHASE_SCHEMA",
    "CsvSource",
    "InputChangedError",
    "InputSource",
    "PurchaseGenerator",
    "QueueSource",
    "file_fingerprint",
]

_HASH_CHUNK = 1 << 20


class InputChangedError(ConfigError):
    """The input changed while it was being read: what was read no longer matches its recorded identity."""


def file_fingerprint(fd: int) -> tuple[str, int]:
    """SHA-256 (hex) and length of the whole file behind `fd`, streamed in 1 MiB preads (the file
    position is untouched). About 0.1 s per 100 MB from the page cache with SHA-NI."""
    digest = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, _HASH_CHUNK, offset):
        digest.update(chunk)
        offset += len(chunk)
    return digest.hexdigest(), offset


def _store_identity(store: QueueStore) -> dict[str, Any]:
    """Which store a topic lives in. A Kafka cluster by its id (stable across bootstrap addresses); the
    embedded store by kind only: a queue source reads the job's own store, the directory the log is in."""
    cluster_id = getattr(store, "cluster_id", None)
    if callable(cluster_id):
        return {"type": "kafka", "cluster": cluster_id()}
    return {"type": type(store).__name__}


def _partition_subset(partitions: Sequence[int] | None, total: int, what: str) -> tuple[int, ...]:
    """The global partitions an instance reads, in local order (local partition i = subset[i])."""
    if partitions is None:
        return tuple(range(total))
    subset = tuple(int(p) for p in partitions)
    if not subset:
        raise ConfigError(f"{what}: an instance must read at least one input partition")
    if len(set(subset)) != len(subset):
        raise ConfigError(f"{what}: input partitions {list(subset)} repeat")
    bad = [p for p in subset if not 0 <= p < total]
    if bad:
        raise ConfigError(f"{what} has {total} partitions; {bad} do not exist")
    return subset


class InputSource(abc.ABC):
    """Local partitions 0..partitions-1; a source restricted to some of a stream's partitions (one
    instance of a partitioned stage) maps them to the stream's own partitions in `global_partitions`."""

    partitions: int

    @abc.abstractmethod
    def seek(self, positions: Sequence[int]) -> None:
        """Continue from `positions[j]` on every partition j."""

    @abc.abstractmethod
    def poll(self, max_records: int) -> list[InputTuple] | None:
        """The next tuples (possibly none yet); None once every partition has ended."""

    def close(self) -> None:  # noqa: B027 - optional hook
        pass

    @abc.abstractmethod
    def describe(self) -> str: ...

    @abc.abstractmethod
    def identity(self) -> dict[str, Any]:
        """What this source reads, JSON-able: equal identities yield the same tuple at every position
        (content, not names: a file's bytes, a generator's parameters, a topic and its partitions)."""

    def progress_bounds(self) -> tuple[list[int], list[int]] | None:
        """(first, end) position of every local partition of a bounded input, for progress displays
        (an estimate is fine); None when the input has no known end."""
        return None

    # Identity fields fixed when a log is started and adopted from the log on resume instead of being
    # compared (a bounded run's end positions: a restarted run must stop where the first one would have).
    pinned_fields: ClassVar[tuple[str, ...]] = ()

    def pin(self, recorded: Mapping[str, Any]) -> None:  # noqa: B027 - only sources with pinned fields
        """Adopt the pinned fields of the identity recorded in the log being resumed."""


class _LineTap:
    """The lines a csv.reader pulls, kept so that each row's input line (several for a quoted field with
    line ends) goes with its tuple: a dead letter shows the line as it was read. A generator feeds the
    reader (cheaper per line than an iterator class's __next__)."""

    __slots__ = ("lines", "pulled")

    def __init__(self, lines: Iterator[str]) -> None:
        self.pulled: list[str] = []
        self.lines = self._feed(lines, self.pulled)

    @staticmethod
    def _feed(lines: Iterator[str], pulled: list[str]) -> Iterator[str]:
        append = pulled.append
        for line in lines:
            append(line)
            yield line

    def take(self) -> str:
        pulled = self.pulled
        raw = pulled[0] if len(pulled) == 1 else "".join(pulled)
        pulled.clear()
        return raw


class CsvSource(InputSource):
    """A CSV file with a header row, read in file order: one partition, offset = data row number.

    The file is opened once and read (and fingerprinted) through that one descriptor, so an editor that
    saves by writing a new file and renaming it cannot change what this source reads. An edit in place
    while the source is open is detected by the file's size and mtime, and stops the run
    (`InputChangedError`) rather than mixing two contents in one log.

    Fields are decoded as UTF-8 with `surrogateescape`: bytes that are not valid UTF-8 are kept exactly
    (as lone surrogates) instead of all becoming U+FFFD, so that two different undecodable keys can never
    be merged into one; the operator dead-letters them (`KeyedAggregate.key_of`).
    """

    partitions = 1
    global_partitions = (0,)

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigError(f"input file not found: {self.path}")
        try:
            self._fd: int | None = os.open(self.path, os.O_RDONLY)
        except OSError as exc:
            raise ConfigError(f"cannot read {self.path}: {exc.strerror}") from None
        self._stat = self._file_state()
        self._identity: dict[str, Any] | None = None
        self._rows_estimate: int | None = None
        self._file: TextIO | None = None
        self._rows: Iterator[list[str]] | None = None
        self._tap: _LineTap | None = None
        self.header: list[str] = []
        self._offset = 0
        self._ended = False
        try:
            self.seek([0])
        except BaseException:
            self.close()
            raise

    def describe(self) -> str:
        return f"csv {self.path}"

    def _file_state(self) -> tuple[int, int]:
        assert self._fd is not None
        st = os.fstat(self._fd)
        return st.st_size, st.st_mtime_ns

    def _check_unchanged(self) -> None:
        if self._fd is not None and self._file_state() != self._stat:
            raise InputChangedError(
                f"{self.path} changed while it was being read; run again on the finished file"
            )

    def progress_bounds(self) -> tuple[list[int], list[int]] | None:
        """Data rows estimated by line ends (a quoted field with line ends makes it an overestimate)."""
        if self._rows_estimate is None:
            assert self._fd is not None
            lines, offset, last = 0, 0, b"\n"
            while chunk := os.pread(self._fd, _HASH_CHUNK, offset):
                lines += chunk.count(b"\n")
                offset += len(chunk)
                last = chunk[-1:]
            self._rows_estimate = max(0, lines - 1 + (last != b"\n"))
        return [0], [self._rows_estimate]

    def identity(self) -> dict[str, Any]:
        if self._identity is None:
            assert self._fd is not None
            digest, size = file_fingerprint(self._fd)
            self._check_unchanged()
            # The content only: the same bytes under another path are the same input.
            self._identity = {"type": "csv", "sha256": digest, "bytes": size}
        return dict(self._identity)

    def seek(self, positions: Sequence[int]) -> None:
        self._close_reader()
        if self._fd is None:
            raise ConfigError(f"{self.path}: the source is closed")
        self._check_unchanged()
        # A duplicate of the one descriptor (closing the text reader must not close it), rewound. utf-8-sig:
        # a leading byte order mark (spreadsheets write one) is not part of the first column's name.
        self._file = os.fdopen(
            os.dup(self._fd), "r", newline="", encoding="utf-8-sig", errors="surrogateescape"
        )
        self._file.seek(0)
        self._tap = _LineTap(self._file)
        self._rows = csv.reader(self._tap.lines)
        try:
            self.header = next(self._rows)
        except StopIteration:
            raise ConfigError(f"{self.path} is empty: a header row is required") from None
        self._tap.take()
        if len(set(self.header)) != len(self.header):
            raise ConfigError(f"{self.path}: duplicate column names in the header")
        self._offset = 0
        self._ended = False
        target = positions[0]
        while self._offset < target and self._next_row() is not None:
            pass

    def _next_row(self) -> InputTuple | None:
        assert self._rows is not None and self._tap is not None
        offset = self._offset
        try:
            row = next(self._rows)
        except StopIteration:
            self._ended = True
            return None
        except csv.Error as exc:
            self._offset += 1
            return InputTuple(0, offset, None, f"unreadable CSV row: {exc}", self._tap.take())
        self._offset += 1
        raw = self._tap.take()
        if len(row) != len(self.header):
            return InputTuple(
                0, offset, None, f"row has {len(row)} fields, header has {len(self.header)}", raw
            )
        return InputTuple(0, offset, dict(zip(self.header, row, strict=True)), None, raw)

    def poll(self, max_records: int) -> list[InputTuple] | None:
        if self._ended:
            return None
        self._check_unchanged()  # one fstat per batch
        out: list[InputTuple] = []
        while len(out) < max_records:
            tup = self._next_row()
            if tup is None:
                break
            out.append(tup)
        return out if out or not self._ended else None

    def _close_reader(self) -> None:
        self._tap = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def close(self) -> None:
        self._close_reader()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


PURCHASE_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Purchase",
    "namespace": "cec.demo",
    "fields": [
        {"name": "item_id", "type": "long"},
        {"name": "item_price", "type": "long"},
        {"name": "item_time", "type": "long"},
    ],
}

_M64 = (1 << 64) - 1


class PurchaseGenerator(InputSource):
    """The paper's workload: purchases (item_id, item_price, item_time), uniform over `keys` items.

    Tuple i of partition j is a pure function of (seed, j, i), so replay from any offset regenerates the
    same tuples. Items are spread over partitions by item_id so that each key lives in one partition. A
    `bad_every` > 0 makes about one price in n 0 (for the demo's filter to drop); `invalid_every` > 0
    makes about one in n have no price at all (a bad tuple the aggregate must dead-letter).

    By default every poll advances all partitions by the same share (lockstep). `interleave` = a seed makes
    each poll advance each partition by a pseudo-random share instead, as a real multi-partition input
    delivers: partitions drift apart, and a replay interleaves them differently from the first run (each
    key's order stays the same: a key lives in one partition).

    `rate` (tuples per second over all partitions) makes it a live stream: tuple i of partition j (the
    stream's tuple i * partitions + j) arrives at `arrival_epoch` + (i * partitions + j) / rate on `clock`
    (seconds; default the wall clock, so that a standby and its primary, two processes given the same
    epoch, see the same stream); a poll returns what has arrived ([] when nothing new has: the live end).
    Tuples that arrived stay available, so a replay from any offset reads them at once. Neither changes
    the tuples, so the rate is not part of the input's identity.
    """

    def __init__(
        self,
        count: int,
        keys: int,
        *,
        seed: int = 1,
        partitions: int = 1,
        bad_every: int = 0,
        invalid_every: int = 0,
        only: Sequence[int] | None = None,
        interleave: int | None = None,
        rate: float | None = None,
        arrival_epoch: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if count < 0 or keys < 1 or partitions < 1:
            raise ConfigError("need count >= 0, keys >= 1, partitions >= 1")
        if rate is not None and not rate > 0:
            raise ConfigError(f"a generator's rate must be > 0 tuples per second, not {rate!r}")
        self.rate = rate
        self.clock = clock
        self.arrival_epoch = clock() if arrival_epoch is None else arrival_epoch
        self.total_partitions = partitions
        self.global_partitions = _partition_subset(only, partitions, "the generator")
        self.partitions = len(self.global_partitions)
        self.count = count
        self.keys = keys
        self.seed = seed
        self.bad_every = bad_every
        self.invalid_every = invalid_every
        self.sizes = [count // partitions + (1 if j < count % partitions else 0) for j in range(partitions)]
        self._local_sizes = [self.sizes[j] for j in self.global_partitions]
        self._next = [0] * self.partitions
        self._rng = random.Random(interleave) if interleave is not None else None

    def describe(self) -> str:
        return f"generator {self.count} purchases over {self.keys} items (seed {self.seed})"

    def identity(self) -> dict[str, Any]:
        return {
            "type": "generator",
            "count": self.count,
            "keys": self.keys,
            "seed": self.seed,
            "partitions": self.total_partitions,
            "bad_every": self.bad_every,
            "invalid_every": self.invalid_every,
            "read": list(self.global_partitions),
        }

    def progress_bounds(self) -> tuple[list[int], list[int]] | None:
        return [0] * self.partitions, list(self._local_sizes)

    def tuple_at(self, partition: int, offset: int) -> dict[str, int | None]:
        """Tuple `offset` of global partition `partition`."""
        return self.tuples_at(partition, offset, offset + 1)[0]

    def tuples_at(self, partition: int, start: int, stop: int) -> list[dict[str, int | None]]:
        """Tuples `start` to `stop` - 1 of global partition `partition`: each a pure function of (seed,
        partition, offset), a splitmix64 hash (inlined: two calls per tuple were ~40% of the generator's
        time, and a standby's replica regenerates every tuple its primary reads)."""
        total, keys, bad_every, invalid_every = (
            self.total_partitions,
            self.keys,
            self.bad_every,
            self.invalid_every,
        )
        base = (self.seed << 40) ^ (partition << 32)
        out: list[dict[str, int | None]] = []
        append = out.append
        for offset in range(start, stop):
            x = ((base ^ offset) + 0x9E3779B97F4A7C15) & _M64
            x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
            x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
            h = x ^ (x >> 31)
            item = (h % keys) // total * total + partition
            if item >= keys:
                item = partition
            price: int | None = 1 + (h >> 20) % 1000
            if bad_every and (h >> 40) % bad_every == 0:
                price = 0
            if invalid_every and (h >> 50) % invalid_every == 0:
                price = None
            append({"item_id": item, "item_price": price, "item_time": offset * total + partition})
        return out

    def seek(self, positions: Sequence[int]) -> None:
        self._next = list(positions)

    def arrived(self, partition: int) -> int:
        """How many tuples of global partition `partition` have arrived (all of them without a rate)."""
        size = self.sizes[partition]
        if self.rate is None:
            return size
        stream = math.floor((self.clock() - self.arrival_epoch) * self.rate)  # the stream's tuples arrived
        total = self.total_partitions
        # Tuple i of partition j is the stream's tuple i * total + j: those below `stream` have arrived.
        return min(size, max(0, -(-(stream - partition) // total)))

    def poll(self, max_records: int) -> list[InputTuple] | None:
        out: list[InputTuple] = []
        share = max(1, max_records // self.partitions)
        shares = [share] * self.partitions
        if self._rng is not None:
            shares = [self._rng.randint(0, max(1, max_records)) for _ in shares]
            pending = [i for i in range(self.partitions) if self._next[i] < self._local_sizes[i]]
            if pending:  # some partition with tuples left always moves
                shares[self._rng.choice(pending)] += 1
        for i, j in enumerate(self.global_partitions):
            stop = min(self.arrived(j), self._next[i] + shares[i])
            start = self._next[i]
            out.extend(map(InputTuple, repeat(i), range(start, stop), self.tuples_at(j, start, stop)))
            self._next[i] = max(self._next[i], stop)
        if not out and all(n >= c for n, c in zip(self._next, self._local_sizes, strict=True)):
            return None
        return out


_R, _EOS = Kind.R.value, Kind.EOS.value


class QueueSource(InputSource):
    """An upstream operator's output queue. Yields its R tuples; control tuples are skipped by their kind
    (kept beside the value) without decoding state, and an upstream EOS ends a partition. Every record is
    checked before its kind is looked at (`cec.verified`): a damaged record, or an offset missing from a
    dense log, raises `DamagedLogError` (never used, never skipped). An intact R whose payload does not fit
    the schema is an input the operator cannot process: it is delivered as an error tuple (dead-lettered)."""

    def __init__(
        self,
        store: QueueStore,
        topic: str,
        payload_schema: dict[str, Any],
        partitions: Sequence[int] | None = None,
    ) -> None:
        self.topic = topic
        self._store = store
        self._schema_name = f"{payload_schema.get('namespace', '')}.{payload_schema.get('name', '')}"
        self.total_partitions = store.partitions(topic)
        self.global_partitions = _partition_subset(partitions, self.total_partitions, f"topic {topic!r}")
        self.partitions = len(self.global_partitions)
        self._readers: list[PartitionReader] = [store.reader(topic, p) for p in self.global_partitions]
        self._codec = RecordCodec()
        self._verifiers = [LogVerifier(r, self._codec, decode=(Kind.R.value,)) for r in self._readers]
        self._payload = AvroCodec(payload_schema)
        self._next: list[int] = []
        self._ended: list[bool] = []
        self.seek([0] * self.partitions)

    def describe(self) -> str:
        return f"queue {self.topic} partitions {list(self.global_partitions)}"

    def identity(self) -> dict[str, Any]:
        # An upstream cec queue is unbounded (it ends at the upstream's EOS), so nothing is pinned.
        return {
            "type": "queue",
            "store": _store_identity(self._store),
            "topic": self.topic,
            "partitions": self.total_partitions,
            "read": list(self.global_partitions),
            "schema": self._schema_name,
        }

    def seek(self, positions: Sequence[int]) -> None:
        self._next = list(positions)
        self._ended = [False] * self.partitions
        for verifier, position in zip(self._verifiers, self._next, strict=True):
            verifier.seek(position)

    def acknowledge(self, consumer: str, positions: Sequence[int]) -> None:
        """Register as `consumer` of the upstream queue, or move its acknowledgement: nothing below
        `positions` (per local partition) is read again, so the upstream may trim it."""
        for j, position in zip(self.global_partitions, positions, strict=True):
            self._store.acknowledge(self.topic, j, consumer, position)

    def _tuple(self, partition: int, offset: int, record: OutputRecord) -> InputTuple:
        try:
            if record.payload is None:
                raise CodecError("R record without payload")
            return InputTuple(partition, offset, self._payload.decode(record.payload))
        except CodecError as exc:
            return InputTuple(partition, offset, None, f"undecodable upstream result: {exc}")

    def poll(self, max_records: int) -> list[InputTuple] | None:
        out: list[InputTuple] = []
        share = max(1, max_records // self.partitions)
        for j, reader in enumerate(self._readers):
            if self._ended[j]:
                continue
            # Flat rows, checked in a batch (`LogVerifier.check_rows`): no objects per record but the tuple.
            rows = reader.read_forward_rows(self._next[j], share)
            if not rows:
                continue
            self._next[j] = rows[-1][0] + 1
            for offset, kind, record in self._verifiers[j].check_rows(rows):
                if kind == _R:
                    assert record is not None
                    if record.payload is None and record.key is not None:
                        continue  # a window's R without a result (a session's slice): no tuple
                    out.append(self._tuple(j, offset, record))
                elif kind == _EOS:
                    self._ended[j] = True
                    self._next[j] = offset + 1
                    break
        if not out and all(self._ended):
            return None
        return out

    def close(self) -> None:
        for reader in self._readers:
            reader.close()
