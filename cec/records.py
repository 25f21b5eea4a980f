"""The records of a CEC output queue: the tuple model (`cec.model`: `Kind`, `OutputRecord`) and its wire
format (`cec.wire`: `RecordCodec`, `AvroCodec`, the schema versions), under the one name every layer
imports them by."""

from cec.model import CONTROL_KINDS, FOOTPRINT_KINDS, Kind, OutputRecord
from cec.wire import COMPACT_LAYOUT, MAGIC, SCHEMAS, AvroCodec, RecordCodec, crc32c, read_zigzag, zigzag

__all__ = [
    "COMPACT_LAYOUT",
    "CONTROL_KINDS",
    "FOOTPRINT_KINDS",
    "MAGIC",
    "SCHEMAS",
    "AvroCodec",
    "Kind",
    "OutputRecord",
    "RecordCodec",
    "crc32c",
    "read_zigzag",
    "zigzag",
]
