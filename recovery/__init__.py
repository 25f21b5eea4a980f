"""Eventual-checkpoint reconstruction, EC-load, and replay planning."""

from recovery.eventual import ECFootprint, EventualCheckpoint, EventualCheckpointBuilder
from recovery.exceptions import RecoveryError
from recovery.manager import LoadedWindow, Recovery, RecoveryManager, RecoveryReport
from recovery.replay import ReplayPlan

__all__ = [
    "ECFootprint",
    "EventualCheckpoint",
    "EventualCheckpointBuilder",
    "LoadedWindow",
    "Recovery",
    "RecoveryError",
    "RecoveryManager",
    "RecoveryReport",
    "ReplayPlan",
]
