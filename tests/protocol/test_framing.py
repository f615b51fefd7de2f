"""FrameBuffer and the request/response codecs."""

from __future__ import annotations

import importlib
import struct
from typing import Any

import pytest
from kio.schema.errors import ErrorCode as KioErrorCode

from protocol.errors import ErrorCode
from protocol.framing import (
    RESPONSE_CLASSES,
    SUPPORTED_APIS,
    FrameBuffer,
    FrameTooLarge,
    MalformedFrame,
    MalformedRequest,
    MalformedResponse,
    UnsupportedApi,
    api_versions_response,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    error_response,
)
from protocol.messages import (
    ConnectGroupDescribeRequest,
    ConnectGroupDescribeResponse,
    ConnectGroupDescribeResponseV0,
    ConnectGroupHeartbeatRequest,
    ConnectGroupPrepareAssignmentRequest,
)


def api_versions_module(version: int) -> Any:
    return importlib.import_module(f"kio.schema.api_versions.v{version}")


def heartbeat(correlation_id: int) -> bytes:
    body = ConnectGroupHeartbeatRequest(
        group_id="g", member_id=f"m{correlation_id}", member_epoch=correlation_id
    )
    return encode_request(1000, 0, correlation_id, "client", body)


def frame_header(api_key: int, api_version: int, correlation_id: int) -> bytes:
    """The fixed part of a request header, then a null legacy client id and no tags."""
    return struct.pack(">hhi", api_key, api_version, correlation_id) + b"\xff\xff\x00"


def correlation_ids(buffer: FrameBuffer) -> list[int]:
    return [decode_request(frame).correlation_id for frame in buffer]


# -- FrameBuffer ---------------------------------------------------------------------------


def test_pipelined_requests_in_one_feed_come_out_in_order() -> None:
    buffer = FrameBuffer(max_frame_bytes=1024)
    buffer.feed(b"".join(heartbeat(number) for number in range(1, 6)))
    assert correlation_ids(buffer) == [1, 2, 3, 4, 5]
    assert buffer.next_frame() is None
    assert buffer.buffered_bytes == 0


def test_requests_fed_byte_by_byte_come_out_in_order() -> None:
    stream = b"".join(heartbeat(number) for number in (7, 8, 9))
    buffer = FrameBuffer(max_frame_bytes=1024)
    seen = []
    for index in range(len(stream)):
        buffer.feed(stream[index : index + 1])
        seen += correlation_ids(buffer)
    assert seen == [7, 8, 9]


def test_next_frame_returns_frames_then_none() -> None:
    buffer = FrameBuffer(max_frame_bytes=1024)
    first, second = heartbeat(1), heartbeat(2)
    buffer.feed(first + second[:10])
    assert buffer.next_frame() == first[4:]
    assert buffer.next_frame() is None
    buffer.feed(second[10:])
    assert buffer.next_frame() == second[4:]


def test_truncated_frame_gives_no_frame_yet() -> None:
    buffer = FrameBuffer(max_frame_bytes=1024)
    frame = heartbeat(1)
    buffer.feed(frame[:-1])
    assert buffer.next_frame() is None
    assert list(buffer) == []
    buffer.feed(frame[-1:])
    assert buffer.next_frame() == frame[4:]


def test_empty_frame_is_a_frame() -> None:
    buffer = FrameBuffer(max_frame_bytes=16)
    buffer.feed(b"\x00\x00\x00\x00")
    assert buffer.next_frame() == b""


def test_oversize_frame_is_refused_as_soon_as_its_prefix_arrives() -> None:
    buffer = FrameBuffer(max_frame_bytes=100)
    buffer.feed(b"\x00\x00")
    with pytest.raises(FrameTooLarge) as raised:
        buffer.feed(b"\x00\x65")  # 101: no body byte needed to refuse it
    assert (raised.value.size, raised.value.max_frame_bytes) == (101, 100)
    with pytest.raises(FrameTooLarge):
        buffer.feed(b"more")  # the stream is out of sync for good


def test_frame_of_exactly_the_maximum_is_accepted() -> None:
    buffer = FrameBuffer(max_frame_bytes=3)
    buffer.feed(b"\x00\x00\x00\x03abc")
    assert buffer.next_frame() == b"abc"


def test_negative_frame_size_is_malformed() -> None:
    buffer = FrameBuffer(max_frame_bytes=100)
    with pytest.raises(MalformedFrame, match="negative"):
        buffer.feed(b"\xff\xff\xff\xfe")


def test_frames_before_a_bad_prefix_can_still_be_taken() -> None:
    buffer = FrameBuffer(max_frame_bytes=1024)
    good = heartbeat(3)
    with pytest.raises(FrameTooLarge):
        buffer.feed(good + b"\x7f\xff\xff\xff")
    assert correlation_ids(buffer) == [3]


# -- decode_request ------------------------------------------------------------------------


def test_garbage_header_is_malformed() -> None:
    with pytest.raises(MalformedRequest, match="truncated"):
        decode_request(b"\x03\xe8\x00")
    # Client id length 200 with 2 bytes behind it.
    with pytest.raises(MalformedRequest, match="header"):
        decode_request(struct.pack(">hhih", 1000, 0, 1, 200) + b"ab")


def test_body_that_does_not_parse_is_malformed() -> None:
    frame = heartbeat(4)[4:]
    with pytest.raises(MalformedRequest, match="ConnectGroupHeartbeatRequest"):
        decode_request(frame[:-3])


def test_trailing_bytes_are_malformed() -> None:
    with pytest.raises(MalformedRequest, match="2 trailing bytes"):
        decode_request(heartbeat(4)[4:] + b"\x00\x00")


def test_unknown_api_key_is_unsupported_with_its_correlation_id() -> None:
    with pytest.raises(UnsupportedApi) as raised:
        decode_request(frame_header(0, 9, 4242) + b"whatever")
    assert (raised.value.api_key, raised.value.api_version) == (0, 9)
    assert raised.value.correlation_id == 4242


@pytest.mark.parametrize(("api_key", "api_version"), [(1000, 1), (1003, -1), (18, 5)])
def test_unsupported_version_is_unsupported_with_its_correlation_id(
    api_key: int, api_version: int
) -> None:
    with pytest.raises(UnsupportedApi) as raised:
        decode_request(frame_header(api_key, api_version, 99))
    assert raised.value.correlation_id == 99
    assert "supported" in str(raised.value)


@pytest.mark.parametrize("version", range(5))
def test_api_versions_request_and_response(version: int) -> None:
    module = api_versions_module(version)
    arguments = (
        {"client_software_name": "connect", "client_software_version": "4.0"}
        if version >= 3
        else {}
    )
    request = module.ApiVersionsRequest(**arguments)
    frame = encode_request(18, version, 31, "worker", request)
    # v0-v2 use request header v1 (no tagged fields), v3+ header v2.
    header_length = 8 + 2 + len("worker") + (1 if version >= 3 else 0)
    assert len(frame) == 4 + header_length + (0 if version < 3 else 8 + 4 + 1)
    decoded = decode_request(frame[4:])
    assert (decoded.api_key, decoded.api_version, decoded.correlation_id) == (18, version, 31)
    assert decoded.client_id == "worker" and decoded.body == request

    response_frame = encode_response(18, version, 31, api_versions_response(version))
    # ApiVersions responses always use response header v0: the correlation id only.
    assert response_frame[4:8] == (31).to_bytes(4, "big")
    correlation_id, body = decode_response(response_frame[4:], 18, version)
    assert correlation_id == 31
    assert isinstance(body, module.ApiVersionsResponse)
    assert body.error_code == KioErrorCode.none
    listed = {entry.api_key: (entry.min_version, entry.max_version) for entry in body.api_keys}
    assert listed == SUPPORTED_APIS


def test_encode_refuses_a_body_of_the_wrong_class() -> None:
    body = ConnectGroupPrepareAssignmentRequest(group_id="g", member_id="m", member_epoch=1)
    with pytest.raises(TypeError):
        encode_request(1000, 0, 1, None, body)
    with pytest.raises(ValueError):
        encode_request(1000, 3, 1, None, body)


def test_decode_response_rejects_trailing_bytes() -> None:
    frame = encode_response(18, 0, 1, api_versions_response(0))
    with pytest.raises(MalformedResponse, match="trailing"):
        decode_response(frame[4:] + b"\x00", 18, 0)


# -- error_response ------------------------------------------------------------------------


@pytest.mark.parametrize("api_key", [1000, 1001, 1002])
def test_error_response_for_connect_apis(api_key: int) -> None:
    frame = error_response(api_key, 0, 12, ErrorCode.INVALID_REQUEST, "MemberId is empty")
    assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4
    correlation_id, body = decode_response(frame[4:], api_key, 0)
    assert correlation_id == 12
    assert isinstance(body, RESPONSE_CLASSES[api_key, 0])
    assert body.error_code == ErrorCode.INVALID_REQUEST  # type: ignore[union-attr]
    assert body.error_message == "MemberId is empty"  # type: ignore[union-attr]
    assert body.throttle_time_ms == 0  # type: ignore[union-attr]


def test_error_response_for_describe_puts_the_error_in_each_group() -> None:
    frame = error_response(
        1003, 0, 5, ErrorCode.GROUP_AUTHORIZATION_FAILED, "denied", group_ids=("a", "b")
    )
    _, body = decode_response(frame[4:], 1003, 0)
    assert isinstance(body, ConnectGroupDescribeResponseV0)
    assert [group.group_id for group in body.groups] == ["a", "b"]
    assert {(group.error_code, group.error_message) for group in body.groups} == {
        (ErrorCode.GROUP_AUTHORIZATION_FAILED, "denied")
    }
    frame = error_response(1003, 0, 5, ErrorCode.UNKNOWN_SERVER_ERROR, "boom")
    _, body = decode_response(frame[4:], 1003, 0)
    assert isinstance(body, ConnectGroupDescribeResponseV0)
    assert [(group.group_id, group.error_code) for group in body.groups] == [("", -1)]
    # Version 1 is answered in version 1; a version above it in version 0.
    frame = error_response(1003, 1, 5, ErrorCode.UNKNOWN_SERVER_ERROR, "boom")
    _, body = decode_response(frame[4:], 1003, 1)
    assert isinstance(body, ConnectGroupDescribeResponse)
    assert [(group.group_id, group.error_code) for group in body.groups] == [("", -1)]
    frame = error_response(1003, 9, 5, ErrorCode.UNSUPPORTED_VERSION, "no v9")
    _, body = decode_response(frame[4:], 1003, 0)
    assert isinstance(body, ConnectGroupDescribeResponseV0)


def test_error_response_for_an_unsupported_connect_version_is_v0() -> None:
    frame = error_response(1000, 7, 3, ErrorCode.UNSUPPORTED_VERSION, "only v0")
    _, body = decode_response(frame[4:], 1000, 0)
    assert body.error_code == ErrorCode.UNSUPPORTED_VERSION  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("asked_version", "code", "answered_version"),
    [
        # UNSUPPORTED_VERSION is answered in v0, as Kafka does.
        (5, ErrorCode.UNSUPPORTED_VERSION, 0),
        (3, ErrorCode.UNSUPPORTED_VERSION, 0),
        (0, ErrorCode.UNSUPPORTED_VERSION, 0),
        # Other errors of a supported version go out in that version.
        (3, ErrorCode.INVALID_REQUEST, 3),
        (1, ErrorCode.COORDINATOR_NOT_AVAILABLE, 1),
        (7, ErrorCode.INVALID_REQUEST, 0),
    ],
)
def test_error_response_for_api_versions(
    asked_version: int, code: ErrorCode, answered_version: int
) -> None:
    frame = error_response(18, asked_version, 8, code, "no")
    correlation_id, body = decode_response(frame[4:], 18, answered_version)
    assert correlation_id == 8
    assert isinstance(body, api_versions_module(answered_version).ApiVersionsResponse)
    assert body.error_code == KioErrorCode(code)
    assert {entry.api_key for entry in body.api_keys} == set(SUPPORTED_APIS)


def test_client_reads_an_unsupported_version_answer_as_v0() -> None:
    # A client that asked for v4 gets Kafka's v0 fallback and still understands it.
    frame = error_response(18, 9, 8, ErrorCode.UNSUPPORTED_VERSION, "no")
    _, body = decode_response(frame[4:], 18, 4)
    assert isinstance(body, api_versions_module(0).ApiVersionsResponse)


def test_error_response_for_an_unknown_api_key() -> None:
    frame = error_response(4321, 2, 77, ErrorCode.UNSUPPORTED_VERSION, "unknown API")
    assert frame == (
        b"\x00\x00\x00\x06"  # size 6
        b"\x00\x00\x00\x4d"  # response header v0: correlation id 77
        b"\x00\x23"  # int16 error code 35 UNSUPPORTED_VERSION
    )


def test_server_loop_shape_answers_an_unsupported_request_and_goes_on() -> None:
    """What the server does: decode, answer UnsupportedApi, keep reading the stream."""
    describe = encode_request(1003, 0, 2, None, ConnectGroupDescribeRequest(group_ids=("g",)))
    unknown = frame_header(999, 0, 1)
    buffer = FrameBuffer(max_frame_bytes=1024)
    buffer.feed(struct.pack(">i", len(unknown)) + unknown + describe)
    answers = []
    for frame in buffer:
        try:
            request = decode_request(frame)
        except UnsupportedApi as error:
            answers.append(
                error_response(
                    error.api_key, error.api_version, error.correlation_id,
                    ErrorCode.UNSUPPORTED_VERSION, str(error),
                )
            )
            continue
        answers.append(request.correlation_id.to_bytes(4, "big"))
    assert answers[0][4:8] == (1).to_bytes(4, "big")
    assert answers[1] == (2).to_bytes(4, "big")


@pytest.mark.parametrize("version", range(0, 10))
def test_an_error_answer_to_every_join_group_version_encodes(version: int) -> None:
    # A JoinGroup whose body does not parse is answered INVALID_REQUEST in its version;
    # before v7 the protocol name is a string that cannot be null.
    from protocol.classic import JOIN_GROUP
    answer = error_response(JOIN_GROUP, version, 7, ErrorCode.INVALID_REQUEST, "bad")
    assert answer[4:8] == (7).to_bytes(4, "big")


def test_an_error_answer_to_every_classic_api_version_encodes() -> None:
    from protocol.classic import CLASSIC_APIS
    for api_key, (_package, low, high) in CLASSIC_APIS.items():
        for version in range(low, high + 1):
            answer = error_response(api_key, version, 9, ErrorCode.INVALID_REQUEST, "bad",
                                    group_ids=("g",))
            assert answer[4:8] == (9).to_bytes(4, "big"), (api_key, version)
