"""Positioned reads of one partition (`KafkaPartitionReader`).

Readers consume with `isolation.level=read_committed`. Transaction markers take offsets that are never
delivered, so offsets are not dense (`dense_offsets = False`): every read path steps by the offsets it is
given, never by counting.

The readers never trust broker watermarks or time lookups to locate data: the end of a partition is found
by consuming (`queuestore.kafka.ends`). The only use of a watermark here is the one cached from fetch
responses, as a *suspicion* that a seek went past the end (Tansu answers such fetches with silence
instead of OFFSET_OUT_OF_RANGE); the suspicion is then confirmed or refuted by finding the end. Apache
Kafka answers a fetch below the log start (records deleted by trimming or retention) with
OFFSET_OUT_OF_RANGE too: only then the reader asks for the log start, and a backward read stops there,
while a forward read below it is `LogTrimmedError`, as on SQLite.

One job, the positioned reads of one partition (forward, backward, tail): long, not split; the end-finder
is `queuestore.kafka.ends`, the consumer config `queuestore.kafka.config`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from cec.native import native
from queuestore.base import PartitionReader, Row, StoredRecord
from queuestore.exceptions import BrokerUnavailableError, QueueStoreError, StoreClosedError, UnknownTopicError
from queuestore.kafka.admin import METADATA_WARMUP_S, consumer_knowing
from queuestore.kafka.ends import find_ends
from queuestore.kafka.errors import (
    _BEYOND_END_CODES,
    _NO_ANSWER_CODES,
    _UNKNOWN_CODES,
    _error_code,
    settles_if_asked_again,
)
from queuestore.kafka.framing import FRAME_KINDS, FRAME_MAGIC, _message_rows, _offset, _to_record, _to_row

if TYPE_CHECKING:
    from queuestore.kafka.store import KafkaQueueStore

__all__ = ["KafkaPartitionReader"]

log = logging.getLogger(__name__)
# max.partition.fetch.bytes and fetch.max.bytes of the bulk reader's consumer, unless the store's config
# sets them (below receive.message.max.bytes' default, 100 MB, as librdkafka requires).
_BULK_FETCH_BYTES = 32 << 20


@dataclass
class _ReadResult:
    records: list[StoredRecord] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)  # instead of records, for a read with as_rows
    eof: int | None = None  # offset of the PARTITION_EOF event, when one was reached
    beyond_end: bool = False  # the start offset lies past the end of the partition


class KafkaPartitionReader(PartitionReader):
    """Positioned reads of one partition through its own group-less consumer.

    Each operation re-assigns the partition at an explicit offset; nothing is committed. One reader is used
    by one thread; `tail` opens its own consumer so that it can run (in another thread, too) alongside
    positioned reads.
    """

    def __init__(self, store: KafkaQueueStore, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.dense_offsets = store.dense_offsets
        self.store_name = f"kafka {store.bootstrap_servers}"
        self._store = store
        self._stall_timeout = store.request_timeout
        # How long a positioned read waits in silence before suspecting it was positioned past the end
        # (Tansu answers those fetches with silence rather than OFFSET_OUT_OF_RANGE).
        self.beyond_end_suspicion = 0.5
        self._consumer: Consumer | None = self._new_consumer(
            store._consumer_config(f"reader-{topic}-{partition}")
        )
        # Lowest offset known to be <= the end: a seek hint for end_offset, never an answer.
        self._known_end = 0
        # Where the consumer stands after a read that kept it assigned, and what it drained beyond it.
        self._cursor: int | None = None
        self._backlog: list[Message] = []
        # Bulk backward reads (recovery's EC scan) get a consumer of their own, made on first use: see
        # `_bulk_consumer`.
        self._bulk: Consumer | None = None

    def _bulk_consumer(self) -> Consumer:
        """The consumer of `read_backward_rows`: each of its reads ends unassigned, so it never idles at
        the live end.

        It keeps the store's fetch.wait.max.ms (10 ms). Tansu answers a fetch with the record batches it
        gathers within that wait (at least one), not with everything up to the byte limit, so the wait
        bounds how much one round trip brings. An operator's log is made of small batches (its writer
        lingers 5 ms: 30-100 records each at ~20k records/s). With a 2 ms wait, a loaded machine got
        one batch per fetch: ~1,400 round trips for an 86k-record extent, measured 68 s for the EC build
        with the client and broker held to 10% of a CPU against 2.3 s with 10 ms (the 44 s EC build of
        benchmarks/RESULTS.md, "Side by side with Quix Streams", at load ~29). On a quiet machine the
        shorter wait only saved ~85 ms per 84k-record read of a log of large batches."""
        self._live_consumer()
        if self._bulk is None:
            conf = self._store._consumer_config(f"bulk-{self.topic}-{self.partition}")
            # Fewer, larger fetches: an extent of ~90k small records is a few MB, read in a couple of
            # fetches instead of one per default 1 MB (each held for fetch.wait.max.ms by Tansu).
            conf.setdefault("max.partition.fetch.bytes", _BULK_FETCH_BYTES)
            conf.setdefault("fetch.max.bytes", _BULK_FETCH_BYTES)
            self._bulk = self._new_consumer(conf)
        return self._bulk

    def _new_consumer(self, conf: dict[str, Any]) -> Consumer:
        """A consumer that already knows the partition's leader (`queuestore.kafka.admin.consumer_knowing`:
        its first read does not wait for librdkafka's once-a-second topic scan)."""
        return consumer_knowing(conf, self.topic, timeout=min(METADATA_WARMUP_S, self._stall_timeout))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(topic={self.topic!r}, partition={self.partition})"

    def _live_consumer(self) -> Consumer:
        if self._consumer is None:
            raise StoreClosedError(f"reader of {self.topic}[{self.partition}] is closed")
        return self._consumer

    def _note_end(self, offset: int) -> None:
        if offset > self._known_end:
            self._known_end = offset

    def _check_error(self, err: KafkaError) -> bool:
        """Classify an error event; returns True when it means the position is beyond the end."""
        code = err.code()
        if code in _BEYOND_END_CODES:
            return True
        if code in _UNKNOWN_CODES:
            raise UnknownTopicError(f"{self.topic}[{self.partition}]: {err.str()}")
        if err.fatal():
            raise QueueStoreError(f"reading {self.topic}[{self.partition}] failed: {err.str()}")
        # Transport hiccups and the like: librdkafka retries by itself.
        log.debug("transient consumer error on %s[%d]: %s", self.topic, self.partition, err.str())
        return False

    def _read(
        self,
        start: int,
        *,
        want: int | None,
        stop_before: int | None,
        as_rows: bool = False,
    ) -> _ReadResult:
        """Consume from `start` until `want` records, an offset >= `stop_before`, or the EOF event.

        A read that ends because it has `want` records keeps the consumer assigned, and the messages it
        drained but did not return: a next read starting right after it (a sequential reader such as an
        operator's queue source) continues from there instead of re-assigning, which would drop the
        prefetched data and wait for a new fetch (held for fetch.wait.max.ms on some brokers).
        """
        if as_rows:  # its own consumer, always re-assigned, never kept assigned (want is None)
            consumer = self._bulk_consumer()
            backlog: list[Message] = []
            consumer.assign([TopicPartition(self.topic, self.partition, start)])
        else:
            consumer = self._live_consumer()
            backlog = []
            if self._cursor == start:
                backlog = self._backlog
            else:
                consumer.assign([TopicPartition(self.topic, self.partition, start)])
            self._cursor, self._backlog = None, []
        keep_assigned = False
        result = _ReadResult()
        last_progress = time.monotonic()
        drain = 10_000 if want is None else min(want, 10_000)
        try:
            while True:
                if backlog:
                    batch, backlog = backlog, []
                    last_progress = time.monotonic()
                else:
                    if as_rows and stop_before is not None:
                        # Messages drained past `stop_before` become Python objects only to be dropped:
                        # drain about what is left (offsets may skip markers: a short drain only loops).
                        below = result.rows[-1][0] + 1 if result.rows else start
                        drain = max(1, min(10_000, stop_before - below))
                    fetched = self._fetch(consumer, start, result, last_progress, drain)
                    if fetched is None:
                        return result
                    if not fetched:
                        continue
                    batch = fetched
                    last_progress = time.monotonic()
                if as_rows:  # bulk: `want` is None here (see read_backward_rows)
                    if self._rows_from(batch, start, stop_before, result):
                        return result
                    continue
                for index, msg in enumerate(batch):
                    err = msg.error()
                    if err is not None:
                        if self._event_ends(err, msg, start, result):
                            return result
                        continue
                    offset = _offset(msg)
                    if offset < start:
                        continue
                    if stop_before is not None and offset >= stop_before:
                        return result
                    if offset >= self._known_end:
                        self._known_end = offset + 1
                    result.records.append(_to_record(msg, offset))
                    if want is not None and len(result.records) >= want:
                        self._cursor, self._backlog = offset + 1, batch[index + 1 :]
                        keep_assigned = True
                        return result
                    if stop_before is not None and offset == stop_before - 1:
                        return result
        finally:
            if not keep_assigned:
                # Stop fetching in the background between operations (and drop prefetched data).
                consumer.unassign()

    def _rows_from(
        self, batch: list[Message], start: int, stop_before: int | None, result: _ReadResult
    ) -> bool:
        """The rows of a fetched batch into `result.rows`, as `_read` collects records (offsets below
        `start` skipped, up to `stop_before`, EOF and error events handled alike); True when the read
        ends. The C accelerator converts runs of plain messages; anything else comes back here."""
        out = result.rows
        limit = -1 if stop_before is None else stop_before
        i, count = 0, len(batch)
        while i < count:
            if native is not None:
                i, stopped = native.message_rows(
                    batch, i, start, limit, out, _to_row, FRAME_MAGIC, FRAME_KINDS
                )
            else:
                i, stopped = _message_rows(batch, i, start, limit, out)
            if out:
                self._note_end(out[-1][0] + 1)
            if stopped:
                return True
            if i >= count:
                return False
            event = batch[i]  # message_rows stops at an event that is not a record
            err = event.error()
            i += 1
            if err is not None and self._event_ends(err, event, start, result):
                return True
        return False

    def _event_ends(self, err: KafkaError, msg: Message, start: int, result: _ReadResult) -> bool:
        """Whether an event that is not a record ends a read from `start` (`result` says how): the EOF
        event at or above `start`, or an answer that the start lies beyond the end."""
        if err.code() == KafkaError._PARTITION_EOF:
            eof = _offset(msg)
            if eof < start:
                return False
            result.eof = eof
            self._note_end(eof)
            return True
        if self._check_error(err):
            result.beyond_end = True
            return True
        return False

    def _fetch(
        self, consumer: Consumer, start: int, result: _ReadResult, last_progress: float, drain: int
    ) -> list[Message] | None:
        """The next batch of consumer events: [] when nothing came yet, None when the read must end (the
        start lies beyond the end, which `result` then says)."""
        first = consumer.poll(0.1)
        if first is None:
            idle = time.monotonic() - last_progress
            nothing_yet = not result.records and not result.rows
            if nothing_yet and idle >= self.beyond_end_suspicion and self._past_end(consumer, start):
                result.beyond_end = True
                return None
            if idle >= self._stall_timeout:
                raise BrokerUnavailableError(
                    self._store.bootstrap_servers,
                    f"no data nor end-of-partition from {self.topic}[{self.partition}] at offset {start:,}",
                    self._stall_timeout,
                )
            return []
        # poll() delivers one message; drain what librdkafka already prefetched without waiting
        # (consume() with a timeout would wait for the full count).
        return [first, *consumer.consume(drain, 0)]

    def _past_end(self, consumer: Consumer, start: int) -> bool:
        # The high watermark cached from the latest fetch response: a cheap suspicion only, confirmed by
        # the callers through an EOF scan, because it can be stale or (on Tansu, when queried) understated.
        try:
            wm = consumer.get_watermark_offsets(TopicPartition(self.topic, self.partition), cached=True)
        except KafkaException:
            return False
        if not wm:
            return False
        high = wm[1]
        return 0 <= high < start

    def hint_end(self, offset: int) -> None:
        # Finding the end means consuming to the EOF event (watermarks are unreliable, DESIGN-NOTES 4);
        # starting that read at a known lower bound spares reading the whole partition.
        self._note_end(offset)

    def hint_end_from_store(self) -> None:
        # With the partition's writer initialised its transactions are settled, so the high watermark is
        # the end, or below it where a broker understates it (Tansu, DESIGN-NOTES 4): a start for the
        # end-finder, which still reads to the EOF event. Without an answer, no hint: a slower find only.
        consumer = self._live_consumer()
        try:
            _, high = consumer.get_watermark_offsets(
                TopicPartition(self.topic, self.partition), timeout=self._stall_timeout
            )
        except KafkaException:
            return
        self._note_end(max(0, int(high)))

    def start_offset(self) -> int:
        """The log start: the low watermark (Apache Kafka moves it on `delete_records`; Tansu reports 0)."""
        consumer = self._live_consumer()
        deadline = time.monotonic() + self._stall_timeout
        while True:
            try:
                low, _ = consumer.get_watermark_offsets(
                    TopicPartition(self.topic, self.partition),
                    timeout=max(0.1, deadline - time.monotonic()),
                )
                return max(0, int(low))
            except KafkaException as exc:
                code = _error_code(exc)
                # Unknown partition too: the store saw the topic when it made this reader, so the reader's
                # client has not learnt it yet (a topic just created; found by the chaos runs).
                settling = settles_if_asked_again(exc)
                if not settling or time.monotonic() >= deadline:
                    if code in _NO_ANSWER_CODES:
                        raise BrokerUnavailableError(
                            self._store.bootstrap_servers,
                            f"reading the log start of {self.topic}[{self.partition}]",
                            self._stall_timeout,
                        ) from None
                    raise QueueStoreError(
                        f"cannot read the log start of {self.topic}[{self.partition}]: {exc}"
                    ) from None
            time.sleep(0.05)  # pacing of a bounded poll while the leadership or the connection settles

    def end_offset(self) -> int:
        # The one end-finder (queuestore.kafka.ends), from the known end (a hint, never an answer) or the
        # log start. On the bulk consumer: it waits less per fetch, a forward reader's position is left
        # alone, and recovery's backward reads that follow find it connected already.
        where = f"{self.topic}[{self.partition}]"
        # The log start is asked before the bulk consumer is made, never in between: a librdkafka consumer
        # that idles after it is made (30 ms was enough) and is assigned only then fetches nothing until
        # find_ends' silence check asks the broker's watermark, 0.5 s later (issue 23).
        start = self._known_end or self.start_offset()
        (end,) = find_ends(
            self._bulk_consumer(),
            self.topic,
            [self.partition],
            [start],
            log_start=lambda _p: self.start_offset(),
            stall_timeout=self._stall_timeout,
            on_stall=lambda _waiting: BrokerUnavailableError(
                self._store.bootstrap_servers, f"finding the end of {where}", self._stall_timeout
            ),
            on_unknown=lambda _p, err: UnknownTopicError(f"{where}: {err.str()}"),
            suspicion_after=self.beyond_end_suspicion,
        )
        self._known_end = end
        return end

    def read_forward(self, from_offset: int, max_records: int) -> list[StoredRecord]:
        if max_records <= 0:
            return []
        start = max(0, from_offset)
        result = self._read(start, want=max_records, stop_before=None)
        if result.beyond_end:
            if start < self.start_offset():  # "out of range" below the log start: trimmed, never a gap
                raise self.trimmed(start)
            if start >= self.end_offset():
                return []
            result = self._read(start, want=max_records, stop_before=None)
        return result.records

    def scan_forward_chunks(
        self, from_offset: int = 0, chunk: int = 4096, *, stop_before: int | None = None
    ) -> Iterator[list[StoredRecord]]:
        # Not the base class's record counting: with transaction markers in the way, `chunk` records from
        # `offset` can lie past the end found at the start, and the scan must stop at that end.
        end = self.end_offset() if stop_before is None else stop_before
        offset = max(0, from_offset)
        while offset < end:
            result = self._read(offset, want=max(1, chunk), stop_before=end)
            if result.beyond_end:
                if offset < self.start_offset():  # below the log start: trimmed, never a gap
                    raise self.trimmed(offset)
                # A stale suspicion: `end` was found by consuming to EOF.
                result = self._read(offset, want=max(1, chunk), stop_before=end)
            if not result.records:
                return  # only markers (or aborted records) left below the end
            yield result.records
            offset = result.records[-1].offset + 1

    def read_backward(self, before_offset: int, max_records: int) -> list[StoredRecord]:
        records: list[StoredRecord] = self._backward(before_offset, max_records, as_rows=False)
        return records

    def read_range_rows(self, start: int, stop_before: int) -> list[Row]:
        # One bulk read of the range, rows built by the C accelerator (as read_backward_rows does): no
        # StoredRecord and no headers per message. It ends early at the end of the partition.
        if stop_before <= start:
            return []
        result = self._read(max(0, start), want=None, stop_before=stop_before, as_rows=True)
        if result.beyond_end and start < self.start_offset():
            raise self.trimmed(start)
        if result.beyond_end and self.end_offset() > start:  # stale suspicion: the data is there after all
            result = self._read(max(0, start), want=None, stop_before=stop_before, as_rows=True)
        return result.rows

    def read_backward_rows(self, before_offset: int, max_records: int) -> list[Row]:
        # read_backward without a StoredRecord per message (recovery's EC scan).
        rows: list[Row] = self._backward(before_offset, max_records, as_rows=True)
        return rows

    def _backward(self, before_offset: int, max_records: int, *, as_rows: bool) -> list[Any]:
        """The last `max_records` records (or rows) below `before_offset`, newest first. Offsets are not
        dense (transaction markers take offsets but are never delivered), so a window of `max_records`
        offsets may hold fewer records: each window is one forward read, widened downwards until enough
        or the log start. Each read is at least one fetch round trip, so a row window starts a little wider
        than asked: a transaction marker per commit (and the aborted tail a crash leaves) would otherwise
        cost a second read of a few offsets for almost every chunk; the surplus rows, the oldest, are
        dropped."""
        if max_records <= 0 or before_offset <= 0:
            return []
        collected: list[Any] = []
        upper, floor = before_offset, 0
        while len(collected) < max_records and upper > floor:
            missing = max_records - len(collected)
            lower = max(floor, upper - missing - (missing // 64 + 16 if as_rows else 0))
            result = self._read(lower, want=None, stop_before=upper, as_rows=as_rows)
            if result.beyond_end:
                # "Out of range" below the log start (trimmed there): read down to the log start only.
                log_start = self.start_offset()
                if lower < log_start:
                    floor = log_start
                    continue
                end = self.end_offset()
                if end >= upper:  # stale suspicion: the data is there after all
                    result = self._read(lower, want=None, stop_before=upper, as_rows=as_rows)
                else:
                    upper = end
                    continue
            collected[:0] = result.rows if as_rows else result.records
            upper = lower
        collected.reverse()
        return collected[:max_records]

    def tail(
        self,
        from_offset: int,
        *,
        stop: Callable[[], bool] | None = None,
        idle_timeout: float | None = None,
        batch: int = 4096,
    ) -> Iterator[list[StoredRecord]]:
        self._live_consumer()
        # Its own consumer: a tail runs for long and must not be repositioned by read_forward/end_offset.
        consumer = self._new_consumer(self._store._consumer_config(f"tail-{self.topic}-{self.partition}"))
        batch = max(1, batch)
        try:
            consumer.assign([TopicPartition(self.topic, self.partition, max(0, from_offset))])
            last_data = time.monotonic()
            while stop is None or not stop():
                if self._consumer is None:
                    # The reader was closed, possibly from another thread: closing this consumer from
                    # there while it polls here is unsafe in librdkafka, so the tail notices and ends.
                    raise StoreClosedError(f"reader of {self.topic}[{self.partition}] is closed")
                wait = 0.1
                if idle_timeout is not None:
                    wait = max(0.0, min(wait, idle_timeout - (time.monotonic() - last_data)))
                first = consumer.poll(wait)
                if first is None:
                    if idle_timeout is not None and time.monotonic() - last_data >= idle_timeout:
                        return
                    continue
                out: list[StoredRecord] = []
                for msg in (first, *consumer.consume(batch - 1, 0)) if batch > 1 else (first,):
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            self._note_end(_offset(msg))
                        elif self._check_error(err):
                            raise QueueStoreError(
                                f"tail of {self.topic}[{self.partition}] starts past the end ({from_offset})"
                            )
                        continue
                    out.append(_to_record(msg, _offset(msg)))
                if out:
                    last_data = time.monotonic()
                    self._note_end(out[-1].offset + 1)
                    yield out
        finally:
            # Also runs when an abandoned tail generator is garbage-collected.
            consumer.close()

    def close(self) -> None:
        if self._consumer is None:
            return
        consumer, self._consumer = self._consumer, None
        bulk, self._bulk = self._bulk, None
        try:
            consumer.close()
            if bulk is not None:
                bulk.close()
        finally:
            self._store._forget(self)
