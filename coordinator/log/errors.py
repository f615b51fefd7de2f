"""Errors of the record log."""

from __future__ import annotations


class LogError(Exception):
    """Base class of every error raised by the record log."""


class LogWriteError(LogError):
    """An append or fsync failed; the log was rolled back to the offset named here.

    `__cause__` holds the underlying `OSError`.
    """

    def __init__(self, message: str, *, rolled_back_to_offset: int | None) -> None:
        super().__init__(message)
        self.rolled_back_to_offset = rolled_back_to_offset


class LogWriterBrokenError(LogWriteError):
    """A rollback itself failed: the writer's on-disk state is unknown until a restart."""


class LogClosedError(LogError):
    """The log was closed; no more writes are accepted."""


class LogCorruptError(LogError):
    """Damage that must not be repaired automatically; the message names file and position."""

    def __init__(self, message: str, *, file: str, position: int | None) -> None:
        super().__init__(message)
        self.file = file
        self.position = position
