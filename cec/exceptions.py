"""Errors raised by the CEC core."""

from __future__ import annotations

__all__ = ["BadTupleError", "CecError", "CodecError", "ConfigError", "RunStoppedError", "TimeFormatError"]


class CecError(Exception):
    """Base class of every error raised by `cec`."""


class CodecError(CecError):
    """Bytes that are not a valid CEC record: wrong magic, unknown version, bad checksum, malformed Avro."""


class ConfigError(CecError):
    """Invalid operator, policy or CLI configuration."""


class TimeFormatError(CecError, ValueError):
    """A value that is not an event time (`cec.timeparse`); also a ValueError, which its callers catch to
    dead-letter the tuple with the reason."""


class BadTupleError(CecError):
    """An input tuple the operator cannot process; it goes to the dead-letter destination with `reason`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RunStoppedError(CecError):
    """A bounded run stopped from outside (SIGTERM, Ctrl-C) before the end of its input: its results are
    not complete. The CLI exits with `exit_code` (128 + the signal's number, as a shell reports it)."""

    def __init__(self, message: str, *, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code
