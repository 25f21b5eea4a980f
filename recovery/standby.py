"""The standby's view of a primary's output log (design S1, `designs/standby.md`): the eventual checkpoint
kept forward as the primary's records become readable, and at takeover, once the standby holds the
partition's writer (the old one fenced, so the log's end is final), that checkpoint brought to the end.

Invariant (the model test holds it for every prefix of a real log): after following the log up to X,
`LogFollower.forward.checkpoint(codec, X)` is what `recovery.eventual.EventualCheckpointBuilder` reads back
from `log[0..X]`. Every record is checked by checksum before it is applied (`recovery.cached.apply_tail`);
a damaged one, a log replaced or trimmed past what was followed, or windows that do not add up to the
crash point's N are reasons (strings), and recovery then reads the log back as a cold restart does:
what a standby followed is derived data, never trusted blindly.
"""

from __future__ import annotations

from cec.records import FOOTPRINT_KINDS, RecordCodec
from queuestore.base import PartitionReader, Row
from recovery.cached import apply_tail, checkpoint_after_tail, matches_log
from recovery.eventual import ECFootprint, EventualCheckpoint, gc_paused
from recovery.forward import ForwardCheckpoint

__all__ = ["FollowedCheckpoint", "LogFollower", "checkpoint_from_followed"]

_FOOTPRINT_CODES = frozenset(k.value for k in FOOTPRINT_KINDS)


class FollowedCheckpoint(ForwardCheckpoint):
    """A forward checkpoint that also keeps, for a standby:
    - the closed-window directory of what it applied: key -> the window sequence of its last R (what the
      stream index answers, `queuestore.index.last_closed_seq`), for its replica, which meets keys whose
      windows closed before it started (`operators.replica`);
    - each open window's footprint (`ECFootprint`, its record decoded), oldest first, kept as the standby
      follows (`decode_pending`, in batches): at the takeover the checkpoint's windows are then a copy of
      that mapping, not ~90,000 footprints made and decoded after the primary died (at the paper's scale
      that was ~0.3 s of a takeover, most of it once a replica spares the states and the replay)."""

    __slots__ = ("_shared", "_undecoded", "closed", "footprints")

    def __init__(self) -> None:
        super().__init__()
        self.closed: dict[str, int] = {}
        # key -> the footprint of `parts[key]`, its record decoded, in the log's order: every entry of
        # `parts` has one once `decode_pending` ran after the last `apply`.
        self.footprints: dict[str, ECFootprint] = {}
        self._shared = False  # `footprints` was handed out as a checkpoint's windows (copy before a change)
        self._undecoded: list[Row] = []

    def _own(self) -> dict[str, ECFootprint]:
        """`footprints`, to change: copied first if a checkpoint holds it (copy on write: at a takeover,
        the last checkpoint, nothing changes it again and it is never copied; a copy of ~90k entries
        touches every footprint, ~0.15 s in a standby whose objects are spread over a long run's heap)."""
        if self._shared:
            self.footprints, self._shared = dict(self.footprints), False
        return self.footprints

    def apply(self, row: Row) -> None:
        super().apply(row)
        kind, key = row[1], row[3]
        if key is None:
            return
        if kind == "R":
            self.closed[key] = row[4]
            held = self.footprints.get(key)
            if held is not None and held.row[4] == row[4]:
                del self._own()[key]  # the window closed (as `parts`)
        elif kind in _FOOTPRINT_CODES:
            self._undecoded.append(row)

    def decode_pending(self, codec: RecordCodec) -> None:
        """Decode the footprints applied since the last call that are still their window's latest (checked
        by checksum when applied; one a newer footprint or an R replaced meanwhile is not decoded)."""
        rows, self._undecoded = self._undecoded, []
        parts = self.parts
        rows = [row for row in rows if parts.get(row[3]) is row]  # type: ignore[arg-type]  # keyed rows only
        if not rows:
            return
        footprints = self._own()
        with gc_paused():  # one footprint and one record per window, none freed: as the EC build
            for row, record in zip(rows, codec.decode_rows(rows, verified=True), strict=True):
                key = row[3]
                assert key is not None  # only keyed footprints are kept for decoding (apply)
                footprints.pop(key, None)  # the newest footprint goes last: the log's order
                footprints[key] = ECFootprint(row[0], key, row, codec, record)

    def windows(self, codec: RecordCodec) -> dict[str, ECFootprint]:
        """The footprints that were followed, decoded, oldest first: the mapping itself, copied only if
        following changes it later (`_own`)."""
        self.decode_pending(codec)
        if len(self.footprints) != len(self.parts):  # never, by the rules above; the parts decide if so
            return super().windows(codec)
        self._shared = True
        return self.footprints

    def oldest_offset(self, windows: dict[str, ECFootprint], end_offset: int) -> int:
        if windows is self.footprints:  # in the log's order: the oldest is the first
            return next(iter(windows.values())).offset if windows else end_offset
        return super().oldest_offset(windows, end_offset)


class LogFollower:
    """One output partition's log, followed forward from offset 0 (`catch_up` after each wait)."""

    def __init__(self, codec: RecordCodec | None = None) -> None:
        self.codec = codec or RecordCodec()
        self.forward: FollowedCheckpoint = FollowedCheckpoint()
        self.records_read = 0
        self.unusable: str | None = None  # why what was followed cannot be used (then: read the log back)

    @property
    def applied(self) -> int:
        """Every record below this offset is applied."""
        return self.forward.next_offset

    def catch_up(self, reader: PartitionReader) -> int:
        """Apply what the log holds beyond `applied` now; the records read (0 once it is unusable)."""
        if self.unusable is not None:
            return 0
        applied = apply_tail(reader, self.forward, self.codec)  # a trim past what was followed: a reason
        if isinstance(applied, str):
            self.unusable = applied
            return 0
        self.forward.decode_pending(self.codec)
        self.records_read += applied
        return applied


def checkpoint_from_followed(
    reader: PartitionReader, follower: LogFollower
) -> tuple[EventualCheckpoint, ForwardCheckpoint] | str:
    """The eventual checkpoint at the log's end from what `follower` followed and the rest of the log
    (read now: the caller holds the writer, so the end is final), with the forward checkpoint it came from;
    or why it cannot be used."""
    if follower.unusable is not None:
        return follower.unusable
    forward, codec = follower.forward, follower.codec
    end = reader.end_offset()
    if forward.next_offset > end:
        return f"the standby followed past the log's end (offset {forward.next_offset:,}, log end {end:,})"
    if forward.next_offset < reader.start_offset():
        return "the log was trimmed past what the standby had followed"
    if not matches_log(reader, forward.last):
        return "the standby's newest record is not the log's record at its offset"
    return checkpoint_after_tail(reader, forward, codec, end, "what the standby followed")
