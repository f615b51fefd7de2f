"""Versions the listener does not serve, over real TCP: ApiVersions v5 as Kafka 4.4 clients
send it first on every connection, and a newer version of an API the coordinator answers,
each answered with UNSUPPORTED_VERSION in a form the client reads, on the same connection."""

from __future__ import annotations

import struct
from typing import Any

import trio
from kio.schema.metadata.v13.request import MetadataRequest as MetadataRequestV13

from coordinator.proxy import wire
from coordinator.server.app import ServerHandle
from protocol.errors import ErrorCode
from protocol.framing import FrameBuffer, decode_response
from tests.server.conftest import framed, read_frame

API_VERSIONS = 18
METADATA = 3


def compact_string(text: str | None) -> bytes:
    if text is None:
        return b"\x00"
    data = text.encode()
    return bytes([len(data) + 1]) + data  # (short strings: a one-byte varint)


def api_versions_v5_request(correlation_id: int) -> bytes:
    """ApiVersions v5 as a Kafka 4.4 client sends it: header v2, then the client's name and
    version, the cluster id and node id it means to reach (null and -1: not yet known)."""
    header = struct.pack(">hhih", API_VERSIONS, 5, correlation_id, 6) + b"client" + b"\x00"
    body = (compact_string("apache-kafka-java") + compact_string("4.4.0")
            + compact_string(None) + struct.pack(">i", -1) + b"\x00")
    return framed(header + body)


def unsupported_api_versions(frame: bytes, correlation_id: int) -> tuple[int, int]:
    """The ApiVersions range of an UNSUPPORTED_VERSION answer in the v0 form."""
    versions: Any
    correlation, versions = decode_response(frame, API_VERSIONS, 0)
    assert correlation == correlation_id
    assert int(versions.error_code) == ErrorCode.UNSUPPORTED_VERSION
    ranges = {int(entry.api_key): (int(entry.min_version), int(entry.max_version))
              for entry in versions.api_keys}
    return ranges[API_VERSIONS]


async def test_api_versions_v5_is_answered_with_the_range_served_on_the_same_connection(
        server: ServerHandle) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", server.kafka_port)
    async with stream:
        buffer = FrameBuffer(1 << 20)
        await stream.send_all(api_versions_v5_request(7))
        with trio.fail_after(10):
            frame = await read_frame(stream, buffer)
        assert frame is not None, "the listener closed the connection"
        low, high = unsupported_api_versions(frame, 7)
        assert low == 0 and 4 <= high < 5
        # the client retries with the highest version offered, on the same connection
        await stream.send_all(wire.encode_request(API_VERSIONS, high, 8, _api_versions(high)))
        with trio.fail_after(10):
            frame = await read_frame(stream, buffer)
        assert frame is not None
        correlation, body = decode_response(frame, API_VERSIONS, high)
        assert correlation == 8 and int(body.error_code) == ErrorCode.NONE


async def test_a_newer_metadata_version_is_refused_in_that_versions_form(
        server: ServerHandle) -> None:
    """Metadata v13 (newer than served; a 4.4 client's newest) is answered as v13, so
    the client reads UNSUPPORTED_VERSION where it looks, and the connection serves on."""
    stream = await trio.open_tcp_stream("127.0.0.1", server.kafka_port)
    async with stream:
        buffer = FrameBuffer(1 << 20)
        request = MetadataRequestV13(topics=None, allow_auto_topic_creation=False,
                                     include_topic_authorized_operations=False)
        await stream.send_all(wire.encode_request(METADATA, 13, 9, request))
        with trio.fail_after(10):
            frame = await read_frame(stream, buffer)
        assert frame is not None, "the listener closed the connection"
        correlation, body = wire.decode_response(frame, METADATA, 13)
        assert correlation == 9
        assert int(body.error_code) == ErrorCode.UNSUPPORTED_VERSION
        await stream.send_all(wire.encode_request(API_VERSIONS, 0, 10, _api_versions(0)))
        with trio.fail_after(10):
            frame = await read_frame(stream, buffer)
        assert frame is not None and decode_response(frame, API_VERSIONS, 0)[0] == 10


def _api_versions(version: int) -> Any:
    import importlib
    module = importlib.import_module(f"kio.schema.api_versions.v{version}.request")
    if version >= 3:
        return module.ApiVersionsRequest(client_software_name="tests",
                                         client_software_version="1")
    return module.ApiVersionsRequest()
