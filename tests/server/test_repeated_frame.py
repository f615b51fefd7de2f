"""A connection's repeated request frame is answered from what it decoded to before."""

from __future__ import annotations

from coordinator.server.kafka import REPEATED_FRAME_BYTES, RepeatedFrame
from protocol.framing import decode_request, encode_request
from protocol.messages import ConnectGroupHeartbeatRequest


def heartbeat_frame(correlation_id: int, epoch: int = 3, member: str = "m") -> bytes:
    body = ConnectGroupHeartbeatRequest(group_id="g", member_id=member, member_epoch=epoch)
    return encode_request(1000, 0, correlation_id, "worker", body)[4:]


def test_a_frame_that_repeats_but_for_its_correlation_id_decodes_as_before() -> None:
    repeated = RepeatedFrame()
    first = heartbeat_frame(7)
    assert repeated.get(first) is None
    repeated.remember(first, decode_request(first))
    again = heartbeat_frame(8)
    request = repeated.get(again)
    assert request == decode_request(again)
    assert request is not None and request.correlation_id == 8


def test_a_frame_that_differs_anywhere_else_is_decoded_anew() -> None:
    repeated = RepeatedFrame()
    first = heartbeat_frame(7)
    repeated.remember(first, decode_request(first))
    assert repeated.get(heartbeat_frame(8, epoch=4)) is None
    assert repeated.get(heartbeat_frame(8, member="n")) is None
    other_version = bytearray(heartbeat_frame(8))
    other_version[3] = 1  # the API version's low byte
    assert repeated.get(bytes(other_version)) is None


def test_a_large_frame_is_not_remembered() -> None:
    repeated = RepeatedFrame()
    large = heartbeat_frame(7, member="m" * REPEATED_FRAME_BYTES)
    repeated.remember(large, decode_request(large))
    assert repeated.get(heartbeat_frame(8, member="m" * REPEATED_FRAME_BYTES)) is None
