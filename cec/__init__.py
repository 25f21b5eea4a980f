"""Continuous eventual checkpointing: tuple model, window registry, checkpoint policies, CLI.

PySpark users: `from cec.spark import cec_aggregate, read_results, register` (imported on use).
"""

from cec.config import Checkpointing
from cec.exceptions import BadTupleError, CecError, ConfigError, RunStoppedError
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
    "BadTupleError",
    "CecError",
    "CheckpointPolicy",
    "CheckpointSchedule",
    "Checkpointing",
    "ConfigError",
    "CostBenefitPolicy",
    "GOpenOnly",
    "Kind",
    "MeasuredRates",
    "OpenWindow",
    "OutputRecord",
    "RecordCodec",
    "RecoveryTimePolicy",
    "RunStoppedError",
    "TargetPolicy",
    "WindowRegistry",
]
