"""The figures of one operator instance's run (`RunStats`): what the local loop reports and `cec run`
prints; the instance counts its tuples and records, the host adds its own (trimming, extent samples, the
checkpoint controller's report)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recovery.manager import RecoveryReport

__all__ = ["RunStats"]


@dataclass
class RunStats:
    inputs: int = 0  # tuples read in this run, replayed ones included
    outputs: int = 0
    results: int = 0
    gopens: int = 0
    gchecks: int = 0
    dead_letters: int = 0
    open_windows: int = 0
    seconds: float = 0.0
    completed: bool = False
    resumed: bool = False
    recovery: RecoveryReport | None = None
    max_extent: int = 0  # largest extent size q seen after any batch
    extent_samples: list[tuple[int, int]] = field(default_factory=list)  # (inputs, extent) every 1 s
    max_replay: int = 0  # largest replay size u seen after any batch
    trimmed_offsets: int = 0  # offsets trimmed from the head of the output log in this run
    retained_samples: list[tuple[int, int]] = field(default_factory=list)  # (inputs, retained) per trim
    # (inputs, records retained after it, records recovery needed) at every due point of trimming
    trims: list[tuple[int, int, int]] = field(default_factory=list)
    trim_waits: int = 0  # due points at which the operator waited for a paced consumer (back-pressure)
    trim_bound: int | None = (
        None  # the trim bound when the run stopped, everything durable (None: no trimming)
    )
    checkpoint_policy: str = ""
    checkpoint_budget: float = 0.0  # the duty allowed at the end (CI/CP, or what the policy picked)
    checkpoint_seconds: float = 0.0  # operator time spent producing G-checks
    checkpoint_duty: float = 0.0  # checkpoint_seconds / run time since G-checks were allowed (after recovery)
    checkpoint_duty_wanted: float = 0.0  # checkpoint_seconds / run time in which the policy wanted G-checks
    checkpoint_refusal: str | None = None  # why the targets could not be met, if they could not
    q_target: int | None = None  # targets in force at the end (picked by the policy with a recovery target)
    u_target: int | None = None
    rates: dict[str, Any] | None = None  # what the policy planned with (cec.rates.MeasuredRates)
    checkpoint_note: str | None = None  # what the policy said once about its plan (e.g. a budget above 50%)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["recovery"] = self.recovery.as_dict() if self.recovery else None
        return d
