"""What a queue store keeps of a record besides its value: the model's side of the store interface
(`queuestore.base`, which re-exports both names). It lives with the model so that the record codec
(`cec.records`) needs nothing from the store layer: the model is the bottom of the import graph.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["RecordMeta", "Row"]


class RecordMeta(NamedTuple):
    """What the store keeps beside a record's value.

    `kind` is the tuple kind code (see `cec.records.Kind`), `time` the operator's logical time, and
    `key`/`seq` the window id for records that belong to a window (`None`/-1 otherwise). A NamedTuple, not
    a dataclass: readers build one per record, and recovery scans read hundreds of thousands per second.
    """

    kind: str
    time: int
    key: str | None = None
    seq: int = -1


# A stored record as one flat tuple, (offset, kind, time, key, seq, value): what bulk readers hand to
# recovery's scan without building a StoredRecord and a RecordMeta per record.
Row = tuple[int, str, int, str | None, int, bytes]
