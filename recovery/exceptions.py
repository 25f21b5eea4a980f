"""Errors raised by recovery."""

from __future__ import annotations

__all__ = ["RecoveryError"]


class RecoveryError(Exception):
    """The log cannot yield an eventual checkpoint (truncated or damaged beyond what fallback covers)."""
