"""Record codec edge cases (round trips of every record type are in test_roundtrip)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol._codec import INT16, entity_bytes
from protocol.messages import (
    ConnectGroupConnectorsKey,
    ConnectGroupConnectorsValue,
    ConnectGroupCurrentMemberAssignmentValue,
    ConnectGroupMemberMetadataKey,
    ConnectGroupMetadataKey,
    ConnectGroupMetadataValue,
    ConnectGroupTargetAssignmentMemberValue,
    ConnectorsAndTasks,
    ConnectorTaskId,
)
from protocol.messages.connect_group_connectors_value import Connector
from protocol.records import (
    RECORD_TYPES,
    VALUE_VERSION,
    RecordDecodeError,
    decode_key,
    decode_record,
    decode_value,
    encode_key,
    encode_value,
    format_record,
)
from tests.protocol.strategies import entities

KEY = ConnectGroupMetadataKey(group_id="g1")


def test_record_type_ids_are_the_json_api_keys() -> None:
    assert sorted(RECORD_TYPES) == [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 20]
    for type_id, (key_type, value_type) in RECORD_TYPES.items():
        assert key_type.__name__.removesuffix("Key") == value_type.__name__.removesuffix("Value")
        assert key_type.__api_key__ == value_type.__api_key__ == type_id


def test_tombstone() -> None:
    assert encode_value(None) is None
    assert decode_value(KEY, None) is None
    assert decode_record(encode_key(KEY), None) == (KEY, None)
    assert format_record(encode_key(KEY), None) == "Metadata key(group_id='g1') tombstone"


def test_unknown_record_type_id() -> None:
    with pytest.raises(RecordDecodeError, match="unknown record type id 42"):
        decode_key(b"\x00\x2a\x00\x01g")
    with pytest.raises(RecordDecodeError, match="unknown record type id 2"):
        decode_value(2, b"\x00\x00")


def test_unknown_value_version() -> None:
    with pytest.raises(RecordDecodeError, match="version 1"):
        decode_value(3, b"\x00\x01\x00\x00\x00\x01\x00")


@pytest.mark.parametrize("data", [b"", b"\x00", b"\x00\x03", b"\x00\x03\x00\x05g"])
def test_malformed_key(data: bytes) -> None:
    with pytest.raises(RecordDecodeError):
        decode_key(data)


def test_malformed_value() -> None:
    good = encode_value(ConnectGroupMetadataValue(epoch=1))
    assert good is not None
    with pytest.raises(RecordDecodeError, match="malformed"):
        decode_value(3, good[:-2])
    with pytest.raises(RecordDecodeError, match="trailing"):
        decode_value(3, good + b"\x00")
    with pytest.raises(RecordDecodeError, match="trailing"):
        decode_key(encode_key(KEY) + b"x")


def test_decode_value_accepts_a_key_its_class_or_the_type_id() -> None:
    value = ConnectGroupMetadataValue(epoch=7)
    data = encode_value(value)
    assert decode_value(KEY, data) == decode_value(ConnectGroupMetadataKey, data) == value
    assert decode_value(3, data) == value


def test_keys_and_values_are_not_interchangeable() -> None:
    with pytest.raises(TypeError):
        encode_key(ConnectGroupMetadataValue(epoch=1))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encode_value(KEY)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encode_key("not a record")  # type: ignore[arg-type]


def test_format_record_is_one_readable_line() -> None:
    key = ConnectGroupConnectorsKey(group_id="g1")
    value = ConnectGroupConnectorsValue(
        connectors=(Connector(name="jdbc-sink", tasks=3), Connector(name="a\nb", tasks=0))
    )
    line = format_record(encode_key(key), encode_value(value))
    assert line == (
        "Connectors key(group_id='g1') "
        "value(connectors=[{name='jdbc-sink', tasks=3}, {name='a\\nb', tasks=0}])"
    )
    member = ConnectGroupMemberMetadataKey(group_id="g", member_id="m")
    assert format_record(encode_key(member), None).startswith("MemberMetadata key(")


def test_format_record_raises_on_bad_bytes() -> None:
    with pytest.raises(RecordDecodeError):
        format_record(b"\x00\x63", None)


@given(st.lists(st.tuples(st.text(max_size=300), st.integers(-(2**31), 2**31 - 1)),
                max_size=200))
def test_connectors_value_is_written_as_kio_writes_it(
        connectors: list[tuple[str, int]]) -> None:
    # The connectors record has its own writer (it is rewritten whole on every resize); its
    # bytes must be kio's, and read back to the same value.
    value = ConnectGroupConnectorsValue(
        connectors=tuple(Connector(name=name, tasks=tasks) for name, tasks in connectors))
    written = encode_value(value)
    assert written == INT16.pack(VALUE_VERSION) + entity_bytes(ConnectGroupConnectorsValue,
                                                               value)
    assert decode_value(ConnectGroupConnectorsValue, written) == value


@given(value=entities(ConnectGroupCurrentMemberAssignmentValue)
       | entities(ConnectGroupTargetAssignmentMemberValue), tasks=st.integers(0, 300))
def test_assignment_values_are_written_as_kio_writes_them(
        value: ConnectGroupCurrentMemberAssignmentValue | ConnectGroupTargetAssignmentMemberValue,
        tasks: int) -> None:
    # Both are written for every member after a new target (protocol/fastpath.py); a few
    # hundred tasks with long names take the lengths past one varint byte.
    many = ConnectorsAndTasks(connectors=value.assigned.connectors, tasks=tuple(
        ConnectorTaskId(connector="c" * (task % 200), task=task) for task in range(tasks)))
    for candidate in (value, dataclasses.replace(value, assigned=many)):
        written = encode_value(candidate)
        assert written == INT16.pack(VALUE_VERSION) + entity_bytes(type(candidate), candidate)
        assert decode_value(type(candidate), written) == candidate
