"""The "cec-kafka" sink (batch and streaming): each row becomes an R record in CEC format, written exactly
once per (sink, micro-batch, task) in one Kafka transaction of the one transactional producer
(`queuestore.kafka.producer`); see `operators.spark.datasource` for the options and the guarantees."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from cec.exceptions import ConfigError
from cec.records import AvroCodec, Kind, OutputRecord, RecordCodec, crc32c
from cec.timeparse import parse_time_ms
from operators.spark.datasource import FORMAT, _Options
from queuestore.exceptions import QueueStoreError

if TYPE_CHECKING:
    from pyspark.sql import Row

__all__ = ["BatchSinkWriter", "SinkCommit", "StreamSinkWriter", "sink_transactional_id", "write_rows"]


@dataclass
class SinkCommit(WriterCommitMessage):
    """What one task wrote: `records` rows of micro-batch `batch_id` (0 for a batch write), or nothing
    when `skipped` (an earlier attempt of the same task and batch had committed them already)."""

    partition_id: int
    records: int
    batch_id: int = 0
    skipped: bool = False


# Task-local properties Spark sets while running a micro-batch: the query's id (kept in its checkpoint,
# so the same across restarts) and the micro-batch id (a re-run batch keeps its id).
_QUERY_ID_PROPERTY = "sql.streaming.queryId"
_BATCH_ID_PROPERTY = "streaming.sql.batchId"
_SINK_TIMEOUT = 60.0


def sink_transactional_id(prefix: str, topic: str, sink_id: str, task: int) -> str:
    """The transactional.id of task `task` of sink `sink_id` (a streaming query id, or one batch write):
    the same for every attempt of the task, so that a new attempt fences an older one still running."""
    return f"{prefix}cec-sink.{topic}.{sink_id}.{task}"


def _write(opts: _Options, rows: Iterator[Row], write_id: str) -> SinkCommit:
    """Write one Spark partition's rows (runs on an executor); see `write_rows`."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    task = ctx.partitionId() if ctx is not None else 0
    query_id = ctx.getLocalProperty(_QUERY_ID_PROPERTY) if ctx is not None else None
    batch = ctx.getLocalProperty(_BATCH_ID_PROPERTY) if ctx is not None else None
    if query_id and batch is not None:
        return write_rows(opts, rows, sink_id=query_id, batch_id=int(batch), task=task)
    return write_rows(opts, rows, sink_id=write_id, batch_id=0, task=task)


def _row_time(value: Any, column: str) -> int:
    """A result row's time in ms: integer milliseconds, a timestamp column, or ISO-8601 text (the forms
    the rest of cec accepts); anything else is the user's mistake, said in one line."""
    try:
        return parse_time_ms(value)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"timeField {column!r}: {value!r} is not a time ({exc})") from None


def write_rows(opts: _Options, rows: Iterator[Any], *, sink_id: str, batch_id: int, task: int) -> SinkCommit:
    """Write `rows` as R records in one Kafka transaction, exactly once per (sink, batch, task).

    The transactional.id is derived from (topic, sink, task), so `init_transactions()` aborts whatever an
    earlier attempt of this task left open and fences it if it is still running (a speculative copy, an
    executor wrongly presumed dead). The transaction also commits, atomically with the records, the
    offset `batch_id + 1` of a consumer group named like the transactional.id: the task's progress. An
    attempt that finds its batch already committed writes nothing (a re-run micro-batch after a driver
    crash between the task commits and Spark's commit log, or a task retried after it had committed).
    """
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    from queuestore.kafka import meta_to_headers
    from queuestore.kafka.config import ClientSettings
    from queuestore.kafka.errors import _kafka_error
    from queuestore.kafka.producer import InDoubtError, TransactionalProducer

    if opts.payload is None:
        raise ConfigError(f"writing to {FORMAT} needs the 'schema' option (the payload's Avro schema)")
    store = opts.store()
    try:
        partitions = store.partitions(opts.topic)
    finally:
        store.close()
    txn_id = sink_transactional_id(opts.transactional_id_prefix, opts.topic, sink_id, task)
    where = f"{FORMAT} sink {opts.topic} (task {task}, batch {batch_id})"
    settings = ClientSettings(opts.bootstrap, dict(opts.client_config), _SINK_TIMEOUT)
    progress = TopicPartition(opts.topic, 0)  # where the group's offset (next batch to write) is kept
    group = Consumer(
        {
            **settings.client(f"cec-sink-{opts.topic}-{task}"),
            "group.id": txn_id,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        try:
            # The one transactional producer (queuestore.kafka.producer): its init fences every earlier
            # attempt of this task.
            txn = TransactionalProducer(
                lambda: settings.transactional_producer(f"cec-sink-{opts.topic}-{task}", txn_id),
                transactional_id=txn_id,
                where=where,
                bootstrap_servers=opts.bootstrap,
                timeout=_SINK_TIMEOUT,
            )
            committed = group.committed([progress], _SINK_TIMEOUT)[0].offset
        except (KafkaException, QueueStoreError) as exc:
            raise QueueStoreError(f"{where}: cannot start its transaction: {exc}") from None
        if committed > batch_id:
            return SinkCommit(task, 0, batch_id, skipped=True)
        codec, payload_codec = RecordCodec(), AvroCodec(opts.payload)
        names = [f["name"] for f in opts.payload["fields"]]
        failures: list[str] = []

        def report(err: Any, _msg: Any) -> None:
            if err is not None:
                failures.append(str(err))

        producer = txn.live()
        try:
            txn.begin()
            count = 0
            for row in rows:
                values = row.asDict() if hasattr(row, "asDict") else dict(row)
                payload = payload_codec.encode({n: values.get(n) for n in names})
                t = _row_time(values[opts.time_field], opts.time_field) if opts.time_field else 0
                record = OutputRecord(Kind.R, t, (), 0, None, -1, None, payload)
                key = None
                if opts.key_field:
                    key = str(values[opts.key_field]).encode()
                    partition = crc32c(key) % partitions
                else:
                    partition = task % partitions
                while True:
                    try:
                        producer.produce(
                            opts.topic,
                            codec.encode(record),
                            key=key,
                            partition=partition,
                            headers=meta_to_headers(record.meta()),
                            on_delivery=report,
                        )
                        break
                    except BufferError:  # local queue full: serve deliveries to make room
                        producer.poll(0.05)
                count += 1
                producer.poll(0)
            if producer.flush(_SINK_TIMEOUT) or failures:
                raise QueueStoreError(f"{where}: records undelivered, failures: {failures[:3]}")
            producer.send_offsets_to_transaction(
                [TopicPartition(opts.topic, 0, batch_id + 1)], group.consumer_group_metadata(), _SINK_TIMEOUT
            )
        except KafkaException as exc:
            # Nothing of this attempt becomes visible (the transaction is aborted, by the next attempt's
            # init_transactions at the latest); Spark retries the task or fails the batch.
            raise QueueStoreError(f"{where}: transaction failed: {exc}") from None
        try:
            txn.commit()
        except KafkaException as exc:
            failure = txn.commit_failure(_kafka_error(exc))
            if isinstance(failure, InDoubtError):
                # Its outcome unknown: a new epoch first, so that no late request of it can land after the
                # task's next attempt has read its progress (the producer's rule for a commit in doubt).
                failure = txn.reset(failure)
            raise QueueStoreError(f"{where}: transaction failed: {failure}") from None
        # A commit that was in doubt at some moment needs no new epoch here: this producer writes nothing
        # more, and the task's next attempt (or batch) starts with a new one, whose init fences this one.
        return SinkCommit(task, count, batch_id)
    finally:
        group.close()


def _ensure_topic(opts: _Options) -> None:
    if opts.partitions is None:
        return
    store = opts.store()
    try:
        store.create_topic(opts.topic, opts.partitions)
    finally:
        store.close()


class BatchSinkWriter(DataSourceWriter):
    def __init__(self, opts: _Options) -> None:
        self.opts = opts
        # One id per write, made on the driver and shipped to the tasks: retries of a task share it.
        self.write_id = uuid.uuid4().hex
        _ensure_topic(opts)

    def write(self, iterator: Iterator[Row]) -> SinkCommit:
        return _write(self.opts, iterator, self.write_id)


class StreamSinkWriter(DataSourceStreamWriter):
    def __init__(self, opts: _Options) -> None:
        self.opts = opts
        self.write_id = uuid.uuid4().hex  # used only if Spark does not say which query and batch run
        _ensure_topic(opts)

    def write(self, iterator: Iterator[Row]) -> SinkCommit:
        return _write(self.opts, iterator, self.write_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # each task committed its own transaction (see write_rows)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Tasks that committed stay committed; when Spark runs the batch again (same query, same batch id)
        # those tasks find their progress and write nothing, the others write their rows once.
        pass
