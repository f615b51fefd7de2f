"""Hostile and oversized input against a real `serve` process over TCP: one test per way a
client could kill, stall or bloat the coordinator, or get a misleading error from it.

The server runs with a few limits lowered (named in SETTINGS) so that going over them
is cheap; the defaults are checked to be sane separately.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.config import ServerConfig
from protocol._codec import INT32
from protocol.errors import ErrorCode
from protocol.messages.common import ConnectorTaskId
from tests.integration.helpers import ServerProcess
from tests.server import hostile
from tests.server.hostile import (
    DESCRIBE,
    HEARTBEAT,
    RawConnection,
    alive,
    describe,
    heartbeat,
    owned,
    request_frame,
    running_server,
)

SETTINGS = [
    "server.max.frame.bytes=262144",
    "group.connect.max.owned.units=1000",
    "group.connect.max.describe.groups=50",
    "group.connect.max.units=3000",
    "group.coordinator.max.groups=40",
    "server.admin.max.body.bytes=4096",
    "group.connect.max.metadata.bytes=100000",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(tmp_path_factory.mktemp("hostile"), SETTINGS) as process:
        yield process


def ask(process: ServerProcess, frame: bytes, api_key: int) -> object:
    with RawConnection(process.kafka_port) as connection:
        return connection.ask(frame, api_key)


def no_traceback(process: ServerProcess) -> None:
    assert "Traceback" not in process.output()


# -- a frame that killed the process -----------------------------------------------------


def test_unknown_tagged_field_in_body_is_skipped(server: ServerProcess) -> None:
    frame = hostile.with_body_tag(request_frame(HEARTBEAT, heartbeat("tag-body", "m1")))
    response = ask(server, frame, HEARTBEAT)
    assert response is not None and response.error_code == 0  # type: ignore[attr-defined]
    assert alive(server)


def test_unknown_tagged_field_in_header_is_skipped(server: ServerProcess) -> None:
    frame = hostile.with_header_tag(request_frame(DESCRIBE, describe("tag-header")))
    response = ask(server, frame, DESCRIBE)
    assert response is not None
    assert response.groups[0].error_code == ErrorCode.GROUP_ID_NOT_FOUND  # type: ignore[attr-defined]
    assert alive(server)


def test_a_flipped_tagged_field_count_does_not_kill(server: ServerProcess) -> None:
    frame = bytearray(request_frame(HEARTBEAT, heartbeat("tag-flip", "m1")))
    at = 4 + 8 + 2 + len(hostile.CLIENT_ID)  # the header's tagged-field count
    assert frame[at] == 0
    frame[at] = 1  # one bit: the body's first bytes now read as an unknown tagged field
    with RawConnection(server.kafka_port) as connection:
        connection.send(bytes(frame))
        connection.answer()  # answered INVALID_REQUEST or closed: either way, alive
    assert alive(server)


def test_an_array_declaring_four_billion_elements_is_refused(server: ServerProcess) -> None:
    for frame, api_key in ((hostile.huge_describe(), DESCRIBE),
                           (hostile.huge_owned_tasks(), HEARTBEAT)):
        with RawConnection(server.kafka_port) as connection:
            connection.send(frame)
            answer = connection.answer()
        assert answer is not None  # an INVALID_REQUEST answer, not a dead process
        assert alive(server), api_key


# -- one request that stalled the loop ----------------------------------------------------


def test_describe_of_more_group_ids_than_allowed_is_refused(server: ServerProcess) -> None:
    response = ask(server, request_frame(DESCRIBE, describe(*[f"g{i}" for i in range(51)])),
                   DESCRIBE)
    assert response is not None
    group = response.groups[0]  # type: ignore[attr-defined]
    assert group.error_code == ErrorCode.INVALID_REQUEST
    assert "group.connect.max.describe.groups" in group.error_message


def test_a_describe_whose_answer_would_not_fit_in_a_frame_is_refused(
        server: ServerProcess) -> None:
    # 2,001 units of 100-character names: ~210 KB a listing; described 20 times: 4 MB.
    status, _ = hostile_put(server, "big-describe", "c" * 100, 2_000)
    assert status == 200
    response = ask(server, request_frame(DESCRIBE, describe(*["big-describe"] * 20)),
                   DESCRIBE)
    assert response is not None
    group = response.groups[0]  # type: ignore[attr-defined]
    assert group.error_code == ErrorCode.INVALID_REQUEST
    assert "server.max.frame.bytes" in group.error_message
    assert alive(server)


def test_a_large_describe_is_answered_whole(server: ServerProcess) -> None:
    """Above 32 KB an answer is built and encoded off the event loop: same answer."""
    status, _ = hostile_put(server, "mid-describe", "d" * 100, 300)
    assert status == 200
    response = ask(server, request_frame(DESCRIBE, describe("mid-describe", "nope")), DESCRIBE)
    assert response is not None
    found, missing = response.groups  # type: ignore[attr-defined]
    assert found.error_code == 0 and missing.error_code == ErrorCode.GROUP_ID_NOT_FOUND
    units = found.connectors_and_tasks
    assert units.connectors == ("d" * 100,)
    assert [task.task for task in units.tasks] == list(range(300))


def test_a_heartbeat_owning_more_units_than_allowed_is_refused(server: ServerProcess) -> None:
    tasks = tuple(ConnectorTaskId(connector="c", task=i) for i in range(1_001))
    request = heartbeat("owned", "m1", epoch=3, owned_connectors_and_tasks=owned(tasks=tasks))
    response = ask(server, request_frame(HEARTBEAT, request), HEARTBEAT)
    assert response is not None
    assert response.error_code == ErrorCode.INVALID_REQUEST  # type: ignore[attr-defined]
    assert "group.connect.max.owned.units" in response.error_message  # type: ignore[attr-defined]


def test_the_default_frame_limit_is_a_few_megabytes() -> None:
    assert ServerConfig().max_frame_bytes <= 16 * 1024 * 1024


# -- amplification ------------------------------------------------------------------------


def hostile_put(server: ServerProcess, group: str, connector: str, tasks: int
                ) -> tuple[int, object]:
    from tests.integration.helpers import http_call
    return http_call("PUT", f"http://127.0.0.1:{server.admin_port}/groups/{group}/connectors/"
                     f"{connector}", {"tasks": tasks})


def test_a_long_connector_name_is_refused(server: ServerProcess) -> None:
    status, body = hostile_put(server, "names", "n" * 16_384, 10)
    assert status == 400, body
    assert "group.connect.max.id.bytes" in body["message"]  # type: ignore[index]


def test_a_long_worker_url_is_refused(server: ServerProcess) -> None:
    request = heartbeat("urls", "m1", worker_url="http://" + "u" * 1_000_000)
    response = ask(server, request_frame(HEARTBEAT, request), HEARTBEAT)
    # a megabyte is over the frame limit here: the connection is closed, nothing stored
    assert response is None or response.error_code == ErrorCode.INVALID_REQUEST  # type: ignore[attr-defined]
    request = heartbeat("urls", "m1", worker_url="http://" + "u" * 10_000)
    response = ask(server, request_frame(HEARTBEAT, request), HEARTBEAT)
    assert response is not None
    assert response.error_code == ErrorCode.INVALID_REQUEST  # type: ignore[attr-defined]
    assert "group.connect.max.url.bytes" in response.error_message  # type: ignore[attr-defined]


def test_large_assignor_metadata_is_refused(server: ServerProcess) -> None:
    from protocol.messages.connect_group_heartbeat_request import ClientAssignor
    assignor = ClientAssignor(name="sessioned", minimum_version=0, maximum_version=1,
                              reason=0, version=1, metadata=b"m" * 200_000)
    request = heartbeat("metadata", "m1", client_assignors=(assignor,))
    response = ask(server, request_frame(HEARTBEAT, request), HEARTBEAT)
    assert response.error_code == ErrorCode.INVALID_REQUEST  # type: ignore[attr-defined]
    assert "group.connect.max.metadata.bytes" in response.error_message  # type: ignore[attr-defined]


def test_units_per_group_are_limited(server: ServerProcess) -> None:
    status, _ = hostile_put(server, "units", "a", 2_000)
    assert status == 200
    status, body = hostile_put(server, "units", "b", 1_000)
    assert status == 400
    assert "group.connect.max.units" in body["message"]  # type: ignore[index]


def test_groups_per_coordinator_are_limited(tmp_path: Path) -> None:
    with running_server(tmp_path, ["group.coordinator.max.groups=3"]) as process:
        for index in range(3):
            response = ask(process, request_frame(HEARTBEAT, heartbeat(f"g{index}")),
                           HEARTBEAT)
            assert response.error_code == 0  # type: ignore[attr-defined]
        response = ask(process, request_frame(HEARTBEAT, heartbeat("g3")), HEARTBEAT)
        assert response.error_code == ErrorCode.INVALID_REQUEST  # type: ignore[attr-defined]
        assert "group.coordinator.max.groups" in response.error_message  # type: ignore[attr-defined]
        status, body = hostile_put(process, "g4", "c", 1)
        assert status == 400 and "group.coordinator.max.groups" in body["message"]  # type: ignore[index]


# -- wrong errors -------------------------------------------------------------------------


def test_an_id_too_long_for_a_record_is_invalid_not_unavailable(server: ServerProcess) -> None:
    response = ask(server, request_frame(HEARTBEAT, heartbeat("x" * 40_000, "m1")), HEARTBEAT)
    assert response is not None
    assert response.error_code == ErrorCode.INVALID_REQUEST  # type: ignore[attr-defined]
    assert "group.connect.max.id.bytes" in response.error_message  # type: ignore[attr-defined]
    status, body = hostile_put(server, "y" * 40_000, "c", 1)
    assert status in (400, 414, 431), body


def test_null_for_a_non_nullable_array_is_invalid_without_a_traceback(
        server: ServerProcess) -> None:
    with RawConnection(server.kafka_port) as connection:
        peer = f"127.0.0.1:{connection.sock.getsockname()[1]}"
        for _ in range(200):
            connection.send(hostile.null_group_ids())
        answers = [connection.answer() for _ in range(200)]
    assert all(answer is not None for answer in answers)
    from protocol.framing import decode_response
    response = decode_response(answers[0], DESCRIBE, 0)[1]  # type: ignore[arg-type]
    assert response.groups[0].error_code == ErrorCode.INVALID_REQUEST  # type: ignore[union-attr]
    no_traceback(server)
    # logged once per connection (rate limited), not once per request
    lines = [e for e in server.events()
             if e.get("event") == "bad_request" and e.get("peer") == peer]
    assert 1 <= len(lines) <= 5


# -- connections --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def strict_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    settings = ["server.max.connections=4", "server.connection.read.timeout.ms=500",
                "server.connection.idle.timeout.ms=1500"]
    with running_server(tmp_path_factory.mktemp("strict"), settings) as process:
        yield process


def test_connections_over_the_cap_are_closed_at_once(strict_server: ServerProcess) -> None:
    held = [RawConnection(strict_server.kafka_port) for _ in range(4)]
    try:
        for connection in held:  # each is served (and so counted) before the next opens
            assert connection.ask(request_frame(DESCRIBE, describe("x")), DESCRIBE) is not None
        with RawConnection(strict_server.kafka_port) as extra:
            assert extra.closed_within(5.0)
    finally:
        for connection in held:
            connection.close()
    assert alive(strict_server)  # the slots are free again once those are closed


def test_a_slowloris_frame_is_cut_off(strict_server: ServerProcess) -> None:
    import time
    frame = request_frame(DESCRIBE, describe("slow"))
    with RawConnection(strict_server.kafka_port) as connection:
        started = time.monotonic()
        closed = False
        for byte in frame:  # a byte every 100 ms: each read is fresh, the frame is not
            try:
                connection.send(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            if connection.closed_within(0.1):
                closed = True
                break
        assert closed
        assert time.monotonic() - started < 5.0
    assert any(e.get("event") == "connection_timed_out" and e.get("reason") == "read_timeout"
               for e in strict_server.events())


def test_an_idle_connection_is_closed(strict_server: ServerProcess) -> None:
    with RawConnection(strict_server.kafka_port) as connection:
        assert connection.ask(request_frame(DESCRIBE, describe("idle")), DESCRIBE) is not None
        assert connection.closed_within(10.0)


def test_a_group_whose_units_would_not_fit_in_one_answer_is_refused(
        server: ServerProcess) -> None:
    # 255-byte names: 1,010 tasks list in 263,871 bytes, over this server's 262,144
    status, body = hostile_put(server, "amplified", "a" * 255, 1_010)
    assert status == 400
    assert "server.max.frame.bytes" in body["message"]  # type: ignore[index]
    status, _ = hostile_put(server, "amplified", "a" * 255, 900)
    assert status == 200


def test_a_client_that_does_not_read_is_not_buffered_for(server: ServerProcess) -> None:
    """Backpressure: while its answers cannot be sent, the connection is not read, so the
    client's own sends block instead of the server buffering answers."""
    status, _ = hostile_put(server, "mid-answer", "e" * 100, 300)
    assert status == 200
    request = request_frame(DESCRIBE, describe("mid-answer", *[f"{i:0>250}" for i in range(99)]))
    with RawConnection(server.kafka_port, timeout_s=3.0) as connection:
        connection.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        sent = 0
        with pytest.raises(TimeoutError):
            while sent < 4_000:  # ~100 MB of requests, ~250 MB of answers
                connection.send(request)
                sent += 1
        assert sent < 4_000
    assert alive(server)


def test_a_repeated_frame_is_answered_as_itself_on_one_connection(server: ServerProcess
                                                                   ) -> None:
    # A connection remembers its last frame (RepeatedFrame): the same bytes under another
    # correlation id are answered under that id, and a refused frame stays refused.
    join = heartbeat("repeat", "m1", epoch=0, worker_url="http://m1:8083")
    tasks = tuple(ConnectorTaskId(connector="c", task=i) for i in range(1_001))
    over = heartbeat("repeat", "m1", epoch=1, owned_connectors_and_tasks=owned(tasks=tasks))
    with RawConnection(server.kafka_port) as connection:
        for correlation_id in (11, 12):
            connection.send(request_frame(HEARTBEAT, join, correlation_id))
            answer = connection.answer()
            assert answer is not None and INT32.unpack_from(answer, 0)[0] == correlation_id
        for correlation_id in (13, 14):
            refused = connection.ask(request_frame(HEARTBEAT, over, correlation_id), HEARTBEAT)
            assert refused.error_code == ErrorCode.INVALID_REQUEST
