"""The request walk (protocol/guard.py) through `decode_request`: every valid request passes
unchanged, unknown tagged fields are skipped, and nothing a client can send makes decoding
raise anything but a ProtocolError."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol._codec import INT32, uvarint
from protocol.framing import (
    REQUEST_CLASSES,
    MalformedBody,
    MalformedRequest,
    ProtocolError,
    RequestOverLimit,
    decode_request,
    encode_request,
)
from protocol.guard import ArrayLimit
from protocol.messages import ConnectGroupDescribeRequest
from tests.protocol.strategies import entities

REQUESTS = sorted(REQUEST_CLASSES.items())


def requests() -> st.SearchStrategy[tuple[int, int, Any]]:
    return st.sampled_from(REQUESTS).flatmap(
        lambda item: entities(item[1]).map(lambda body: (item[0][0], item[0][1], body)))


def _frame(api_key: int, version: int, body: Any, client_id: str | None = "c") -> bytes:
    return encode_request(api_key, version, 3, client_id, body)[4:]


@given(requests(), st.one_of(st.none(), st.text(max_size=8)))
def test_every_valid_request_decodes_as_sent(request: tuple[int, int, Any],
                                             client_id: str | None) -> None:
    api_key, version, body = request
    decoded = decode_request(_frame(api_key, version, body, client_id))
    assert decoded.body == body
    assert decoded.client_id == client_id


def _tagged(fields: list[tuple[int, bytes]]) -> bytes:
    return uvarint(len(fields)) + b"".join(
        uvarint(tag) + uvarint(len(data)) + data for tag, data in fields)


@given(requests(), st.lists(st.tuples(st.integers(0, 2**20), st.binary(max_size=6)),
                            min_size=1, max_size=3))
def test_unknown_tagged_fields_are_skipped(request: tuple[int, int, Any],
                                           fields: list[tuple[int, bytes]]) -> None:
    api_key, version, body = request
    frame = _frame(api_key, version, body)
    if not type(body).__flexible__:
        return  # no tagged fields before v3 of ApiVersions
    # the body's own section is its last byte; the header's follows the client id
    header_end = 8 + 2 + 1
    assert frame[header_end] == 0 and frame[-1] == 0
    tagged = _tagged(fields)
    changed = frame[:header_end] + tagged + frame[header_end + 1:-1] + tagged
    assert decode_request(changed).body == body


@given(requests(), st.data())
def test_a_mutated_request_raises_only_protocol_errors(request: tuple[int, int, Any],
                                                       data: st.DataObject) -> None:
    api_key, version, body = request
    frame = bytearray(_frame(api_key, version, body))
    for _ in range(data.draw(st.integers(1, 3))):
        how = data.draw(st.sampled_from(["flip", "truncate", "insert", "set"]))
        at = data.draw(st.integers(0, max(0, len(frame) - 1)))
        if how == "flip" and frame:
            frame[at] ^= 1 << data.draw(st.integers(0, 7))
        elif how == "truncate":
            del frame[at:]
        elif how == "insert":
            frame[at:at] = data.draw(st.binary(min_size=1, max_size=5))
        elif frame:
            frame[at] = data.draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF]))
    try:
        decode_request(bytes(frame))
    except ProtocolError:
        pass


def _describe_header() -> bytes:
    return _frame(1003, 0, ConnectGroupDescribeRequest(group_ids=()))[:-2]


def test_an_array_longer_than_the_frame_is_refused_before_reading() -> None:
    frame = _describe_header() + uvarint(2**32) + b"\x00"
    with pytest.raises(MalformedBody, match="4294967295 elements declared, 1 bytes left"):
        decode_request(frame)


def test_null_for_a_non_nullable_array_is_malformed() -> None:
    with pytest.raises(MalformedBody, match="group_ids: null is not allowed"):
        decode_request(_describe_header() + b"\x00\x00")


def test_a_string_longer_than_the_frame_is_refused() -> None:
    frame = _describe_header() + b"\x02" + uvarint(1_000_000) + b"g" + b"\x00"
    with pytest.raises(MalformedBody, match="truncated"):
        decode_request(frame)


def test_a_bad_header_is_malformed_not_a_body_error() -> None:
    frame = _describe_header()[:8] + INT32.pack(-7)[:2]  # client id length -7
    with pytest.raises(MalformedRequest, match="header") as raised:
        decode_request(frame)
    assert not isinstance(raised.value, MalformedBody)


def test_an_array_over_its_limit_is_refused_when_its_count_is_read() -> None:
    limit = ArrayLimit("groups", 2, "group.connect.max.describe.groups")
    limits = {1003: {("ConnectGroupDescribeRequest", "group_ids"): limit}}
    frame = _frame(1003, 0, ConnectGroupDescribeRequest(group_ids=("a", "b")))
    assert decode_request(frame, limits).body.group_ids == ("a", "b")
    # three declared, none there: refused by the limit, before the elements are looked at
    with pytest.raises(RequestOverLimit, match=r"limit of 2 \(group.connect.max.describe"):
        decode_request(_describe_header() + uvarint(4) + b"\x00" * 3, limits)


def test_arrays_sharing_a_counter_add_up() -> None:
    from protocol.messages import ConnectGroupHeartbeatRequest, ConnectorsAndTasks
    from protocol.messages.common import ConnectorTaskId
    limit = ArrayLimit("units", 3, "group.connect.max.owned.units")
    limits = {1000: {("ConnectorsAndTasks", "connectors"): limit,
                     ("ConnectorsAndTasks", "tasks"): limit}}
    owned = ConnectorsAndTasks(connectors=("a", "b"),
                               tasks=(ConnectorTaskId(connector="a", task=0),
                                      ConnectorTaskId(connector="a", task=1)))
    body = ConnectGroupHeartbeatRequest(group_id="g", member_id="m", member_epoch=1,
                                        owned_connectors_and_tasks=owned)
    with pytest.raises(RequestOverLimit, match="group.connect.max.owned.units"):
        decode_request(_frame(1000, 0, body), limits)


def test_a_section_of_too_many_tagged_fields_is_refused() -> None:
    from protocol.guard import MAX_TAGGED_FIELDS
    frame = _frame(1003, 0, ConnectGroupDescribeRequest(group_ids=("g",)))
    fields = [(tag, b"") for tag in range(MAX_TAGGED_FIELDS + 1)]
    with pytest.raises(MalformedBody, match="tagged fields, more than"):
        decode_request(frame[:-1] + _tagged(fields))
    assert decode_request(frame[:-1] + _tagged(fields[:-1])).body.group_ids == ("g",)


@given(st.integers(0, 200), st.booleans())
def test_a_large_install_is_read_an_element_at_a_time_to_the_same_body(
        members: int, tagged: bool) -> None:
    from protocol.messages import ConnectGroupInstallAssignmentRequest, ConnectorsAndTasks
    from protocol.messages.common import ConnectorTaskId
    from protocol.messages.connect_group_install_assignment_request import MemberAssignment
    body = ConnectGroupInstallAssignmentRequest(
        group_id="g", member_id="m", member_epoch=1, group_epoch=2, error=0,
        members=tuple(MemberAssignment(
            member_id=f"m{index}", version=1, metadata=b"x" * (index % 3),
            assigned=ConnectorsAndTasks(connectors=(f"c{index}",), tasks=(
                ConnectorTaskId(connector=f"c{index}", task=0),)))
            for index in range(members)))
    frame = _frame(1002, 0, body)
    if tagged:  # unknown tagged fields in the header and the body move every offset
        fields = [(9, b"abc")]
        frame = frame[:11] + _tagged(fields) + frame[12:-1] + _tagged(fields)
    assert decode_request(frame).body == body


def test_a_string_over_its_length_limit_is_refused_when_its_length_is_read() -> None:
    from protocol.guard import LengthLimit
    limits = {1003: {("ConnectGroupDescribeRequest", "group_ids[]"):
                     LengthLimit(5, "group.connect.max.id.bytes")}}
    fits = _frame(1003, 0, ConnectGroupDescribeRequest(group_ids=("12345",)))
    assert decode_request(fits, limits).body.group_ids == ("12345",)
    too_long = _frame(1003, 0, ConnectGroupDescribeRequest(group_ids=("123456",)))
    with pytest.raises(RequestOverLimit, match=r"6 bytes, above the limit of 5 \(group.c"):
        decode_request(too_long, limits)
    # a length declared far beyond the bytes there: the limit speaks first, not "truncated"
    declared = _describe_header() + b"\x02" + uvarint(1_000_001) + b"x"
    with pytest.raises(RequestOverLimit, match="1000000 bytes"):
        decode_request(declared, limits)


def test_length_limits_count_bytes_not_characters() -> None:
    from protocol.guard import LengthLimit
    limits = {1003: {("ConnectGroupDescribeRequest", "group_ids[]"):
                     LengthLimit(5, "group.connect.max.id.bytes")}}
    three_characters_six_bytes = "éé\u00e9"
    with pytest.raises(RequestOverLimit, match="6 bytes"):
        decode_request(_frame(1003, 0, ConnectGroupDescribeRequest(
            group_ids=(three_characters_six_bytes,))), limits)


def test_an_assignment_requests_caller_is_read_without_decoding_the_rest() -> None:
    from protocol.framing import encode_request, peek_caller
    from protocol.messages.connect_group_install_assignment_request import (
        ConnectGroupInstallAssignmentRequest,
    )
    body = ConnectGroupInstallAssignmentRequest(group_id="gé", member_id="m", member_epoch=7,
                                                group_epoch=2, error=0, members=())
    frame = encode_request(1002, 0, 5, "client", body)[4:]
    assert peek_caller(frame) == ("gé", "m", 7)
    for cut in range(len(frame) - 5):  # cut inside the caller's fields: not read
        prefix = frame[:cut]
        assert peek_caller(prefix) in (None, ("gé", "m", 7))
    epoch_at = frame.index(b"\x02m") + 2
    assert peek_caller(frame[:epoch_at + 3]) is None  # the member epoch cut
    assert peek_caller(frame[:epoch_at + 4]) == ("gé", "m", 7)
    unknown = b"\x7f\x7f" + frame[2:]  # an API the server does not know
    assert peek_caller(unknown) is None
