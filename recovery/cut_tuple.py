"""The results of the tuple a crash cut, read from a log's end (DESIGN-NOTES section 2, `recovery.contract`,
"claiming"): a crash may leave some of one tuple's records in the log and not the last one, which claims
it; the tuple is then applied again after recovery. An operator whose windows emit results that close no
window (`Operator.unique_results`: `operators.hopping`) would make those results again; the engine reads
them here, on every host, and does not (`OperatorInstance.restore`, `OperatorInstance.resume`).

The records that carry the crash point's `pos` are the log's last ones (pos never decreases along the
log); the cut tuple's records, if any, are among them, and so may be the complete records of the tuple
before it (which claim it): their results are never made again anyway, since that tuple is not replayed.
"""

from __future__ import annotations

from collections.abc import Sequence

from cec.exceptions import CodecError
from cec.records import Kind, RecordCodec
from queuestore.base import PartitionReader

__all__ = ["results_at_end"]

_BACK = 512  # records read back per step


def results_at_end(reader: PartitionReader, codec: RecordCodec, crash_pos: Sequence[int]) -> list[bytes]:
    """The result payloads of the records at the log's end that carry `crash_pos`, newest first."""
    out: list[bytes] = []
    before = reader.end_offset()
    crash = list(crash_pos)
    while before > 0:
        stored = reader.read_backward(before, _BACK)
        if not stored:
            break
        for record in stored:  # newest first
            try:
                decoded = codec.decode(record.value, record.meta)
            except CodecError:
                continue  # a chunk's part or a damaged record: never a result of the cut tuple
            if list(decoded.pos) != crash:
                return out
            if decoded.kind is Kind.R and decoded.payload is not None:
                out.append(decoded.payload)
        before = stored[-1].offset
    return out
