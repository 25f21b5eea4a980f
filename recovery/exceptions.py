"""Errors raised by recovery, all under `cec.CecError` (the package's one root)."""

from __future__ import annotations

from cec.exceptions import CecError

__all__ = ["InputMismatchError", "RecoveryError", "ReplayDivergenceError"]


class RecoveryError(CecError):
    """The log cannot yield an eventual checkpoint (truncated or damaged beyond what fallback covers)."""


class InputMismatchError(RecoveryError):
    """A log is being resumed against an input other than the one it was built from."""


class ReplayDivergenceError(RecoveryError):
    """A tuple replayed below the crash point produced a record other than a dead letter: what it produced
    the first time is in the log, so the log and the replay disagree (a non-deterministic operator, or an
    input that differs from the one the log was built from). Nothing of it is written."""
