"""The EC cache's snapshot format (`queuestore.ec_cache`): what it encodes decodes to the same checkpoint,
and any bytes at all (random, or a snapshot cut, extended or with bytes flipped) decode or are rejected
with a one-line `SnapshotError`, never anything else; a torn or damaged snapshot is never taken for one."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queuestore.base import Row
from queuestore.ec_cache import ECCache, SnapshotError, decode_snapshot, encode_snapshot

IDENTITY = "agg/0"
I64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def checkpoints(draw: st.DrawFn) -> tuple[int, Row | None, dict[str, Row]]:
    keys = draw(st.lists(st.text(max_size=12), max_size=12, unique=True))
    offsets = draw(st.lists(st.integers(0, 2**40), min_size=len(keys), max_size=len(keys), unique=True))
    parts: dict[str, Row] = {
        key: (
            offset,
            draw(st.sampled_from(["GOPEN", "GCHECK"])),
            draw(I64),
            key,
            draw(I64),
            draw(st.binary(max_size=40)),
        )
        for key, offset in zip(keys, offsets, strict=True)
    }
    next_offset = max(offsets, default=-1) + 1 + draw(st.integers(0, 5))
    last: Row | None = None
    if next_offset > 0 and draw(st.booleans()):
        last = (
            next_offset - 1,
            draw(st.sampled_from(["R", "GCHECK", "EOS", "Q"])),
            draw(I64),
            draw(st.none() | st.text(max_size=8)),
            draw(I64),
            draw(st.binary(max_size=30)),
        )
    return next_offset, last, parts


def _decodes_or_rejects(data: bytes) -> None:
    try:
        parts, _last, next_offset = decode_snapshot(data, IDENTITY)
    except SnapshotError as exc:
        assert "\n" not in str(exc) and str(exc)
        return
    assert all(0 <= row[0] < next_offset and row[3] == key for key, row in parts.items())


@given(checkpoints())
@settings(max_examples=200, deadline=None)
def test_a_snapshot_decodes_to_what_was_encoded(checkpoint: tuple[int, Row | None, dict[str, Row]]) -> None:
    next_offset, last, parts = checkpoint
    assert decode_snapshot(encode_snapshot(IDENTITY, next_offset, last, parts), IDENTITY) == (
        parts,
        last,
        next_offset,
    )


@given(st.binary(max_size=400))
@settings(max_examples=400, deadline=None)
def test_any_bytes_decode_or_are_rejected_cleanly(data: bytes) -> None:
    _decodes_or_rejects(data)
    _decodes_or_rejects(b"CEC-EC2\n" + data)  # past the magic too


@given(checkpoints(), st.data())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_damaged_snapshot_is_rejected(
    checkpoint: tuple[int, Row | None, dict[str, Row]], data: st.DataObject
) -> None:
    """Flipped bytes, a cut or an extension: always rejected (the length and the CRC-32 over the body)."""
    next_offset, last, parts = checkpoint
    good = encode_snapshot(IDENTITY, next_offset, last, parts)
    how = data.draw(st.sampled_from(["flip", "cut", "extend"]))
    if how == "flip":
        at = data.draw(st.integers(0, len(good) - 1))
        bad = good[:at] + bytes([good[at] ^ data.draw(st.integers(1, 255))]) + good[at + 1 :]
    elif how == "cut":
        bad = good[: data.draw(st.integers(0, len(good) - 1))]
    else:
        bad = good + data.draw(st.binary(min_size=1, max_size=20))
    try:
        decode_snapshot(bad, IDENTITY)
    except SnapshotError:
        return
    raise AssertionError(f"a damaged snapshot ({how}) was taken for one")


@given(st.binary(max_size=300))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_cache_answers_any_file_with_a_checkpoint_or_a_reason(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "agg.0.ec.snapshot"
    path.write_bytes(data)
    loaded = ECCache(path, IDENTITY).load()
    assert isinstance(loaded, str | tuple)
    if isinstance(loaded, str):
        assert "\n" not in loaded


def test_a_snapshot_is_written_whole_by_rename_and_leftovers_are_removed(tmp_path: Path) -> None:
    path = tmp_path / "agg.0.ec.snapshot"
    leftover = tmp_path / "agg.0.ec.snapshot.tmp-123"
    leftover.write_bytes(b"half a snapshot")
    cache = ECCache(path, IDENTITY)
    assert not leftover.exists()
    assert cache.load() == "no EC cache"
    row: Row = (0, "GOPEN", 5, "k", 1, b"v")
    cache.adopt({}, None, 0, stored=False)
    cache.apply(row)
    cache.commit()  # from an empty log: nothing written before MIN_SNAPSHOT_RECORDS
    assert not path.exists()
    cache.adopt({"k": row}, row, 1, stored=False)
    cache.commit()  # adopted from a log read back: the first commit writes the snapshot whole
    assert decode_snapshot(path.read_bytes(), IDENTITY) == ({"k": row}, row, 1)
    cache.apply_run(1, "GCHECK", 6, ["k", "j"], [1, 2], [b"a", b"b"])
    cache.commit()  # 2 records since: not due yet
    assert decode_snapshot(path.read_bytes(), IDENTITY)[2] == 1
    cache.close()  # a clean close writes the last one
    parts, last, next_offset = decode_snapshot(path.read_bytes(), IDENTITY)
    assert next_offset == 3 and last == (2, "GCHECK", 6, "j", 2, b"b")
    assert parts == {"k": (1, "GCHECK", 6, "k", 1, b"a"), "j": (2, "GCHECK", 6, "j", 2, b"b")}
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
