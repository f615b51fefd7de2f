"""Kafka Connect's worker metadata and assignment byte layouts: the one codec of them.

These are the bytes a Connect worker puts in its JoinGroup protocol metadata (and a
new-protocol worker in its client assignor metadata), and the bytes the assignor hands
back per member in SyncGroup. The fake workers, the classic group engine and the bridge
of classic members all read and write them here. The layouts follow Kafka's classic
(non-flexible) protocol types: every integer is big-endian; a string is an int16 length
and UTF-8 bytes; an array is an int32 count (-1 for null where the field is nullable);
nullable bytes are an int32 length (-1 for null) and the bytes.

Every blob starts with an int16 protocol version:

* version 0, Connect's eager protocol (``ConnectProtocol``)::

    metadata   = version:int16 url:string config_offset:int64
    assignment = version:int16 error:int16 leader:string leader_url:string
                 config_offset:int64 assignment:[connector_assignment]

* versions 1 (compatible) and 2 (sessioned), the incremental cooperative protocol
  (``IncrementalCooperativeConnectProtocol``): the same layout for both, only the version
  number differs::

    metadata   = version:int16 url:string config_offset:int64
                 allocation:nullable_bytes      (the worker's current assignment, itself a
                                                 complete v1/v2 assignment blob; null when empty)
    assignment = version:int16 error:int16 leader:string leader_url:string
                 config_offset:int64 assignment:nullable[connector_assignment]
                 revoked:nullable[connector_assignment] scheduled_delay_ms:int32

  where ``connector_assignment = connector:string tasks:[int32]`` and task id -1 stands for
  the connector instance itself.

Connect reads versions 1+ tolerantly: trailing fields that are missing take their defaults
(null arrays, delay 0) and bytes after the known fields are ignored, so a newer worker's
blob still parses. This module does the same. Units are written grouped by connector, in
sorted connector order, the connector instance (-1) first and then its tasks ascending, so
the encoding of a set of units is deterministic.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from coordinator.units import CONNECTOR, Unit

EAGER_VERSION = 0
COMPATIBLE_VERSION = 1
SESSIONED_VERSION = 2

# Connect's classic protocol names (JoinGroup protocols, in a worker's order of
# preference) -> the metadata and assignment version each carries.
PROTOCOL_VERSIONS: dict[str, int] = {
    "sessioned": SESSIONED_VERSION,
    "compatible": COMPATIBLE_VERSION,
    "default": EAGER_VERSION,
}
PROTOCOL_NAMES: dict[int, str] = {version: name for name, version in PROTOCOL_VERSIONS.items()}

NO_ERROR = 0
CONFIG_MISMATCH = 1  # Connect's assignment error: config offsets the leader could not resolve

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
EMPTY_UNITS: frozenset[Unit] = frozenset()


class ConnectProtocolError(ValueError):
    """Bytes that are not a valid Connect metadata or assignment blob."""


@dataclass(frozen=True, slots=True)
class ConnectAssignment:
    """One worker's assignment as Connect encodes it (revoked and delay exist from v1)."""

    version: int
    error: int = NO_ERROR
    leader: str = ""
    leader_url: str = ""
    config_offset: int = 0
    assigned: frozenset[Unit] = EMPTY_UNITS
    revoked: frozenset[Unit] = EMPTY_UNITS
    delay_ms: int = 0


@dataclass(frozen=True, slots=True)
class WorkerMetadata:
    """A worker's metadata: its url and config offset, plus (v1+) its current allocation."""

    version: int
    url: str
    config_offset: int = 0
    allocation: ConnectAssignment | None = None


# ------------------------------------------------------------------------------ writing


class _Writer:
    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def int16(self, value: int) -> None:
        self._parts.append(_pack(_INT16, value, "int16"))

    def int32(self, value: int) -> None:
        self._parts.append(_pack(_INT32, value, "int32"))

    def int64(self, value: int) -> None:
        self._parts.append(_pack(_INT64, value, "int64"))

    def string(self, value: str) -> None:
        data = value.encode("utf-8")
        if len(data) > 0x7FFF:
            raise ConnectProtocolError(f"string of {len(data)} bytes exceeds the int16 length")
        self.int16(len(data))
        self._parts.append(data)

    def nullable_bytes(self, value: bytes | None) -> None:
        if value is None:
            self.int32(-1)
            return
        self.int32(len(value))
        self._parts.append(value)

    def units(self, units: Iterable[Unit]) -> None:
        grouped = _by_connector(units)
        self.int32(len(grouped))
        for connector, tasks in grouped:
            self.string(connector)
            self.int32(len(tasks))
            for task in tasks:
                self.int32(task)

    def getvalue(self) -> bytes:
        return b"".join(self._parts)


def _pack(layout: struct.Struct, value: int, kind: str) -> bytes:
    try:
        return layout.pack(value)
    except struct.error:
        raise ConnectProtocolError(f"{value} does not fit in an {kind}") from None


def _by_connector(units: Iterable[Unit]) -> list[tuple[str, list[int]]]:
    tasks_of: dict[str, list[int]] = {}
    for connector, task in units:
        if task < CONNECTOR:
            raise ConnectProtocolError(f"task id {task} of {connector} is below -1")
        tasks_of.setdefault(connector, []).append(task)
    # -1 (the connector instance) sorts before its tasks, as Connect lists it first.
    return [(connector, sorted(tasks_of[connector])) for connector in sorted(tasks_of)]


def _check_version(version: int) -> None:
    if not 0 <= version <= 0x7FFF:
        raise ConnectProtocolError(f"Connect protocol version must be 0..32767, got {version}")


def encode_worker_metadata(metadata: WorkerMetadata) -> bytes:
    _check_version(metadata.version)
    writer = _Writer()
    writer.int16(metadata.version)
    writer.string(metadata.url)
    writer.int64(metadata.config_offset)
    if metadata.version >= COMPATIBLE_VERSION:
        allocation = metadata.allocation
        # Connect sends an empty current assignment as null rather than as an empty blob.
        if allocation is None or (not allocation.assigned and not allocation.revoked):
            writer.nullable_bytes(None)
        else:
            writer.nullable_bytes(encode_assignment(allocation))
    elif metadata.allocation is not None:
        raise ConnectProtocolError("version 0 worker metadata has no allocation field")
    return writer.getvalue()


def encode_assignment(assignment: ConnectAssignment) -> bytes:
    version = assignment.version
    _check_version(version)
    writer = _Writer()
    writer.int16(version)
    writer.int16(assignment.error)
    writer.string(assignment.leader)
    writer.string(assignment.leader_url)
    writer.int64(assignment.config_offset)
    writer.units(assignment.assigned)
    if version >= COMPATIBLE_VERSION:
        writer.units(assignment.revoked)
        writer.int32(assignment.delay_ms)
    elif assignment.revoked or assignment.delay_ms:
        raise ConnectProtocolError("version 0 assignments carry no revocations and no delay")
    return writer.getvalue()


# ------------------------------------------------------------------------------ reading


class _Reader:
    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)
        self._offset = 0

    @property
    def at_end(self) -> bool:
        return self._offset >= len(self._data)

    def _take(self, size: int, what: str) -> memoryview:
        end = self._offset + size
        if end > len(self._data):
            raise ConnectProtocolError(
                f"truncated {what}: need {size} bytes at offset {self._offset}, "
                f"have {len(self._data) - self._offset}"
            )
        chunk = self._data[self._offset : end]
        self._offset = end
        return chunk

    def int16(self, what: str) -> int:
        value: int = _INT16.unpack(self._take(2, what))[0]
        return value

    def int32(self, what: str) -> int:
        value: int = _INT32.unpack(self._take(4, what))[0]
        return value

    def int64(self, what: str) -> int:
        value: int = _INT64.unpack(self._take(8, what))[0]
        return value

    def string(self, what: str) -> str:
        size = self.int16(f"{what} length")
        if size < 0:
            raise ConnectProtocolError(f"{what} has negative length {size} (strings are not null)")
        try:
            return str(self._take(size, what), "utf-8")
        except UnicodeDecodeError:
            raise ConnectProtocolError(f"{what} is not valid UTF-8") from None

    def nullable_bytes(self, what: str) -> bytes | None:
        size = self.int32(f"{what} length")
        if size == -1:
            return None
        if size < 0:
            raise ConnectProtocolError(f"{what} has negative length {size}")
        return bytes(self._take(size, what))

    def units(self, what: str, nullable: bool) -> frozenset[Unit]:
        count = self.int32(f"{what} count")
        if count == -1 and nullable:
            return EMPTY_UNITS
        if count < 0:
            raise ConnectProtocolError(f"{what} has negative count {count}")
        units: set[Unit] = set()
        for _ in range(count):
            connector = self.string(f"{what} connector")
            task_count = self.int32(f"{what} task count of {connector}")
            if task_count < 0:
                raise ConnectProtocolError(f"{what}: negative task count for {connector}")
            for _ in range(task_count):
                task = self.int32(f"{what} task of {connector}")
                if task < CONNECTOR:
                    raise ConnectProtocolError(f"{what}: task id {task} of {connector} is below -1")
                units.add((connector, task))
        return frozenset(units)


def _read_version(reader: _Reader, what: str) -> int:
    version = reader.int16(f"{what} version")
    if version < 0:
        raise ConnectProtocolError(f"unsupported {what} version {version}")
    return version


def decode_worker_metadata(data: bytes) -> WorkerMetadata:
    reader = _Reader(data)
    version = _read_version(reader, "worker metadata")
    url = reader.string("url")
    config_offset = reader.int64("config offset")
    allocation = None
    if version >= COMPATIBLE_VERSION and not reader.at_end:
        blob = reader.nullable_bytes("allocation")
        allocation = None if blob is None else decode_assignment(blob)
    return WorkerMetadata(version, url, config_offset, allocation)


def assignment_leader(data: bytes) -> str:
    """The leader an assignment names, read from its header alone (its units are not
    decoded); ConnectProtocolError if the header is malformed."""
    reader = _Reader(data)
    _read_version(reader, "assignment")
    reader.int16("error")
    return reader.string("leader")


def decode_assignment(data: bytes) -> ConnectAssignment:
    reader = _Reader(data)
    version = _read_version(reader, "assignment")
    error = reader.int16("error")
    leader = reader.string("leader")
    leader_url = reader.string("leader url")
    config_offset = reader.int64("config offset")
    if version == EAGER_VERSION:
        assigned = reader.units("assignment", nullable=False)
        return ConnectAssignment(version, error, leader, leader_url, config_offset, assigned)
    # From v1 on, missing trailing fields take their defaults (Connect's tolerant schema).
    assigned = EMPTY_UNITS if reader.at_end else reader.units("assignment", nullable=True)
    revoked = EMPTY_UNITS if reader.at_end else reader.units("revoked", nullable=True)
    delay_ms = 0 if reader.at_end else reader.int32("scheduled delay")
    return ConnectAssignment(version, error, leader, leader_url, config_offset, assigned,
                             revoked, delay_ms)
