"""The file operations the log needs, behind a small Protocol.

`OsFileLayer` does real I/O. Durability rules the callers follow: fsync a file before
relying on its bytes, and fsync the directory after creating, renaming or removing a file
(the directory entry is what makes the file findable after a crash).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Protocol, cast


class AppendableFile(Protocol):
    """An open file that only grows at its end (or is truncated back)."""

    @property
    def path(self) -> Path: ...

    @property
    def size(self) -> int: ...

    def write(self, data: bytes) -> None:
        """Append all of `data` or raise `OSError` (some prefix may have landed)."""

    def fsync(self) -> None: ...

    def truncate(self, size: int) -> None: ...

    def close(self) -> None: ...


class FileLayer(Protocol):
    def open(self, path: Path, *, create: bool = False) -> AppendableFile:
        """Open `path` for appending; with `create`, make it if missing."""

    def read(self, path: Path) -> bytes: ...

    def read_mapped(self, path: Path) -> AbstractContextManager[bytes]:
        """The file's bytes for the length of a `with`, read-only; they may be a memory
        map, which reads like bytes (slicing, `find`, `len`, the buffer protocol)."""

    def list_dir(self, directory: Path) -> list[str]:
        """File names in `directory`; an empty list when it does not exist."""

    def make_dir(self, directory: Path) -> None: ...

    def rename(self, source: Path, target: Path) -> None:
        """Atomically replace `target` with `source`."""

    def remove(self, path: Path) -> None: ...

    def fsync_directory(self, directory: Path) -> None: ...


class OsAppendableFile:
    def __init__(self, path: Path, fd: int) -> None:
        self._path = path
        self._fd = fd
        self._size = os.fstat(fd).st_size

    @property
    def path(self) -> Path:
        return self._path

    @property
    def size(self) -> int:
        return self._size

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            # os.write may write less than asked; keep going until all is written.
            written = os.write(self._fd, view)
            self._size += written
            view = view[written:]

    def fsync(self) -> None:
        os.fsync(self._fd)

    def truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)
        self._size = size

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class OsFileLayer:
    """Real files through os calls."""

    def open(self, path: Path, *, create: bool = False) -> OsAppendableFile:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        return OsAppendableFile(path, os.open(path, flags, 0o644))

    def read(self, path: Path) -> bytes:
        with open(path, "rb") as file:
            return file.read()

    @contextmanager
    def read_mapped(self, path: Path) -> Iterator[bytes]:
        # Start-up reads every segment once: mapping the page cache saves copying it into
        # a fresh buffer, and the page faults that copy costs (about 5% of a load).
        with open(path, "rb") as file:
            try:
                mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError:  # an empty file cannot be mapped
                yield b""
                return
        try:
            yield cast(bytes, mapping)
        finally:
            try:
                mapping.close()
            except BufferError:
                pass  # a view is still held (an error on its way up): unmapped when freed

    def list_dir(self, directory: Path) -> list[str]:
        try:
            return sorted(os.listdir(directory))
        except FileNotFoundError:
            return []

    def make_dir(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)

    def rename(self, source: Path, target: Path) -> None:
        os.replace(source, target)

    def remove(self, path: Path) -> None:
        os.remove(path)

    def fsync_directory(self, directory: Path) -> None:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
