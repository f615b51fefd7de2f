"""Record codec for the coordinator's log.

A record is a key and a value, both byte strings, in the layout Kafka's group coordinator
uses for ``__consumer_offsets``:

- key:   int16 record type id (the ``apiKey`` of the ``...Key``/``...Value`` pair, 3..9
         and 20 for connect groups, 10..12 for classic groups and bridged members, 13 for
         the type set for a group, whichever its type),
         then the key struct, non-flexible (legacy strings);
- value: int16 value version (always 0 here), then the value struct, flexible;
         ``None`` is a tombstone that deletes what the key names.
"""

from __future__ import annotations

import dataclasses
import re
import struct
from collections.abc import Callable
from typing import Any, NamedTuple, TypeAlias, TypeVar

from kio.serial import entity_reader

from protocol._codec import INT16, EntityDecodeError, entity_bytes, read_entity, uvarint
from protocol.fastpath import (
    NO_TAGGED_FIELDS,
    compact_bytes,
    connectors_and_tasks_bytes,
    name_and_int32_bytes,
)
from protocol.messages import (
    ClassicBridgeMemberKey,
    ClassicBridgeMemberValue,
    ClassicGroupMemberKey,
    ClassicGroupMemberValue,
    ClassicGroupMetadataKey,
    ClassicGroupMetadataValue,
    ConnectGroupConfigurationKey,
    ConnectGroupConfigurationValue,
    ConnectGroupConnectorsKey,
    ConnectGroupConnectorsValue,
    ConnectGroupCurrentMemberAssignmentKey,
    ConnectGroupCurrentMemberAssignmentValue,
    ConnectGroupDeadlinesKey,
    ConnectGroupDeadlinesValue,
    ConnectGroupMemberMetadataKey,
    ConnectGroupMemberMetadataValue,
    ConnectGroupMetadataKey,
    ConnectGroupMetadataValue,
    ConnectGroupTargetAssignmentMemberKey,
    ConnectGroupTargetAssignmentMemberValue,
    ConnectGroupTargetAssignmentMetadataKey,
    ConnectGroupTargetAssignmentMetadataValue,
    ConnectorTaskId,
    GroupTypeKey,
    GroupTypeValue,
)

RecordKey: TypeAlias = (
    ConnectGroupMetadataKey
    | ConnectGroupMemberMetadataKey
    | ConnectGroupConnectorsKey
    | ConnectGroupTargetAssignmentMetadataKey
    | ConnectGroupTargetAssignmentMemberKey
    | ConnectGroupCurrentMemberAssignmentKey
    | ConnectGroupConfigurationKey
    | ConnectGroupDeadlinesKey
    | ClassicGroupMetadataKey
    | ClassicGroupMemberKey
    | ClassicBridgeMemberKey
    | GroupTypeKey
)
RecordValue: TypeAlias = (
    ConnectGroupMetadataValue
    | ConnectGroupMemberMetadataValue
    | ConnectGroupConnectorsValue
    | ConnectGroupTargetAssignmentMetadataValue
    | ConnectGroupTargetAssignmentMemberValue
    | ConnectGroupCurrentMemberAssignmentValue
    | ConnectGroupConfigurationValue
    | ConnectGroupDeadlinesValue
    | ClassicGroupMetadataValue
    | ClassicGroupMemberValue
    | ClassicBridgeMemberValue
    | GroupTypeValue
)

_Entity = TypeVar("_Entity", RecordKey, RecordValue)

_PAIRS: tuple[tuple[type[RecordKey], type[RecordValue]], ...] = (
    (ConnectGroupMetadataKey, ConnectGroupMetadataValue),
    (ConnectGroupMemberMetadataKey, ConnectGroupMemberMetadataValue),
    (ConnectGroupConnectorsKey, ConnectGroupConnectorsValue),
    (ConnectGroupTargetAssignmentMetadataKey, ConnectGroupTargetAssignmentMetadataValue),
    (ConnectGroupTargetAssignmentMemberKey, ConnectGroupTargetAssignmentMemberValue),
    (ConnectGroupCurrentMemberAssignmentKey, ConnectGroupCurrentMemberAssignmentValue),
    (ConnectGroupConfigurationKey, ConnectGroupConfigurationValue),
    (ConnectGroupDeadlinesKey, ConnectGroupDeadlinesValue),
    (ClassicGroupMetadataKey, ClassicGroupMetadataValue),
    (ClassicGroupMemberKey, ClassicGroupMemberValue),
    (ClassicBridgeMemberKey, ClassicBridgeMemberValue),
    (GroupTypeKey, GroupTypeValue),
)

RECORD_TYPES: dict[int, tuple[type[RecordKey], type[RecordValue]]] = {
    int(key_type.__api_key__): (key_type, value_type) for key_type, value_type in _PAIRS
}
"""Record type id -> (key class, value class)."""

VALUE_VERSION = 0

_RECORD_TYPE_IDS: dict[type, int] = {}
for _type_id, (_key_type, _value_type) in RECORD_TYPES.items():
    _RECORD_TYPE_IDS[_key_type] = _type_id
    _RECORD_TYPE_IDS[_value_type] = _type_id
    # A pair shares the apiKey in its JSON; a mismatch would mix record types up.
    assert int(_value_type.__api_key__) == _type_id, _value_type


class RecordDecodeError(ValueError):
    """Record bytes that do not decode: unknown type id or version, or malformed bytes."""


class DecodedRecord(NamedTuple):
    key: RecordKey
    value: RecordValue | None
    """None for a tombstone."""


def record_type_id(record: RecordKey | RecordValue | type[RecordKey] | type[RecordValue]) -> int:
    """The record type id of a key or value (or of its class)."""
    cls = record if isinstance(record, type) else type(record)
    try:
        return _RECORD_TYPE_IDS[cls]
    except KeyError:
        raise TypeError(f"{cls.__name__} is not a record key or value class") from None


def encode_key(key: RecordKey) -> bytes:
    type_id = record_type_id(key)
    key_type = RECORD_TYPES[type_id][0]
    if type(key) is not key_type:
        raise TypeError(f"{type(key).__name__} is a value, not a key")
    return INT16.pack(type_id) + entity_bytes(key_type, key)


def encode_value(value: RecordValue | None) -> bytes | None:
    """Encode a value; ``None`` (a tombstone) stays ``None``."""
    if value is None:
        return None
    writer = _DIRECT_WRITERS.get(type(value))
    if writer is not None:
        return writer(value)
    type_id = record_type_id(value)
    value_type = RECORD_TYPES[type_id][1]
    if type(value) is not value_type:
        raise TypeError(f"{type(value).__name__} is a key, not a value")
    return INT16.pack(VALUE_VERSION) + entity_bytes(value_type, value)


# The connectors record lists every connector of the group and is written again whenever
# one is added, removed or resized: kio's generic writer takes about 2 ms on the event loop
# for 1,000 connectors (while the group's assignor run is in flight). Written directly, with
# each connector's bytes remembered, it takes a small fraction of that. The layout is the
# schema's (flexible version 0), and a property test holds it to kio's bytes.
_VALUE_VERSION_BYTES = INT16.pack(VALUE_VERSION)


def _encode_connectors_value(value: ConnectGroupConnectorsValue) -> bytes:
    return connectors_value_bytes(connector_entries_bytes(value))


def connector_entries_bytes(value: ConnectGroupConnectorsValue) -> list[bytes]:
    """Each connector entry's bytes, in the value's order."""
    connector_bytes = name_and_int32_bytes
    return [connector_bytes(connector.name, connector.tasks) for connector in value.connectors]


def connectors_value_bytes(entries: list[bytes]) -> bytes:
    """A connectors value from its entries' bytes (`connector_entries_bytes`): a resize
    changes one entry and joins the rest as they were."""
    return b"".join([
        _VALUE_VERSION_BYTES,
        uvarint(len(entries) + 1),  # compact array: length + 1
        *entries,
        NO_TAGGED_FIELDS,
    ])


# A member's assignment records are written for every member after each new target epoch
# (its current assignment) and for each member whose part changed (its target): written
# directly too, their units by protocol/fastpath.py.
_CURRENT_ASSIGNMENT_HEAD = struct.Struct(">hiib")  # value version, epochs, state
_ERROR_AND_VERSION = struct.Struct(">bh")


def _encode_current_assignment_value(value: ConnectGroupCurrentMemberAssignmentValue) -> bytes:
    return b"".join([
        _CURRENT_ASSIGNMENT_HEAD.pack(VALUE_VERSION, value.member_epoch,
                                      value.previous_member_epoch, value.state),
        connectors_and_tasks_bytes(value.assigned),
        connectors_and_tasks_bytes(value.pending_revocation),
        _ERROR_AND_VERSION.pack(value.error, value.version),
        compact_bytes(value.metadata),
        NO_TAGGED_FIELDS,
    ])


def _encode_target_member_value(value: ConnectGroupTargetAssignmentMemberValue) -> bytes:
    return b"".join([
        _VALUE_VERSION_BYTES,
        connectors_and_tasks_bytes(value.assigned),
        INT16.pack(value.version),
        compact_bytes(value.metadata),
        NO_TAGGED_FIELDS,
    ])


_DIRECT_WRITERS: dict[type, Callable[[Any], bytes]] = {
    ConnectGroupConnectorsValue: _encode_connectors_value,
    ConnectGroupCurrentMemberAssignmentValue: _encode_current_assignment_value,
    ConnectGroupTargetAssignmentMemberValue: _encode_target_member_value,
}


def _read_int16(data: bytes, what: str) -> int:
    if len(data) < INT16.size:
        raise RecordDecodeError(f"{what} too short: {len(data)} bytes, need at least 2")
    number: int = INT16.unpack_from(data)[0]
    return number


def decode_key(data: bytes) -> RecordKey:
    type_id = _read_int16(data, "record key")
    try:
        key_type = RECORD_TYPES[type_id][0]
    except KeyError:
        known = ", ".join(str(known_id) for known_id in sorted(RECORD_TYPES))
        raise RecordDecodeError(f"unknown record type id {type_id} (known: {known})") from None
    return _read_whole(key_type, data, f"record key of type {type_id}")


def decode_value(
    key_or_type_id: RecordKey | type[RecordKey] | int, data: bytes | None
) -> RecordValue | None:
    """Decode the value that goes with a key (given as the key, its class or the type id)."""
    type_id = key_or_type_id if isinstance(key_or_type_id, int) else record_type_id(key_or_type_id)
    try:
        value_type = RECORD_TYPES[type_id][1]
    except KeyError:
        raise RecordDecodeError(f"unknown record type id {type_id}") from None
    if data is None:
        return None
    version = _read_int16(data, f"{value_type.__name__} record value")
    if version != VALUE_VERSION:
        raise RecordDecodeError(
            f"unknown {value_type.__name__} value version {version} (known: {VALUE_VERSION})"
        )
    return _read_whole(value_type, data, f"{value_type.__name__} record value")


def _read_whole(entity_type: type[_Entity], data: bytes, what: str) -> _Entity:
    try:
        entity, end = read_entity(entity_type, data, INT16.size)
    except EntityDecodeError as error:
        raise RecordDecodeError(f"malformed {what}: {error}") from error
    if end != len(data):
        raise RecordDecodeError(f"malformed {what}: {len(data) - end} trailing bytes")
    return entity


# A key's first two bytes (its type id) -> (key reader, value reader): kio's native
# readers, looked up once.
_READERS = {
    INT16.pack(type_id): (entity_reader(key_type), entity_reader(value_type))
    for type_id, (key_type, value_type) in RECORD_TYPES.items()
}
_new_decoded = tuple.__new__  # skips the NamedTuple constructor's Python frame


def decode_record(key_bytes: bytes, value_bytes: bytes | None) -> DecodedRecord:
    # Start-up replays every record through here: the common case goes straight to the
    # native readers, and anything unusual is decoded again the careful way, which says
    # what is wrong.
    try:
        key_reader, value_reader = _READERS[key_bytes[:2]]
        key, key_size = key_reader(key_bytes, 2)
        if key_size + 2 == len(key_bytes):
            if value_bytes is None:
                return _new_decoded(DecodedRecord, (key, None))
            if value_bytes[:2] == _VALUE_VERSION_BYTES:
                value, value_size = value_reader(value_bytes, 2)
                if value_size + 2 == len(value_bytes):
                    return _new_decoded(DecodedRecord, (key, value))
    except Exception:  # noqa: S110 - the careful path below raises the right error
        pass
    key = decode_key(key_bytes)
    return DecodedRecord(key, decode_value(key, value_bytes))


# -- readable rendering for `log dump` ---------------------------------------------------


_PLAIN_NAME = re.compile(r"[\w.:/@+-]+")


def _render(value: object) -> str:
    if isinstance(value, ConnectorTaskId):
        # Connect's own spelling of a task id; quoted if the name could confuse a reader.
        plain = _PLAIN_NAME.fullmatch(value.connector) is not None
        return f"{value.connector if plain else repr(value.connector)}-{value.task}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        inner = ", ".join(
            f"{field.name}={_render(getattr(value, field.name))}"
            for field in dataclasses.fields(value)
        )
        return f"{{{inner}}}"
    if isinstance(value, tuple):
        return "[" + ", ".join(_render(item) for item in value) + "]"
    if isinstance(value, bytes):
        return f"0x{value.hex()}" if value else "''"
    if isinstance(value, str):
        return repr(value)
    return "null" if value is None else str(value)


def _render_fields(entity: object) -> str:
    return _render(entity)[1:-1]


def format_record(key_bytes: bytes, value_bytes: bytes | None) -> str:
    """One readable line: record type, key fields, value fields (or "tombstone").

    Raises RecordDecodeError for bytes that do not decode, so a dump tool can decide
    whether to stop or to print the raw bytes.
    """
    key, value = decode_record(key_bytes, value_bytes)
    record_name = type(key).__name__.removeprefix("ConnectGroup").removesuffix("Key")
    shown_value = "tombstone" if value is None else f"value({_render_fields(value)})"
    return f"{record_name} key({_render_fields(key)}) {shown_value}"
