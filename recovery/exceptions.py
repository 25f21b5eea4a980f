"""Errors raised by recovery."""

from __future__ import annotations

__all__ = ["InputMismatchError", "RecoveryError"]


class RecoveryError(Exception):
    """The log cannot yield an eventual checkpoint (truncated or damaged beyond what fallback covers)."""


class InputMismatchError(RecoveryError):
    """A log is being resumed against an input other than the one it was built from."""
