"""Eventual-checkpoint reconstruction, EC-load, and replay planning."""

from recovery.contract import PositionStamper, ReplayContract, TupleFate, tuple_fate
from recovery.eventual import ECFootprint, EventualCheckpoint, EventualCheckpointBuilder
from recovery.exceptions import RecoveryError
from recovery.manager import Recovery, RecoveryManager, RecoveryReport

__all__ = [
    "ECFootprint",
    "EventualCheckpoint",
    "EventualCheckpointBuilder",
    "PositionStamper",
    "Recovery",
    "RecoveryError",
    "RecoveryManager",
    "RecoveryReport",
    "ReplayContract",
    "TupleFate",
    "tuple_fate",
]
