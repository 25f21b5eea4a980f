"""Continuous eventual checkpointing: tuple model, window registry, checkpoint policies, CLI."""

from cec.policy import CheckpointPolicy, CheckpointSchedule, GOpenOnly, TargetPolicy
from cec.records import Kind, OutputRecord, RecordCodec
from cec.registry import OpenWindow, WindowRegistry

__version__ = "0.1.0"

__all__ = [
    "CheckpointPolicy",
    "CheckpointSchedule",
    "GOpenOnly",
    "Kind",
    "OpenWindow",
    "OutputRecord",
    "RecordCodec",
    "TargetPolicy",
    "WindowRegistry",
]
