"""The tuple model of a CEC output queue: the kinds of record and `OutputRecord`.

Every record an operator writes to its output queue is an `OutputRecord`:
- `R`: a result; for a windowed operator also the window's last footprint;
- `GOPEN` / `GCHECK`: window footprints (state after the opening tuple / partial state "as of now");
- `DEAD`: an input tuple the operator could not process (the dead-letter destination lives in the log
  itself, so replay after a crash neither loses nor repeats it);
- `EOS`: the operator reached the end of all its inputs.

Each carries the operator's logical time, `pos` (for every input partition, the next offset it would
read: everything below has been applied), and N, the number of open windows when it was produced.

Their wire format (bytes, checksums, schema versions) is `cec.wire`; `cec.records` names both.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from cec.stored import RecordMeta

__all__ = ["CONTROL_KINDS", "FOOTPRINT_KINDS", "KIND_OF", "KIND_VALUE", "Kind", "OutputRecord"]


class Kind(str, Enum):
    R = "R"
    GOPEN = "GOPEN"
    GCHECK = "GCHECK"
    DEAD = "DEAD"
    EOS = "EOS"


FOOTPRINT_KINDS = frozenset({Kind.GOPEN, Kind.GCHECK})
CONTROL_KINDS = frozenset({Kind.GOPEN, Kind.GCHECK, Kind.DEAD, Kind.EOS})
KIND_VALUE = {k: k.value for k in Kind}  # Enum.value is a descriptor call: too slow per record
KIND_OF = {k.value: k for k in Kind}


@dataclass(frozen=True, slots=True)
class OutputRecord:
    kind: Kind
    time: int
    pos: tuple[int, ...]
    n: int
    key: str | None = None
    seq: int = -1
    state: bytes | None = None
    payload: bytes | None = None
    # Event-time watermarks (recovery.contract, "watermarks"): for each input partition, the largest event
    # time of the tuples below `pos` (LONG_MIN: none yet); empty when the operator keeps no watermark.
    marks: tuple[int, ...] = ()

    @property
    def window(self) -> tuple[str, int] | None:
        return None if self.key is None else (self.key, self.seq)

    def meta(self) -> RecordMeta:
        return RecordMeta(KIND_VALUE[self.kind], self.time, self.key, self.seq)
