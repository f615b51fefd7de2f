"""Property-based round trips of every generated class and every record type."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol._codec import entity_bytes, read_entity
from protocol.records import (
    decode_key,
    decode_record,
    decode_value,
    encode_key,
    encode_value,
    format_record,
)
from tests.protocol.strategies import entities, generated_classes, record_pairs

CLASSES = generated_classes()


def test_every_module_class_is_covered() -> None:
    names = {cls.__name__ for cls in CLASSES}
    # Top-level messages, records, nested structs and the common structs.
    assert {"ConnectGroupHeartbeatRequest", "ConnectGroupConfigurationValue"} <= names
    assert {"ClientAssignor", "Assignment", "Member", "MemberAssignor", "MemberAssignment"} <= names
    assert {"DescribedGroup", "DescribedMember", "Connector"} <= names
    assert {"ConnectorTaskId", "ConnectorsAndTasks"} <= names


@pytest.mark.parametrize("entity_type", CLASSES, ids=lambda cls: f"{cls.__module__}.{cls.__name__}")
@given(data=st.data())
def test_entity_round_trip(entity_type: type[Any], data: st.DataObject) -> None:
    entity = data.draw(entities(entity_type))
    encoded = entity_bytes(entity_type, entity)
    decoded, end = read_entity(entity_type, encoded, 0)
    assert decoded == entity
    assert end == len(encoded)
    # Decoding must not depend on where the entity starts in the buffer.
    shifted, shifted_end = read_entity(entity_type, b"\xaa\xbb" + encoded, 2)
    assert shifted == entity and shifted_end == len(encoded) + 2


@pytest.mark.parametrize(
    ("type_id", "key_type", "value_type"),
    record_pairs(),
    ids=lambda item: item.__name__ if isinstance(item, type) else str(item),
)
@given(data=st.data())
def test_record_round_trip(
    type_id: int, key_type: type[Any], value_type: type[Any], data: st.DataObject
) -> None:
    key = data.draw(entities(key_type))
    value = data.draw(st.none() | entities(value_type))
    key_bytes = encode_key(key)
    value_bytes = encode_value(value)
    assert key_bytes[:2] == type_id.to_bytes(2, "big")
    assert (value_bytes is None) == (value is None)
    if value_bytes is not None:
        assert value_bytes[:2] == b"\x00\x00"  # value version 0
    assert decode_key(key_bytes) == key
    assert decode_value(type_id, value_bytes) == value
    assert decode_value(key_type, value_bytes) == value
    assert decode_record(key_bytes, value_bytes) == (key, value)
    rendered = format_record(key_bytes, value_bytes)
    assert "\n" not in rendered
    assert rendered.startswith(key_type.__name__.removeprefix("ConnectGroup").removesuffix("Key"))
