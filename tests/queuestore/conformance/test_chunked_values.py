"""Values larger than a store's record limit (a big window state) are written all-or-nothing as parts plus
a manifest: read back whole, a torn write is never loaded, and recovery stays exact. Both backends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cec.config import Checkpointing
from cec.records import Kind, OutputRecord, RecordCodec
from operators.job import JobSpec, run_job
from queuestore.chunks import PART_KIND, reassemble, split
from queuestore.exceptions import TornRecordError
from queuestore.output import OutputQueue
from recovery.eventual import EventualCheckpointBuilder
from tests.conftest import StoreBackend
from tests.helpers import child_env, results, start_worker, wait_for

LIMIT = 200  # bytes a record may hold in these tests: every footprint below is chunked


def _footprint(key: str, seq: int, state: bytes, pos: int, n: int, kind: Kind = Kind.GCHECK) -> OutputRecord:
    return OutputRecord(kind, pos, (pos,), n, key, seq, state, None)


def test_a_large_state_is_read_back_whole(store_backend: StoreBackend) -> None:
    store = store_backend()
    store.max_record_bytes = LIMIT
    topic = store_backend.topic("big")
    store.create_topic(topic, 1)
    codec = RecordCodec()
    big = os.urandom(5000)
    output = OutputQueue(store, topic, 0)
    output.append(*_encoded(codec, _footprint("k", 0, b"small", 1, 1, Kind.GOPEN)))
    output.append(*_encoded(codec, _footprint("k", 0, big, 2, 1)))
    output.close()
    with store.reader(topic, 0) as reader:
        # A Kafka commit is readable once the broker wrote its markers (the store contract, queuestore.base).
        wait_for(lambda: [r.meta.kind for r in reader.scan_forward(0)][-1:] == ["GCHECK"])
        kinds = [r.meta.kind for r in reader.scan_forward(0)]
        assert kinds.count(PART_KIND) > 5000 // LIMIT and kinds[-1] == "GCHECK"
        ec = EventualCheckpointBuilder(reader).build()
    assert ec.windows["k"].record.state == big  # the latest footprint, whole


def _encoded(codec: RecordCodec, record: OutputRecord) -> tuple[bytes, object]:
    return codec.encode(record), record.meta()


def test_parts_that_do_not_add_up_are_refused(store_backend: StoreBackend) -> None:
    """Fault injection on the bytes: a manifest whose parts are missing or damaged never yields a value."""
    store = store_backend()
    topic = store_backend.topic("torn")
    store.create_topic(topic, 1)
    codec = RecordCodec()
    record = _footprint("k", 0, os.urandom(3000), 1, 1)
    pieces = split(codec.encode(record), record.meta(), LIMIT)
    with store.writer(topic, 0) as writer:
        for value, meta in pieces[:3] + pieces[4:]:  # part 3 lost
            writer.append(value, meta)
    with store.reader(topic, 0) as reader:
        manifest = reader.read_backward(reader.end_offset(), 1)[0]
        with pytest.raises(TornRecordError):
            reassemble(reader, manifest)


_CHILD = """
import os, signal, sys
from cec.records import Kind, OutputRecord, RecordCodec
from queuestore.chunks import split
from queuestore.factory import open_store
from queuestore.output import OutputQueue
spec, topic = eval(sys.argv[1]), sys.argv[2]
store = open_store(spec)
store.max_record_bytes = 200
output = OutputQueue(store, topic, 0)
codec = RecordCodec()
def record(kind, state, pos):
    return OutputRecord(kind, pos, (pos,), 1, "k", 0, state, None)
for r in (record(Kind.GOPEN, b"opened", 1), record(Kind.GCHECK, b"older" * 300, 2)):
    output.append(codec.encode(r), r.meta())
output.flush()
# The newer footprint's parts become durable, then the process dies before its manifest: the state a
# batch boundary in the middle of a chunked value leaves behind.
newer = record(Kind.GCHECK, b"newer" * 300, 3)
pieces = split(codec.encode(newer), newer.meta(), store.value_limit(newer.meta()))
for value, meta in pieces[:-1]:
    output.writer.append(value, meta)
output.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_write_torn_between_parts_is_never_loaded(store_backend: StoreBackend) -> None:
    store = store_backend()
    topic = store_backend.topic("kill")
    store.create_topic(topic, 1)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, repr(store_backend.spec), topic],
        env=child_env(),
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    with store.reader(topic, 0) as reader:
        assert (
            reader.read_backward(reader.end_offset(), 1)[0].meta.kind == PART_KIND
        )  # orphan parts at the end
        ec = EventualCheckpointBuilder(reader).build()
    assert ec.windows["k"].record.state == b"older" * 300  # the last whole footprint, never a partial one
    assert ec.crash_pos == (2,)


def _job(backend: StoreBackend, topic: str) -> JobSpec:
    # Room for about 20 bytes of value (Kafka also counts the metadata that travels beside it): every
    # G-open, G-check, R and dead letter of this job (22 bytes and more in record version 4) is written in
    # parts.
    store = {**backend.spec, "max_record_bytes": 116 if backend.name == "kafka" else 20}
    return JobSpec(
        operator={"type": "aggregate", "key_field": "item_id", "value_field": "item_price", "agg": "avg",
                  "window_count": 4},
        source={"type": "generator", "count": 1500, "keys": 30, "seed": 5, "invalid_every": 50},
        store=store, output_topic=topic, checkpointing=Checkpointing(q_target=40, ci_ms=1.0, cp_ms=10.0), batch_size=32,
    )  # fmt: skip


def test_recovery_is_exact_when_every_record_is_chunked(store_backend: StoreBackend, tmp_path: Path) -> None:
    reference = store_backend.topic("ref")
    run_job(_job(store_backend, reference))
    store = store_backend()
    want, want_dead = results(store, reference), results(store, reference, Kind.DEAD)
    assert want and want_dead
    topic = store_backend.topic("agg")
    spec = _job(store_backend, topic)
    for faults in ("chunks.between_parts:900", "runtime.after_append:150"):
        proc = start_worker(spec, tmp_path / "spec.json", faults=faults)
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == -signal.SIGKILL, err.decode()[-3000:]
    proc = start_worker(spec, tmp_path / "spec.json")
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err.decode()[-3000:]
    assert results(store, topic) == want
    assert results(store, topic, Kind.DEAD) == want_dead
    with store.reader(topic, 0) as reader:
        assert any(r.meta.kind == PART_KIND for r in reader.read_forward(0, 50))
