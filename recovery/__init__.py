"""Eventual-checkpoint reconstruction, EC-load, and replay planning."""

from recovery.contract import PositionStamper, ReplayContract, TupleFate, tuple_fate
from recovery.eventual import ECFootprint, EventualCheckpoint, EventualCheckpointBuilder
from recovery.exceptions import RecoveryError
from recovery.manager import LoadedWindow, Recovery, RecoveryManager, RecoveryReport

__all__ = [
    "ECFootprint",
    "EventualCheckpoint",
    "EventualCheckpointBuilder",
    "LoadedWindow",
    "PositionStamper",
    "Recovery",
    "RecoveryError",
    "RecoveryManager",
    "RecoveryReport",
    "ReplayContract",
    "TupleFate",
    "tuple_fate",
]
