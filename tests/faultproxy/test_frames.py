"""The fault proxy's framing, fuzzed: whatever pieces a stream arrives in, the frames (and, past anything
that is not Kafka framing, the raw bytes) come out the same and byte-exact; header parsing never raises."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from tests.faultproxy.frames import (
    MAX_FRAME,
    FrameReader,
    RequestHeader,
    request_frame,
    request_header,
    response_correlation,
    response_frame,
)

_frames = st.lists(st.binary(max_size=300).map(lambda b: struct.pack(">i", len(b)) + b), max_size=20)


def _pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, at = [], 0
    for point in [*points, len(data)]:
        out.append(data[at:point])
        at = point
    return out


def _feed_all(pieces: list[bytes]) -> tuple[list[bytes], FrameReader]:
    reader = FrameReader()
    out: list[bytes] = []
    for piece in pieces:
        out.extend(reader.feed(piece))
    return out, reader


@given(_frames, st.lists(st.integers(min_value=0), max_size=30))
def test_frames_come_out_whole_and_the_same_whatever_the_pieces(frames: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frames)
    whole, _ = _feed_all([stream])
    assert whole == frames
    split, reader = _feed_all(_pieces(stream, cuts))
    assert split == frames and reader.pending == 0 and not reader.raw


@given(st.binary(max_size=2000), st.lists(st.integers(min_value=0), max_size=30))
def test_any_bytes_pass_through_byte_exact_and_never_raise(data: bytes, cuts: list[int]) -> None:
    """Frames, then (at a size no Kafka peer sends) raw pieces, then the held rest: the stream again."""
    out, reader = _feed_all(_pieces(data, cuts))
    assert b"".join(out) + reader.rest() == data
    once, once_reader = _feed_all([data])
    assert b"".join(once) + once_reader.rest() == data
    assert once_reader.raw == reader.raw


def test_a_size_no_kafka_peer_sends_turns_the_stream_raw() -> None:
    for size in (-1, MAX_FRAME + 1):
        reader = FrameReader()
        good = struct.pack(">i", 2) + b"ok"
        out = reader.feed(good + struct.pack(">i", size) + b"xyz")
        assert out == [good, struct.pack(">i", size) + b"xyz"] and reader.raw
        assert reader.feed(b"more") == [b"more"]


@given(
    st.integers(-(2**15), 2**15 - 1),
    st.integers(-(2**15), 2**15 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.one_of(st.none(), st.text(max_size=40)),
    st.binary(max_size=50),
)
def test_request_headers_read_back(
    api: int, version: int, correlation: int, client: str | None, body: bytes
) -> None:
    frame = request_frame(api, version, correlation, client, body)
    assert request_header(frame) == RequestHeader(api, version, correlation, client)
    assert response_correlation(response_frame(correlation, body)) == correlation


@given(st.binary(max_size=64))
def test_header_parsing_never_raises(data: bytes) -> None:
    header = request_header(data)
    assert header is None or isinstance(header.api_key, int)
    assert response_correlation(data) is None or len(data) >= 8


def test_a_client_id_running_past_its_frame_is_no_header() -> None:
    frame = request_frame(0, 9, 7, "client", b"")
    assert request_header(frame[:-2]) is None
