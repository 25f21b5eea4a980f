"""EC reconstruction and EC load at the paper's scale, on the embedded SQLite store and on Kafka.

The log is a real one: the paper's aggregate (average price per item, count windows of 10) over 500,000
generated purchases of 100,000 items, stopped at half the input as a crash would stop it, with the CLI
demo's policy (Q=20,000, U=100,000): about 92,000 windows are open at the crash, so the extent is about
92,000 records, nearly all of them footprints. It is built once with the local engine
(`operators.job.run_job`) and cached; for Kafka the same records (bytes and metadata) are copied into a
topic of the broker this script starts (`tests.brokers.start_broker`: Apache Kafka from the jars of
`make kafka-jars`, unless `KAFKA_BOOTSTRAP_SERVERS` names one).

Each measurement runs `RecoveryManager.recover()` (EC build, then EC load: every footprint and its window
state decoded) in a fresh process, in these modes, interleaved over the repeats:
- `current`: this working tree, with the C accelerator (`cec/_native.c`) when it is built;
- `python`: this working tree with `CEC_NO_NATIVE=1` (the pure-Python twins of every fast path);
- `previous`: the implementation before this work (git ref `--previous`, exported with `git archive`);
- `raw`: the same extent read with the bare client (sqlite3 select newest first; confluent-kafka consume
  of the same offsets), no checksum, no objects: what reading alone costs.
Rates are records of the extent read per second of EC build, and windows loaded per second of EC load;
each figure is the best of the repeats, with the process's CPU time beside the wall time (the machine is
shared: wall time includes waiting for a core). The paper's prototype rebuilt ~35,000 tuples/s.

    .venv/bin/python benchmarks/bench_ec.py               # paper scale, SQLite and Kafka: ~3-5 minutes
    .venv/bin/python benchmarks/bench_ec.py --quick       # 100k tuples over 20k keys
    .venv/bin/python benchmarks/bench_ec.py --no-kafka    # SQLite only (--no-sqlite: Kafka only)
    .venv/bin/python benchmarks/bench_ec.py --bytes       # bytes per input tuple, legacy/previous/current
Writes benchmarks/out/ec.json (`--bytes`: benchmarks/out/bytes.json).

`--bytes` measures what each input tuple costs on Kafka, in one run, for three record layouts: `legacy`
(record version 1 with its metadata in the body, plus the metadata packed in the message key and four
`cec.*` headers), `previous` (version 3 body, full window states, `cec.kind` header, window key as message
key, kind/time/seq in a small frame: main before version 4) and `current` (this tree: the compact version-4
body and first-tuple states, same frame): the same records of the paper's aggregate (1,000 keys, count
windows of 10, G-open only, `run_job`) in each layout, counted two ways: Kafka's record format v2
uncompressed (what each record adds to a batch), and the bytes the store's producer (lz4, the store's
batching) actually sent to the broker for them (librdkafka's `txbytes`), interleaved over the repeats.
`--previous-version 3` makes the EC measurement's `previous` tree read version-3 records in the framed
layout (use it with `--previous main` for main before version 4).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PAPER_EC_RATE = 35_000  # tuples/s, the CEC paper's EC-load figures (DESIGN-NOTES section 6)
PREVIOUS = "017c9d9"  # main before the compact record layout (the EC fast paths: dad6680)
MODES = ("current", "python", "previous", "raw")


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- the log ------------------------------------------------------------------------------------------
def _build_log(root: Path, count: int, keys: int, window: int) -> dict[str, Any]:
    """The aggregate's log after a crash at half the input (cached under `root`)."""
    sys.path.insert(0, str(REPO))
    from cec.records import RecordCodec

    version = RecordCodec().version
    done = root / "log.json"
    if done.exists():
        info: dict[str, Any] = json.loads(done.read_text())
        if info.get("record_version") == version:
            _say(f"log: cached in {root} ({info['records']:,} records, record version {version})")
            return info
        # A log cached by an older tree holds that tree's records: measured as "current", this code would
        # read another layout through its compatibility paths (a cache from before version 4 measured EC
        # load at 0.13x the previous implementation, which read its own layout). Build it again.
        _say(f"log: the cache in {root} holds record version {info.get('record_version', '<4')}: rebuilding")
        for stale in (root / "store", *root.glob("store-legacy-v*")):
            shutil.rmtree(stale, ignore_errors=True)
        done.unlink()
    from cec.config import Checkpointing
    from operators.job import JobSpec, run_job
    from queuestore.sqlite import SqliteQueueStore

    batch = 512
    spec = JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "item_id",
            "value_field": "item_price",
            "agg": "avg",
            "window_count": window,
        },
        source={"type": "generator", "count": count, "keys": keys, "seed": 1},
        store={"type": "sqlite", "root": str(root / "store")},
        output_topic="agg",
        checkpointing=Checkpointing(q_target=20_000, u_target=100_000),
        batch_size=batch,
    )
    crash = count // 2
    started = time.monotonic()
    calls = [0, started]

    def progress() -> bool:  # called once per batch: report with total and rate every 2 s
        calls[0] += 1
        now = time.monotonic()
        if now - calls[1] >= 2.0:
            calls[1] = now
            done_tuples = min(crash, calls[0] * batch)
            rate = done_tuples / (now - started)
            _say(f"  log build: ~{done_tuples:,}/{crash:,} tuples, {rate:,.0f} tuples/s")
        return False

    stats = run_job(spec, stop=progress, max_inputs=crash)
    with SqliteQueueStore(root / "store").reader("agg", 0) as reader:
        end = reader.end_offset()
    info = {
        "input": count,
        "keys": keys,
        "window": window,
        "crash_at": crash,
        "records": end,
        "gopens": stats.gopens,
        "gchecks": stats.gchecks,
        "build_seconds": time.monotonic() - started,
        "record_version": version,
    }
    done.write_text(json.dumps(info))
    _say(f"log: {end:,} records in {info['build_seconds']:.1f} s ({root})")
    return info


def _previous_codec(version: int) -> Any:
    from cec.records import SCHEMAS, RecordCodec

    return RecordCodec({v: SCHEMAS[v] for v in range(1, version + 1)})


def _full_state(record: Any) -> Any:
    """`record` with its footprint state in STATE_SCHEMA's full form, as releases before the first-tuple
    form wrote it (and as they can read it)."""
    import dataclasses

    from operators.aggregate import KeyedAggregate

    if record.state is None:
        return record
    op = KeyedAggregate(key_field="item_id", value_field="item_price", window_count=10)
    return dataclasses.replace(record, state=op.encode_state(op.decode_state(record.state)))


def _previous_records(rows: list[Any], version: int = 1) -> list[tuple[Any, bytes]]:
    """(meta, record) of the rows re-encoded as the previous implementation wrote them: record `version`,
    full footprint states."""
    from cec.records import RecordCodec
    from queuestore.base import RecordMeta

    current, previous = RecordCodec(), _previous_codec(version)
    out = []
    for _, kind, t, key, seq, value in rows:
        meta = RecordMeta(kind, t, key, seq)
        out.append((meta, previous.encode(_full_state(current.decode(value, meta)))))
    return out


def _legacy_messages(rows: list[Any], version: int = 1) -> list[tuple[Any, bytes, Any]]:
    """(meta, message value, (message key, headers)) of `_previous_records` on Kafka: for version 1 the
    meta packed in the message key plus four headers, else the framed layout."""
    from queuestore.kafka import encode_message, meta_to_headers, meta_to_key

    out = []
    for meta, data in _previous_records(rows, version):
        if version == 1:
            out.append((meta, data, (meta_to_key(meta), meta_to_headers(meta))))
        else:
            mkey, mvalue, headers = encode_message(data, meta)
            out.append((meta, mvalue, (mkey, headers)))
    return out


def _legacy_sqlite(sqlite_root: Path, dest: Path, version: int = 1) -> None:
    """The log re-encoded as the previous implementation wrote it (record `version`, full states), cached
    in `dest`: what `previous` reads."""
    sys.path.insert(0, str(REPO))
    from queuestore.sqlite import SqliteQueueStore

    if (dest / "done").exists():
        return
    with SqliteQueueStore(sqlite_root).reader("agg", 0) as src:
        rows = src.read_backward_rows(src.end_offset(), 1 << 30)[::-1]
    store = SqliteQueueStore(dest)
    try:
        store.create_topic("agg", 1)
        with store.writer("agg", 0) as writer:
            for meta, value in _previous_records(rows, version):
                writer.append(value, meta)
            writer.flush()
    finally:
        store.close()
    (dest / "done").write_text("")


def _copy_to_kafka_legacy(sqlite_root: Path, bootstrap: str, topic: str, version: int = 1) -> int:
    """The log in the previous implementation's Kafka layout, into `topic` (what `previous` reads)."""
    sys.path.insert(0, str(REPO))
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from queuestore.sqlite import SqliteQueueStore

    with SqliteQueueStore(sqlite_root).reader("agg", 0) as src:
        rows = src.read_backward_rows(src.end_offset(), 1 << 30)[::-1]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "compression.type": "lz4",
        }
    )
    for _, value, (key, headers) in _legacy_messages(rows, version):
        while True:
            try:
                producer.produce(topic, value, key, partition=0, headers=headers)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120):
        raise RuntimeError("legacy copy not delivered")
    return len(rows)


def _copy_to_kafka(sqlite_root: Path, bootstrap: str, state_dir: Path) -> int:
    sys.path.insert(0, str(REPO))
    from queuestore.base import RecordMeta
    from queuestore.kafka import KafkaQueueStore
    from queuestore.sqlite import SqliteQueueStore

    with SqliteQueueStore(sqlite_root).reader("agg", 0) as src:
        rows = src.read_backward_rows(src.end_offset(), 1 << 30)[::-1]
    store = KafkaQueueStore(bootstrap, state_dir)
    try:
        store.create_topic("agg", 1)
        writer = store.writer("agg", 0)
        started = last = time.monotonic()
        for i, (_, kind, t, key, seq, value) in enumerate(rows, 1):
            writer.append(value, RecordMeta(kind, t, key, seq))
            now = time.monotonic()
            if now - last >= 2.0:
                last = now
                _say(f"  copy to Kafka: {i:,}/{len(rows):,} records, {i / (now - started):,.0f}/s")
        writer.close()
    finally:
        store.close()
    return len(rows)


# -- bytes per input tuple ------------------------------------------------------------------------------
def _varint_len(n: int) -> int:
    z = (n << 1) ^ (n >> 63)
    size = 1
    while z >= 0x80:
        z >>= 7
        size += 1
    return size


def _kafka_record_bytes(key: bytes | None, value: bytes, headers: list[tuple[str, Any]], delta: int) -> int:
    """Bytes of one record in a Kafka record batch (format v2), uncompressed, batch header excluded."""
    body = 1 + 1 + _varint_len(delta)  # attributes, timestamp delta (same millisecond), offset delta
    body += _varint_len(-1 if key is None else len(key)) + (0 if key is None else len(key))
    body += _varint_len(len(value)) + len(value) + _varint_len(len(headers))
    for name, raw in headers:
        raw = raw.encode() if isinstance(raw, str) else raw or b""
        body += _varint_len(len(name)) + len(name) + _varint_len(len(raw)) + len(raw)
    return _varint_len(body) + body


def _layouts(rows: list[Any]) -> dict[str, list[tuple[bytes | None, bytes, list[Any]]]]:
    """The Kafka messages (key, value, headers) of the log's records in each layout: `legacy` (record
    version 1, meta in the message key and four headers), `previous` (version 3 in the framed layout, full
    states: main before version 4), `current` (this tree: version 4, first-tuple states)."""
    from cec.records import RecordCodec
    from queuestore.base import RecordMeta
    from queuestore.kafka import encode_message

    current = RecordCodec()
    out: dict[str, list[tuple[bytes | None, bytes, list[Any]]]] = {
        "legacy": [(key, value, headers) for _, value, (key, headers) in _legacy_messages(rows, 1)],
        "previous": [(key, value, headers) for _, value, (key, headers) in _legacy_messages(rows, 3)],
        "current": [],
    }
    for _, kind, t, key, seq, value in rows:
        meta = RecordMeta(kind, t, key, seq)
        out["current"].append(encode_message(current.encode(current.decode(value, meta)), meta))
    return out


def _produced_bytes(bootstrap: str, messages: list[tuple[bytes | None, bytes, list[Any]]]) -> int:
    """Bytes the store's producer configuration sends to the broker for `messages` (librdkafka's txbytes,
    every request included), into a topic of their own."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"bytes-{os.getpid()}-{time.monotonic_ns()}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept referenced until the topic exists
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    stats: list[dict[str, Any]] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "batch.num.messages": 10_000,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 100_000,
            "statistics.interval.ms": 100,
            "stats_cb": lambda raw: stats.append(json.loads(raw)),
        }
    )
    for key, value, headers in messages:
        while True:
            try:
                producer.produce(topic, value, key, partition=0, headers=headers)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(60):
        raise RuntimeError("records not delivered")
    seen = len(stats)
    deadline = time.monotonic() + 10
    while len(stats) <= seen + 1 and time.monotonic() < deadline:  # a report made after the flush
        producer.poll(0.1)
    last = stats[-1]
    return sum(int(b.get("txbytes", 0)) for b in last["brokers"].values())


def _bytes_per_tuple(args: argparse.Namespace) -> int:
    """`--bytes`: the aggregate's log at 1,000 keys in both layouts (module docstring)."""
    sys.path.insert(0, str(REPO))
    from cec.config import Checkpointing
    from operators.job import JobSpec, run_job
    from queuestore.sqlite import SqliteQueueStore
    from tests.brokers import start_broker

    count, keys = args.bytes_input, args.bytes_keys
    with tempfile.TemporaryDirectory() as tmp:
        spec = JobSpec(
            operator={
                "type": "aggregate",
                "key_field": "item_id",
                "value_field": "item_price",
                "agg": "avg",
                "window_count": args.window,
            },
            source={"type": "generator", "count": count, "keys": keys, "seed": 1},
            store={"type": "sqlite", "root": str(Path(tmp) / "store")},
            output_topic="agg",
            checkpointing=Checkpointing(),  # no targets: G-open only
            batch_size=512,
        )
        stats = run_job(spec)
        with SqliteQueueStore(Path(tmp) / "store").reader("agg", 0) as reader:
            rows = reader.read_backward_rows(reader.end_offset(), 1 << 30)[::-1]
    layouts = _layouts(rows)
    result: dict[str, Any] = {
        "command": "benchmarks/bench_ec.py " + " ".join(sys.argv[1:]),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "input_tuples": count,
        "keys": keys,
        "window": args.window,
        "records": len(rows),
        "gopens": stats.gopens,
        "gchecks": stats.gchecks,
    }
    for name, messages in layouts.items():
        record_bytes = sum(_kafka_record_bytes(k, v, h, i % 10_000) for i, (k, v, h) in enumerate(messages))
        result[name] = {
            "record_bytes_per_tuple": record_bytes / count,
            "value_bytes_per_record": sum(len(v) for _, v, _ in messages) / len(messages),
            "beside_bytes_per_record": sum(
                len(k or b"") + sum(len(n) + len(x or b"") for n, x in h) for k, _, h in messages
            )
            / len(messages),
            "sent_bytes_per_tuple": [],
        }
    broker = start_broker()
    try:
        for _ in range(args.repeats):
            for name in layouts:
                sent = _produced_bytes(broker.bootstrap, layouts[name])
                result[name]["sent_bytes_per_tuple"].append(sent / count)
                _say(
                    f"  {name}: {sent / count:,.1f} bytes sent per input tuple (load {os.getloadavg()[0]:.1f})"
                )
    finally:
        broker.stop()
    lines = [
        f"{count:,} input tuples, {keys:,} keys, window {args.window}, G-open only: {len(rows):,} records"
    ]
    for name in layouts:
        r = result[name]
        r["sent_bytes_per_tuple_median"] = statistics.median(r["sent_bytes_per_tuple"])
        lines.append(
            f"  {name:<8}: beside the value {r['beside_bytes_per_record']:.1f} B/record, value "
            f"{r['value_bytes_per_record']:.1f} B/record, record bytes {r['record_bytes_per_tuple']:.2f} B/tuple "
            f"(uncompressed), sent {r['sent_bytes_per_tuple_median']:.2f} B/tuple (lz4, median of {args.repeats})"
        )
    for old in ("legacy", "previous"):
        result[f"ratio_record_bytes_current_{old}"] = (
            result["current"]["record_bytes_per_tuple"] / result[old]["record_bytes_per_tuple"]
        )
        result[f"ratio_sent_bytes_current_{old}"] = (
            result["current"]["sent_bytes_per_tuple_median"] / result[old]["sent_bytes_per_tuple_median"]
        )
        lines.append(
            f"  current/{old}: record bytes {result[f'ratio_record_bytes_current_{old}']:.2f}, "
            f"sent {result[f'ratio_sent_bytes_current_{old}']:.2f}"
        )
    print("\n".join(lines))
    out = (
        Path(args.out).with_name("bytes.json")
        if args.out == str(HERE / "out" / "ec.json")
        else Path(args.out)
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    _say(f"wrote {out}")
    return 0


# -- one measurement, in its own process ----------------------------------------------------------------
def _worker(store_spec: dict[str, Any], mode: str) -> dict[str, Any]:
    import recovery.manager
    from operators.aggregate import KeyedAggregate
    from queuestore.factory import open_store
    from recovery.manager import RecoveryManager

    class TimedBuilder(recovery.manager.EventualCheckpointBuilder):  # type: ignore[misc,name-defined]
        """Separates the EC build's CPU time from EC-load's inside the real recover() path."""

        cpu = 0.0

        def build(self) -> Any:
            started = time.process_time()
            try:
                return super().build()
            finally:
                TimedBuilder.cpu = time.process_time() - started

    recovery.manager.EventualCheckpointBuilder = TimedBuilder  # type: ignore[attr-defined]
    store = open_store(store_spec)
    try:
        reader = store.reader(store_spec.get("topic", "agg"), 0)
        end = int(store_spec["end"])
        reader.hint_end(end)  # as the runtime does with the stream index
        op = KeyedAggregate(key_field="item_id", value_field="item_price", window_count=10)
        cpu, wall = time.process_time(), time.perf_counter()
        rec = RecoveryManager(reader, op.decode_state).recover(1)
        total_cpu = time.process_time() - cpu
        report = rec.report
        out = {
            "mode": mode,
            "records_read": report.records_read,
            "extent": report.extent_records,
            "windows": report.ec_windows,
            "build_s": report.ec_build_seconds,
            "load_s": report.ec_load_seconds,
            "recover_wall_s": time.perf_counter() - wall,
            "recover_cpu_s": total_cpu,
            "build_cpu_s": TimedBuilder.cpu,
            "extent_start": rec.checkpoint.extent_start,
        }
        import recovery.eventual

        out["code"] = str(Path(recovery.eventual.__file__).resolve().parent.parent)  # which tree ran
        out["native"] = getattr(recovery.eventual, "native", None) is not None
        reader.close()
        return out
    finally:
        store.close()


def _raw(store_spec: dict[str, Any], extent_start: int) -> dict[str, Any]:
    """The extent read with the bare client: no checksums, no objects beyond what the client makes."""
    import gc

    gc.disable()  # as during the EC build: reading alone
    end = int(store_spec["end"])
    if store_spec["type"] == "sqlite":
        import sqlite3

        conn = sqlite3.connect(f"file:{Path(store_spec['root']) / 'agg' / '0.sqlite'}?mode=ro", uri=True)
        cpu, wall = time.process_time(), time.perf_counter()
        rows = conn.execute(
            "SELECT offset, kind, time, key, seq, value FROM log WHERE offset >= ? ORDER BY offset DESC",
            (extent_start,),
        ).fetchall()
        out = {"records": len(rows), "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
        conn.close()
        return out
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": store_spec["bootstrap_servers"],
            "group.id": f"bench-ec-raw-{os.getpid()}",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,  # as the cec reader
        }
    )
    cpu, wall = time.process_time(), time.perf_counter()
    consumer.assign([TopicPartition("agg", 0, extent_start)])
    n = 0
    done = False
    while not done:
        for msg in consumer.consume(10_000, 0.1):
            err = msg.error()
            if err is not None:
                done = err.code() == KafkaError._PARTITION_EOF
                if done:
                    break
                continue
            if (msg.offset() or 0) >= end:
                done = True
                break
            n += 1
    out = {"records": n, "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
    consumer.close()
    return out


def _run_worker(
    mode: str, store_spec: dict[str, Any], previous_tree: Path | None, extent_start: int
) -> dict[str, Any]:
    env = dict(os.environ)
    root = REPO
    if mode == "python":
        env["CEC_NO_NATIVE"] = "1"
    elif mode == "previous":
        assert previous_tree is not None
        root = previous_tree
        store_spec = store_spec.get("previous", store_spec)  # the log as the previous code wrote it
    env["CEC_BENCH_ROOT"] = str(root)
    payload = json.dumps({"mode": mode, "store": store_spec, "extent_start": extent_start})
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", payload],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} worker failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _export_previous(ref: str, dest: Path) -> Path | None:
    try:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        _say(f"previous implementation ({ref}) not available: {exc}")
        return None
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    # Its own C accelerator: without one, the editable install's import hook would hand it this tree's
    # `cec._native`, whose functions need not match the previous Python code.
    if (dest / "cec" / "_native.c").exists():
        import sysconfig

        target = dest / "cec" / f"_native{sysconfig.get_config_var('EXT_SUFFIX')}"
        cc = sysconfig.get_config_var("CC") or "cc"
        command = [
            *cc.split(),
            "-shared",
            "-fPIC",
            "-O2",
            f"-I{sysconfig.get_paths()['include']}",
            str(dest / "cec" / "_native.c"),
            "-o",
            str(target),
        ]
        if subprocess.run(command, capture_output=True, check=False).returncode != 0:
            _say(f"previous implementation ({ref}): its C accelerator does not build; not measured")
            return None
    return dest


# -- the benchmark ------------------------------------------------------------------------------------
def _measure(
    backend: str, store_spec: dict[str, Any], repeats: int, previous_tree: Path | None
) -> dict[str, Any]:
    modes = [m for m in MODES if m != "previous" or previous_tree is not None]
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    extent_start = 0
    total = repeats * len(modes)
    started = time.monotonic()
    for _ in range(repeats):
        for mode in ("current", *[m for m in modes if m != "current"]):  # current first: raw needs T
            if mode == "raw":
                raw = _run_worker("raw", store_spec, previous_tree, extent_start)
                runs["raw"].append(raw)
                line = f"raw read {raw['records']:,} records {raw['records'] / raw['wall_s']:,.0f}/s"
            else:
                res = _run_worker(mode, store_spec, previous_tree, extent_start)
                extent_start = res["extent_start"]
                runs[mode].append(res)
                line = (
                    f"{mode}: EC build {res['records_read'] / res['build_s']:,.0f} records/s, "
                    f"load {res['windows'] / res['load_s']:,.0f} windows/s"
                )
            done = sum(len(v) for v in runs.values())
            _say(
                f"  {backend} [{done}/{total}, {time.monotonic() - started:.0f} s]: {line} "
                f"(load average {os.getloadavg()[0]:.1f})"
            )
    summary: dict[str, Any] = {"runs": runs}
    for mode in modes:
        if mode == "raw":
            rates = [x["records"] / x["wall_s"] for x in runs[mode]]
            cpu_rates = [x["records"] / max(x["cpu_s"], 1e-9) for x in runs[mode]]
            summary["raw"] = {
                "records_per_s": max(rates),
                "median": statistics.median(rates),
                "records_per_cpu_s": max(cpu_rates),
            }
            continue
        build = [x["records_read"] / x["build_s"] for x in runs[mode]]
        build_cpu = [x["records_read"] / max(x["build_cpu_s"], 1e-9) for x in runs[mode]]
        load_cpu = [x["windows"] / max(x["recover_cpu_s"] - x["build_cpu_s"], 1e-9) for x in runs[mode]]
        load = [x["windows"] / x["load_s"] for x in runs[mode]]
        summary[mode] = {
            "build_records_per_s": max(build),
            "build_median": statistics.median(build),
            "build_records_per_cpu_s": max(build_cpu),
            "load_windows_per_cpu_s": max(load_cpu),  # recover() CPU minus build CPU (includes the plan)
            "load_windows_per_s": max(load),
            "load_median": statistics.median(load),
            "records_read": runs[mode][0]["records_read"],
            "windows": runs[mode][0]["windows"],
            "build_ms_best": min(x["build_s"] for x in runs[mode]) * 1000,
            "load_ms_best": min(x["load_s"] for x in runs[mode]) * 1000,
            "native": runs[mode][0].get("native", False),
        }
    return summary


def _report(backend: str, s: dict[str, Any]) -> list[str]:
    cur = s["current"]
    lines = [
        f"{backend}: extent {cur['records_read']:,} records, {cur['windows']:,} open windows",
        f"  EC build  current {cur['build_records_per_s']:>10,.0f} records/s (median {cur['build_median']:,.0f})",
    ]
    lines.append(
        f"            (per second of CPU time of the recovering process: {cur['build_records_per_cpu_s']:,.0f})"
    )
    raw = s["raw"]["records_per_s"]
    lines.append(
        f"            raw read {raw:>9,.0f} records/s   current/raw {cur['build_records_per_s'] / raw:.2f}"
    )
    for mode in ("previous", "python"):
        if mode in s:
            b = s[mode]["build_records_per_s"]
            lines.append(
                f"            {mode:<9}{b:>9,.0f} records/s   current/{mode} {cur['build_records_per_s'] / b:.2f}"
            )
    lines.append(
        f"            paper       35,000 records/s   current/paper {cur['build_records_per_s'] / PAPER_EC_RATE:.1f}"
    )
    lines.append(
        f"  EC load   current {cur['load_windows_per_s']:>10,.0f} windows/s (median {cur['load_median']:,.0f})"
    )
    for mode in ("previous", "python"):
        if mode in s:
            b = s[mode]["load_windows_per_s"]
            lines.append(
                f"            {mode:<9}{b:>9,.0f} windows/s   current/{mode} {cur['load_windows_per_s'] / b:.2f}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", type=int, default=500_000)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="100k tuples over 20k keys, 2 repeats")
    p.add_argument("--no-kafka", action="store_true")
    p.add_argument("--no-sqlite", action="store_true")
    p.add_argument("--previous", default=PREVIOUS, help="git ref of the implementation to compare with")
    p.add_argument(
        "--previous-version",
        type=int,
        default=1,
        help="record version the previous implementation reads (1: 017c9d9; 3: main before version 4)",
    )
    p.add_argument("--cache", help="where the log is kept between runs (default: under the temp dir)")
    p.add_argument("--out", default=str(HERE / "out" / "ec.json"))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--bytes", action="store_true", help="bytes per input tuple, legacy vs current layout")
    p.add_argument("--bytes-input", type=int, default=100_000)
    p.add_argument("--bytes-keys", type=int, default=1_000)
    args = p.parse_args(argv)
    if args.bytes:
        return _bytes_per_tuple(args)

    if args.worker:
        job = json.loads(args.worker)
        sys.path.insert(0, os.environ.get("CEC_BENCH_ROOT", str(REPO)))
        if job["mode"] == "raw":
            print(json.dumps(_raw(job["store"], job["extent_start"])))
        else:
            print(json.dumps(_worker(job["store"], job["mode"])))
        return 0

    if args.quick:
        args.input, args.keys, args.repeats = 100_000, 20_000, 2
    cache = Path(
        args.cache or Path(tempfile.gettempdir()) / f"cec-bench-ec-{args.input}-{args.keys}-{args.window}"
    )
    cache.mkdir(parents=True, exist_ok=True)
    info = _build_log(cache, args.input, args.keys, args.window)
    result: dict[str, Any] = {
        "command": "benchmarks/bench_ec.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_average_at_start": os.getloadavg()[0],
        "log": info,
        "paper_ec_rate": PAPER_EC_RATE,
        "previous_ref": args.previous,
        "targets": {"sqlite_build": 500_000, "kafka_build": 300_000, "load": 300_000},
    }
    with tempfile.TemporaryDirectory() as tmp:
        previous_tree = _export_previous(args.previous, Path(tmp) / "previous")
        sqlite_spec: dict[str, Any] = {"type": "sqlite", "root": str(cache / "store"), "end": info["records"]}
        if previous_tree is not None:
            legacy = cache / f"store-legacy-v{args.previous_version}"
            _legacy_sqlite(cache / "store", legacy, args.previous_version)
            sqlite_spec["previous"] = {**sqlite_spec, "root": str(legacy)}
        if not args.no_sqlite:
            _say("SQLite:")
            result["sqlite"] = _measure("sqlite", sqlite_spec, args.repeats, previous_tree)
        if not args.no_kafka:
            sys.path.insert(0, str(REPO))
            from tests.brokers import start_broker

            broker = start_broker()
            try:
                _say(f"Kafka ({broker.kind} at {broker.bootstrap}):")
                state = Path(tmp) / "kafka-state"
                copied = _copy_to_kafka(cache / "store", broker.bootstrap, state)
                kafka_spec = {
                    "type": "kafka",
                    "bootstrap_servers": broker.bootstrap,
                    "state_dir": str(state),
                    "end": copied,
                }
                if previous_tree is not None:
                    _copy_to_kafka_legacy(
                        cache / "store", broker.bootstrap, "agg-legacy", args.previous_version
                    )
                    kafka_spec["previous"] = {**kafka_spec, "topic": "agg-legacy"}
                result["kafka"] = _measure("kafka", kafka_spec, args.repeats, previous_tree)
                result["broker"] = broker.kind
            finally:
                broker.stop()
    lines = []
    for backend in ("sqlite", "kafka"):
        if backend in result:
            lines += _report(backend, result[backend])
    print("\n".join(lines))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    _say(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
