"""One process at a time per data directory.

Two coordinators appending to the same segments would interleave their batches and each
would acknowledge writes the other then overwrites. `serve` and `log compact` therefore
hold an exclusive `flock` on `<data dir>/.lock` while they run; the lock goes with the
process (a SIGKILL releases it too), so a stale file never blocks a restart. The file
holds the holder's pid, for the error message only.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from coordinator.log.errors import LogError

LOCK_FILE_NAME = ".lock"


class DataDirInUseError(LogError):
    """Another process holds the data directory's lock."""


class DataDirLock:
    def __init__(self, data_dir: Path, fd: int) -> None:
        self.data_dir = data_dir
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, data_dir: Path) -> DataDirLock:
        """Take the lock or raise `DataDirInUseError` naming the holder; never waits."""
        path = data_dir / LOCK_FILE_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DataDirInUseError(
                f"{data_dir} is in use by another process (pid {holder}): one coordinator "
                f"(or `log compact`) per data directory"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(data_dir, fd)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> DataDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
