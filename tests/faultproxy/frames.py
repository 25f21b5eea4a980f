"""Kafka's wire framing, as much of it as a fault proxy needs (https://kafka.apache.org/protocol).

Every message on a Kafka connection is a frame: a big-endian int32 size, then that many bytes. A request's
bytes start with its header: int16 API key, int16 API version, int32 correlation id and, in every header
version a client sends except v0 (ControlledShutdown v0 only), the client id as an int16-length string
(-1: null; still this non-compact form in the flexible header v2, whose tagged fields follow it). A
response starts with the correlation id of its request. Nothing past the headers is parsed.

`FrameReader` cuts a byte stream into frames incrementally: fed in any pieces, it returns the same frames,
byte for byte, as fed all at once. A size that no Kafka peer sends (negative, or above `MAX_FRAME`) ends
framing: the reader then hands the rest of the stream through as it comes (`raw`), so a proxy stays
transparent to anything it does not understand instead of failing the connection.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = [
    "API_KEYS",
    "API_NAMES",
    "FAULT_APIS",
    "MAX_FRAME",
    "FrameReader",
    "RequestHeader",
    "api_name",
    "request_frame",
    "request_header",
    "response_correlation",
    "response_frame",
]

# Above the broker's socket.request.max.bytes (100 MB) and librdkafka's receive.message.max.bytes limit.
MAX_FRAME = 1 << 30

API_NAMES: dict[int, str] = {
    0: "Produce",
    1: "Fetch",
    2: "ListOffsets",
    3: "Metadata",
    8: "OffsetCommit",
    9: "OffsetFetch",
    10: "FindCoordinator",
    11: "JoinGroup",
    12: "Heartbeat",
    13: "LeaveGroup",
    14: "SyncGroup",
    15: "DescribeGroups",
    16: "ListGroups",
    17: "SaslHandshake",
    18: "ApiVersions",
    19: "CreateTopics",
    20: "DeleteTopics",
    21: "DeleteRecords",
    22: "InitProducerId",
    23: "OffsetForLeaderEpoch",
    24: "AddPartitionsToTxn",
    25: "AddOffsetsToTxn",
    26: "EndTxn",
    28: "TxnOffsetCommit",
    32: "DescribeConfigs",
    33: "AlterConfigs",
    36: "SaslAuthenticate",
    37: "CreatePartitions",
    42: "DeleteGroups",
    60: "DescribeCluster",
    61: "DescribeProducers",
    65: "DescribeTransactions",
    66: "ListTransactions",
    68: "ConsumerGroupHeartbeat",
}
API_KEYS: dict[str, int] = {name: key for key, name in API_NAMES.items()}
# The requests the chaos acts on: a transactional writer's whole conversation and a reader's.
FAULT_APIS: frozenset[int] = frozenset(
    API_KEYS[name]
    for name in ("Produce", "Fetch", "ListOffsets", "InitProducerId", "AddPartitionsToTxn", "EndTxn")
)

_SIZE = struct.Struct(">i")
_HEAD = struct.Struct(">hhih")  # api key, api version, correlation id, client id length
_CORRELATION = struct.Struct(">i")


def api_name(key: int) -> str:
    return API_NAMES.get(key, f"api{key}")


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None

    @property
    def api(self) -> str:
        return api_name(self.api_key)


def request_header(frame: bytes) -> RequestHeader | None:
    """The header of a request frame (size prefix included); None when the frame is too short or its
    client id runs past the frame: not a Kafka request, passed through untouched."""
    if len(frame) < 4 + _HEAD.size:
        return None
    api_key, version, correlation, length = _HEAD.unpack_from(frame, 4)
    at = 4 + _HEAD.size
    if length < 0:
        return RequestHeader(api_key, version, correlation, None)
    if at + length > len(frame):
        return None
    client = bytes(frame[at : at + length]).decode("utf-8", errors="replace")
    return RequestHeader(api_key, version, correlation, client)


def response_correlation(frame: bytes) -> int | None:
    """The correlation id of a response frame (size prefix included); None when it has none."""
    if len(frame) < 4 + _CORRELATION.size:
        return None
    return int(_CORRELATION.unpack_from(frame, 4)[0])


def request_frame(
    api_key: int, api_version: int, correlation_id: int, client_id: str | None, body: bytes
) -> bytes:
    """A request frame with a v1 header (tests and fake brokers)."""
    client = b"" if client_id is None else client_id.encode()
    head = _HEAD.pack(api_key, api_version, correlation_id, -1 if client_id is None else len(client))
    payload = head + client + body
    return _SIZE.pack(len(payload)) + payload


def response_frame(correlation_id: int, body: bytes) -> bytes:
    payload = _CORRELATION.pack(correlation_id) + body
    return _SIZE.pack(len(payload)) + payload


class FrameReader:
    """Cuts a byte stream into whole frames (size prefix included), whatever pieces it arrives in."""

    __slots__ = ("_buffer", "raw")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.raw = False  # the stream stopped looking like Kafka frames: bytes go through as they come

    @property
    def pending(self) -> int:
        """Bytes held: the start of a frame not yet complete."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        """The frames `data` completes, in order. Once `raw`, each call returns what it was given (one
        piece, possibly with the bytes held before the stream went raw in front of it)."""
        if self.raw:
            return [bytes(data)] if data else []
        buffer = self._buffer
        buffer += data
        frames: list[bytes] = []
        at = 0
        end = len(buffer)
        while end - at >= 4:
            (size,) = _SIZE.unpack_from(buffer, at)
            if size < 0 or size > MAX_FRAME:
                self.raw = True
                break
            if end - at - 4 < size:
                break
            frames.append(bytes(buffer[at : at + 4 + size]))
            at += 4 + size
        if self.raw:
            frames.append(bytes(buffer[at:]))
            buffer.clear()
        else:
            del buffer[:at]
        return frames

    def rest(self) -> bytes:
        """The held bytes of an incomplete frame (at the end of a stream); empties the reader."""
        rest = bytes(self._buffer)
        self._buffer.clear()
        return rest
