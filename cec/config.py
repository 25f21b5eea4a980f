"""`Checkpointing`: the one typed configuration of checkpoint intensity (paper III.A and IV).

    Checkpointing(q_target=None, u_target=None, ci_ms=5.0, cp_ms=100.0, recovery_target=None,
                  policy="targets" | "cost-benefit", mtbf="1h")

- `q_target` / `u_target` (Q, U): G-check the oldest window while the extent size q > Q or the replay size
  u > U. Q below the number of open windows N cannot be met (an extent holds a footprint of every open
  window), which the operator says once when it happens;
- `ci_ms` / `cp_ms` (CI, CP): the checkpoint budget, CI ms of operator time in every CP ms, spent whenever
  the policy wants G-checks (`cec.schedule`). CI = CP removes the limit;
- `recovery_target` (a duration: "3s", "500ms", "2 minutes", or seconds as a number): the operator picks
  U, Q and the budget itself from its measured rates so that a crash at any moment recovers within it
  (`cec.policy.RecoveryTimePolicy`). Q and U given beside it are upper bounds on what it picks; CI/CP is
  only the starting budget, before anything is measured;
- `policy="cost-benefit"`: G-check the oldest window only when the recovery time it saves, weighted by
  the failure rate 1/`mtbf`, is worth its cost (`cec.policy.CostBenefitPolicy`); Q, U and the recovery
  target, when given, still bound it.

Frozen and validated on construction; `to_json`/`from_json` round-trip it (durations as seconds).

The default, where a host is given no checkpointing at all (`cec run` without --Q/--U/--recovery-target,
`cec_aggregate(checkpointing=None)`), is `Checkpointing.default()`: U = `DEFAULT_U_TARGET` (100,000 input
tuples, the paper's U, which `cec demo` uses too) within the default budget (CI/CP = 5 ms in 100 ms), so
that a restart replays a bounded amount even when keys stay open for the whole run; without it a window
opened at the first offset and never closed makes every restart replay from there. A tuple count rather
than a recovery time: it needs no measured rates, holds on every host alike, and a time target on Spark
would count the query's own start (measured 4-9 s here), which alone can miss a few seconds' target.
`Checkpointing.gopen_only()` (the same as `Checkpointing()`) turns G-checks off: the paper's minimum
overhead, the longest recovery.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from cec.exceptions import ConfigError
from cec.spec_form import check_known, check_positive, json_object
from cec.timeparse import parse_duration_s

__all__ = ["DEFAULT_U_TARGET", "POLICIES", "Checkpointing", "parse_duration_s"]

PolicyName = Literal["targets", "cost-benefit"]
POLICIES: tuple[str, ...] = ("targets", "cost-benefit")
# The replay bound a host applies when it is given no checkpointing (module doc).
DEFAULT_U_TARGET = 100_000


def _target(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive number of tuples, got {value!r}")
    return value


def _millis(value: Any, name: str) -> float:
    return check_positive(value, name, "milliseconds")


@dataclass(frozen=True)
class Checkpointing:
    q_target: int | None = None
    u_target: int | None = None
    ci_ms: float = 5.0
    cp_ms: float = 100.0
    recovery_target: float | None = None  # seconds; constructed from a duration ("3s") or a number
    policy: PolicyName = "targets"
    mtbf: float = 3600.0  # seconds between failures the cost-benefit policy plans for

    def __init__(
        self,
        q_target: int | None = None,
        u_target: int | None = None,
        ci_ms: float = 5.0,
        cp_ms: float = 100.0,
        recovery_target: str | float | None = None,
        policy: str = "targets",
        mtbf: str | float = 3600.0,
    ) -> None:
        set_ = object.__setattr__  # frozen: the normalised values are set once, here
        set_(self, "q_target", _target(q_target, "Q (q_target)"))
        set_(self, "u_target", _target(u_target, "U (u_target)"))
        ci, cp = _millis(ci_ms, "CI (ci_ms)"), _millis(cp_ms, "CP (cp_ms)")
        if ci > cp:
            raise ConfigError(f"need CI <= CP, got CI={ci:g} ms, CP={cp:g} ms")
        set_(self, "ci_ms", ci)
        set_(self, "cp_ms", cp)
        set_(
            self,
            "recovery_target",
            None if recovery_target is None else parse_duration_s(recovery_target, "recovery_target"),
        )
        if policy not in POLICIES:
            raise ConfigError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        set_(self, "policy", policy)
        set_(self, "mtbf", parse_duration_s(mtbf, "mtbf"))

    @classmethod
    def default(cls) -> Checkpointing:
        """What a host runs with when given no checkpointing: U = DEFAULT_U_TARGET (module doc)."""
        return cls(u_target=DEFAULT_U_TARGET)

    @classmethod
    def gopen_only(cls) -> Checkpointing:
        """No G-checks: the paper's minimum overhead; a restart replays from the oldest open window."""
        return cls()

    @property
    def duty(self) -> float:
        """CI/CP: the share of operator time the checkpoint budget allows."""
        return self.ci_ms / self.cp_ms

    @property
    def checkpoints(self) -> bool:
        """False when nothing asks for G-checks (G-open only, the least overhead)."""
        return (
            self.q_target is not None
            or self.u_target is not None
            or self.recovery_target is not None
            or self.policy == "cost-benefit"
        )

    def describe(self) -> str:
        parts = [f"Q={self.q_target} U={self.u_target} CI={self.ci_ms:g} ms CP={self.cp_ms:g} ms"]
        if self.recovery_target is not None:
            parts.append(f"recovery target {self.recovery_target:g} s")
        parts.append(f"policy {self.policy}")
        if self.policy == "cost-benefit":
            parts.append(f"MTBF {self.mtbf:g} s")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Checkpointing:
        check_known(data, (f.name for f in fields(cls)), "checkpointing")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Checkpointing:
        return cls.from_dict(json_object(text, "checkpointing"))
