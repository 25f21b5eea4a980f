"""Continuous eventual checkpointing: tuple model, window registry, checkpoint policies, CLI."""

from cec.config import Checkpointing
from cec.policy import (
    CheckpointPolicy,
    CostBenefitPolicy,
    GOpenOnly,
    RecoveryTimePolicy,
    TargetPolicy,
)
from cec.rates import MeasuredRates
from cec.records import Kind, OutputRecord, RecordCodec
from cec.registry import OpenWindow, WindowRegistry
from cec.schedule import CheckpointSchedule

__version__ = "0.1.0"

__all__ = [
    "CheckpointPolicy",
    "CheckpointSchedule",
    "Checkpointing",
    "CostBenefitPolicy",
    "GOpenOnly",
    "Kind",
    "MeasuredRates",
    "OpenWindow",
    "OutputRecord",
    "RecordCodec",
    "RecoveryTimePolicy",
    "TargetPolicy",
    "WindowRegistry",
]
