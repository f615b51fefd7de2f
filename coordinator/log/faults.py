"""A fault-injecting `FileLayer` for tests: real files underneath, scripted failures on top.

Faults are queued per operation and consumed in order. A fault either raises `OSError`
(the process lives on and may clean up) or, with `crash=True`, raises `SimulatedCrash` and
makes every later call raise it too, so the "dead" process cannot tidy up after itself.
"""

from __future__ import annotations

import errno
import os
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from coordinator.log.files import AppendableFile, FileLayer, OsFileLayer

Operation = Literal["write", "fsync", "truncate", "rename", "remove", "fsync_directory", "open"]


class SimulatedCrash(Exception):
    """The process "died" at this point; nothing after it reaches the disk."""


@dataclass(frozen=True)
class Fault:
    error: int = errno.EIO
    # For writes: append this many bytes of the data before failing (a torn write).
    keep_bytes: int = 0
    crash: bool = False


class FaultyFileLayer:
    def __init__(self, inner: FileLayer | None = None) -> None:
        self._inner: FileLayer = inner if inner is not None else OsFileLayer()
        self._faults: dict[str, deque[Fault | None]] = {}
        self.crashed = False
        self.calls: dict[str, int] = {}
        # Bytes of each file known to be on disk: its size at its last fsync.
        self.synced_sizes: dict[Path, int] = {}
        # Called (in the calling thread) before every file fsync; tests block it on an
        # event to hold a group commit in flight.
        self.before_fsync: Callable[[Path], None] | None = None

    # -- scripting -------------------------------------------------------------------------

    def fail_next(
        self,
        operation: Operation,
        fault: Fault | None = None,
        *,
        times: int = 1,
        after: int = 0,
    ) -> None:
        """Fail the next `times` calls of `operation`, after letting `after` calls pass."""
        queue = self._faults.setdefault(operation, deque())
        queue.extend([None] * after)
        queue.extend([fault or Fault()] * times)

    def fail_next_write(self, error: int = errno.ENOSPC) -> None:
        self.fail_next("write", Fault(error=error))

    def fail_next_fsync(self, error: int = errno.EIO) -> None:
        self.fail_next("fsync", Fault(error=error))

    def tear_next_write(self, keep_bytes: int, *, crash: bool = False) -> None:
        """Write only the first `keep_bytes` of the next write, then fail or crash."""
        self.fail_next("write", Fault(keep_bytes=keep_bytes, crash=crash))

    def crash_next(self, operation: Operation) -> None:
        self.fail_next(operation, Fault(crash=True))

    def pending_faults(self) -> int:
        return sum(fault is not None for queue in self._faults.values() for fault in queue)

    # -- plumbing --------------------------------------------------------------------------

    def _enter(self, operation: str) -> Fault | None:
        if self.crashed:
            raise SimulatedCrash(f"{operation} after the simulated crash")
        self.calls[operation] = self.calls.get(operation, 0) + 1
        queue = self._faults.get(operation)
        return queue.popleft() if queue else None

    def _raise(self, operation: str, fault: Fault, path: Path) -> None:
        if fault.crash:
            self.crashed = True
            raise SimulatedCrash(f"simulated crash during {operation} of {path}")
        raise OSError(fault.error, f"injected {os.strerror(fault.error)}", str(path))

    # -- FileLayer -------------------------------------------------------------------------

    def open(self, path: Path, *, create: bool = False) -> AppendableFile:
        fault = self._enter("open")
        if fault is not None:
            self._raise("open", fault, path)
        return _FaultyFile(self, self._inner.open(path, create=create))

    def read(self, path: Path) -> bytes:
        self._enter("read")
        return self._inner.read(path)

    @contextmanager
    def read_mapped(self, path: Path) -> Iterator[bytes]:
        yield self.read(path)

    def list_dir(self, directory: Path) -> list[str]:
        self._enter("list_dir")
        return self._inner.list_dir(directory)

    def make_dir(self, directory: Path) -> None:
        self._enter("make_dir")
        self._inner.make_dir(directory)

    def rename(self, source: Path, target: Path) -> None:
        fault = self._enter("rename")
        if fault is not None:
            self._raise("rename", fault, source)
        self._inner.rename(source, target)
        self.synced_sizes.pop(target, None)
        if source in self.synced_sizes:
            self.synced_sizes[target] = self.synced_sizes.pop(source)

    def remove(self, path: Path) -> None:
        fault = self._enter("remove")
        if fault is not None:
            self._raise("remove", fault, path)
        self._inner.remove(path)
        self.synced_sizes.pop(path, None)

    def fsync_directory(self, directory: Path) -> None:
        fault = self._enter("fsync_directory")
        if fault is not None:
            self._raise("fsync_directory", fault, directory)
        self._inner.fsync_directory(directory)


class _FaultyFile:
    def __init__(self, layer: FaultyFileLayer, inner: AppendableFile) -> None:
        self._layer = layer
        self._inner = inner

    @property
    def path(self) -> Path:
        return self._inner.path

    @property
    def size(self) -> int:
        return self._inner.size

    def write(self, data: bytes) -> None:
        fault = self._layer._enter("write")
        if fault is not None:
            if fault.keep_bytes:
                self._inner.write(data[: fault.keep_bytes])
            self._layer._raise("write", fault, self.path)
        self._inner.write(data)

    def fsync(self) -> None:
        if self._layer.before_fsync is not None:
            self._layer.before_fsync(self.path)
        fault = self._layer._enter("fsync")
        if fault is not None:
            self._layer._raise("fsync", fault, self.path)
        self._inner.fsync()
        self._layer.synced_sizes[self.path] = self._inner.size

    def truncate(self, size: int) -> None:
        fault = self._layer._enter("truncate")
        if fault is not None:
            self._layer._raise("truncate", fault, self.path)
        self._inner.truncate(size)
        synced = self._layer.synced_sizes.get(self.path)
        if synced is not None and synced > size:
            self._layer.synced_sizes[self.path] = size

    def close(self) -> None:
        # Closing always works, even after a crash, so tests do not leak descriptors.
        self._inner.close()
