"""A Kafka wire-protocol fault proxy for tests and the chaos benchmark (see `proxy`, `plan`, `frames`)."""

from tests.faultproxy.frames import API_KEYS, FAULT_APIS, FrameReader, RequestHeader
from tests.faultproxy.plan import Chaos, Fault, FaultPlan, Injection, Rule
from tests.faultproxy.proxy import Connection, FaultProxy

__all__ = [
    "API_KEYS",
    "FAULT_APIS",
    "Chaos",
    "Connection",
    "Fault",
    "FaultPlan",
    "FaultProxy",
    "FrameReader",
    "Injection",
    "RequestHeader",
    "Rule",
]
