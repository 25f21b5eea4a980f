"""EC build and load rates measured at startup, before any recovery has measured them (`cec.rates`).

The recovery-time controller (`cec.policy.RecoveryTimePolicy`) plans with the EC build rate (records/s)
and the EC load rate (windows/s). Until a recovery has measured them it used to derive them from the live
processing rate, which at the paper's scale put them 4x too low (71k/s assumed, ~300k/s real under load
~3): the controller then believed that rebuilding 88k windows alone took 2.5 s of a 3 s target and chose
U from that. Here the real code (`RecoveryManager.recover`: the EC scan with its checksums and rules, then
every footprint and its state decoded) runs over a synthetic extent held in memory, a few thousand
G-opens of a small flat state, and the rates are taken from that run. Reading the extent from a store
costs on top of it; `READ_SHARE` is how much of the EC build that reading took, measured per backend at
the paper's scale (benchmarks/RESULTS.md), so the calibrated build rate includes it.
"""

from __future__ import annotations

import time
from typing import Any

from cec.records import AvroCodec, Kind, OutputRecord, RecordCodec
from cec.registry import WindowRegistry
from queuestore.base import PartitionReader, RecordMeta, Row, StoredRecord
from recovery.manager import RecoveryManager

__all__ = ["READ_SHARE", "calibrate_ec_rates", "synthetic_extent"]

# Share of EC build time spent reading the extent from the store, measured at the paper's scale:
# SQLite raw read 853k records/s against the whole build at 473k/s -> reading is ~0.55 of the build;
# Kafka (Tansu) raw consume 327k/s against 263k/s -> ~0.80 (RESULTS.md, "EC reconstruction and EC load").
READ_SHARE = {"sqlite": 0.55, "kafka": 0.80}
_DEFAULT_READ_SHARE = 0.80  # an unknown backend: as slow as the slowest measured

_STATE_SCHEMA = {
    "type": "record",
    "name": "CalibrationState",
    "fields": [
        {"name": "count", "type": "long"},
        {"name": "total", "type": "double"},
        {"name": "first", "type": "long"},
    ],
}


class _MemoryReader(PartitionReader):
    """A partition held in memory (rows oldest first), read the way recovery reads a store."""

    def __init__(self, rows: list[Row]) -> None:
        self.topic = "calibration"
        self.partition = 0
        self._rows = rows

    def end_offset(self) -> int:
        return len(self._rows)

    def read_backward_rows(self, before_offset: int, max_records: int) -> list[Row]:
        upper = min(before_offset, len(self._rows))
        return self._rows[max(0, upper - max_records) : upper][::-1]

    def read_forward(self, from_offset: int, max_records: int) -> list[StoredRecord]:
        return [_stored(r) for r in self._rows[from_offset : from_offset + max_records]]

    def read_backward(self, before_offset: int, max_records: int) -> list[StoredRecord]:
        return [_stored(r) for r in self.read_backward_rows(before_offset, max_records)]

    def tail(self, from_offset: int, **_: Any) -> Any:  # never used by recovery
        raise NotImplementedError

    def close(self) -> None:
        pass


def _stored(row: Row) -> StoredRecord:
    offset, kind, t, key, seq, value = row
    return StoredRecord(offset, value, RecordMeta(kind, t, key, seq))


def synthetic_extent(windows: int, codec: RecordCodec | None = None) -> list[Row]:
    """The rows of a log whose extent is `windows` G-opens, each of its own window, all open at the end
    (the shape of the paper's-scale extent: nearly every record a footprint that enters the EC)."""
    codec = codec or RecordCodec()
    state_codec = AvroCodec(_STATE_SCHEMA)
    rows: list[Row] = []
    for i in range(windows):
        time_ = 1_700_000_000_000 + i
        record = OutputRecord(
            Kind.GOPEN, time_, (i + 1,), i + 1, f"item-{i:06d}", 0,
            state_codec.encode_tuple((1, 10.0 + i, time_)),
        )  # fmt: skip
        rows.append((i, Kind.GOPEN.value, time_, record.key, 0, codec.encode(record)))
    return rows


def calibrate_ec_rates(
    *,
    windows: int = 4096,
    backend: str | None = None,
    codec: RecordCodec | None = None,
    rows: list[Row] | None = None,
    repeats: int = 2,
) -> tuple[float, float]:
    """(EC build records/s, EC load windows/s) of this code on this machine now: one recovery of a
    synthetic in-memory extent of `windows` footprints, the build rate then scaled by the share of the
    build that reading from `backend` takes (`READ_SHARE`). `rows`: an extent made beforehand (tests).
    Takes ~30-80 ms at 4,096 windows with the C accelerator (more under load, and without it)."""
    codec = codec or RecordCodec()
    rows = rows if rows is not None else synthetic_extent(windows, codec)
    state_codec = AvroCodec(_STATE_SCHEMA)
    manager = RecoveryManager(_MemoryReader(rows), state_codec.decode_tuple, codec=codec)
    # A first short pass pays the one-time costs (imports, schema compilation, caches) that a recovery
    # of a real extent pays once too; then the best of `repeats` (the machine is shared: a pass that lost
    # its core says more about the neighbours than about the code).
    RecoveryManager(
        _MemoryReader(synthetic_extent(256, codec)), state_codec.decode_tuple, codec=codec
    ).recover(1)
    build_s = load_s = float("inf")
    records = found = 0
    for _ in range(max(1, repeats)):
        recovery = manager.recover(1)
        report = recovery.report
        records, found = report.records_read, report.ec_windows
        # EC load as a recovery pays it: the states decoded, then the windows installed in a registry
        # (`RecoveryReport.install_seconds`), which at the paper's scale costs about as much again.
        install_started = time.perf_counter()
        WindowRegistry().load(recovery.windows)
        install_s = time.perf_counter() - install_started
        # A timer too coarse to see a phase pass counts as one tick: a rate too low rather than infinite.
        build_s = min(build_s, max(report.ec_build_seconds, 1e-6))
        load_s = min(load_s, max(report.ec_load_seconds + install_s, 1e-6))
    share = READ_SHARE.get(backend or "", _DEFAULT_READ_SHARE)
    memory_build_rate = records / build_s
    # Reading takes `share` of the real build, the rest is what ran here: build = memory rate * (1 - share).
    return memory_build_rate * (1.0 - share), found / load_s
