"""A SASL client is refused at once, with the error Kafka clients report clearly."""

from __future__ import annotations

import trio
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from coordinator.proxy import wire
from coordinator.server.app import ServerHandle
from protocol.errors import ErrorCode
from protocol.framing import FrameBuffer
from tests.server.conftest import read_frame


async def test_a_sasl_handshake_on_the_plain_listener_is_refused_with_no_mechanisms(
        server: ServerHandle) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", server.kafka_port)
    async with stream:
        await stream.send_all(wire.encode_request(17, 1, 41, SaslHandshakeRequest(
            mechanism="SCRAM-SHA-512")))
        with trio.fail_after(10):
            answer = await read_frame(stream, FrameBuffer(1 << 20))
    assert answer is not None
    correlation, body = wire.decode_response(answer, 17, 1)
    assert correlation == 41
    assert body.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
    assert tuple(body.mechanisms) == ()
