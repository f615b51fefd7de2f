"""Hostile input to Kafka's own APIs (classic groups and lookups) against a real `serve`
over TCP: a list over its limit is refused before any work is done for it, an answer that
would not fit in a frame is refused before it is built, and meanwhile a healthy member's
heartbeats stay answered and it is not evicted.

The server runs with the default limits: the attacks are what those let a client send.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.config import ServerConfig
from protocol import classic as wire
from protocol.errors import ErrorCode
from tests.integration.helpers import ServerProcess
from tests.server import hostile
from tests.server.hostile import HealthyMember, RawConnection, alive, running_server

DEFAULTS = ServerConfig()
SESSION_S = DEFAULTS.session_timeout_ms / 1000
ANSWER_PATIENCE_S = 60.0  # an answer that takes longer is not coming


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(tmp_path_factory.mktemp("hostile-classic"), []) as process:
        yield process


def refusals(process: ServerProcess, key: str) -> int:
    """The requests the server logged as refused by the limit `key` (rate-limited lines
    count the ones they stand for)."""
    return sum(1 + int(event.get("suppressed", 0)) for event in process.events()
               if event.get("event") == "bad_request" and key in str(event.get("error")))


def answer_of(frame: bytes, port: int, api_key: int, version: int) -> object:
    with RawConnection(port, timeout_s=ANSWER_PATIENCE_S) as connection:
        connection.send(frame)
        answer = connection.answer()
    assert answer is not None, "the connection was closed instead of answered"
    return hostile.classic_answer(answer, api_key, version)


def healthy_throughout(healthy: HealthyMember) -> None:
    """The healthy member's heartbeats went on after the attack, each answered within its
    session timeout, and it was never told it had left the group."""
    assert healthy.answered_after(len(healthy.answers), ANSWER_PATIENCE_S)
    assert healthy.errors() == []
    assert healthy.longest_s() < SESSION_S


def test_a_join_listing_more_protocols_than_allowed_is_refused(server: ServerProcess) -> None:
    # One member lists 30,000 protocols, another 30,000 other ones: checking the second
    # against the first compared every name with every name, seconds on the event loop.
    limit = DEFAULTS.max_join_protocols
    with HealthyMember(server.kafka_port) as healthy:
        for prefix in ("a", "b"):
            frame = hostile.join_with_protocols([f"{prefix}{i}" for i in range(30_000)],
                                                version=3)
            response = answer_of(frame, server.kafka_port, wire.JOIN_GROUP, 3)
            assert response.error_code == ErrorCode.INVALID_REQUEST  # type: ignore[attr-defined]
        healthy_throughout(healthy)
    assert refusals(server, "group.connect.max.join.protocols") >= 2
    # at the limit, a join is served
    frame = hostile.join_with_protocols([f"ok{i}" for i in range(limit)], group_id="fits")
    response = answer_of(frame, server.kafka_port, wire.JOIN_GROUP, 9)
    assert response.error_code == ErrorCode.MEMBER_ID_REQUIRED  # type: ignore[attr-defined]


def test_a_leave_naming_more_members_than_allowed_is_refused(server: ServerProcess) -> None:
    frame = hostile.leave_naming(300_000)
    with HealthyMember(server.kafka_port) as healthy:
        for _ in range(3):
            response = answer_of(frame, server.kafka_port, wire.LEAVE_GROUP, 5)
            assert response.error_code == ErrorCode.INVALID_REQUEST  # type: ignore[attr-defined]
            assert response.members == ()  # type: ignore[attr-defined]
        healthy_throughout(healthy)
    assert refusals(server, "group.connect.max.leave.members") >= 3
    # at the limit, every named member is answered
    response = answer_of(hostile.leave_naming(DEFAULTS.max_leave_members),
                         server.kafka_port, wire.LEAVE_GROUP, 5)
    codes = {int(member.error_code) for member in response.members}  # type: ignore[attr-defined]
    assert len(response.members) == DEFAULTS.max_leave_members  # type: ignore[attr-defined]
    assert codes == {ErrorCode.UNKNOWN_MEMBER_ID}


def test_describe_groups_naming_more_groups_than_allowed_is_refused(
        server: ServerProcess) -> None:
    frame = hostile.describe_groups_naming(100_000)
    with HealthyMember(server.kafka_port) as healthy:
        for _ in range(3):
            response = answer_of(frame, server.kafka_port, wire.DESCRIBE_GROUPS, 5)
            groups = response.groups  # type: ignore[attr-defined]
            assert [int(group.error_code) for group in groups] == [ErrorCode.INVALID_REQUEST]
        healthy_throughout(healthy)
    assert refusals(server, "group.connect.max.describe.groups") >= 3


def test_find_coordinator_naming_more_keys_than_allowed_is_refused(
        server: ServerProcess) -> None:
    frame = hostile.find_coordinators_naming(100_000)
    with HealthyMember(server.kafka_port) as healthy:
        for _ in range(3):
            response = answer_of(frame, server.kafka_port, wire.FIND_COORDINATOR, 4)
            (refused,) = response.coordinators  # type: ignore[attr-defined]
            assert refused.error_code == ErrorCode.INVALID_REQUEST
            assert "group.connect.max.find.coordinator.keys" in refused.error_message
        healthy_throughout(healthy)
    fits = DEFAULTS.max_find_coordinator_keys
    response = answer_of(hostile.find_coordinators_naming(fits), server.kafka_port,
                         wire.FIND_COORDINATOR, 4)
    assert len(response.coordinators) == fits  # type: ignore[attr-defined]


def test_list_groups_with_more_filters_than_allowed_is_refused(server: ServerProcess) -> None:
    states = tuple(f"state-{index}" for index in range(DEFAULTS.max_list_filters + 1))
    frame = hostile.classic_frame(wire.LIST_GROUPS, 5, states_filter=states,
                                  types_filter=("classic",))
    response = answer_of(frame, server.kafka_port, wire.LIST_GROUPS, 5)
    assert response.error_code == ErrorCode.INVALID_REQUEST  # type: ignore[attr-defined]
    assert refusals(server, "group.connect.max.list.filters") >= 1
    assert alive(server)


# -- answers bounded by the frame limit ----------------------------------------------------

SMALL_FRAME = 256 * 1024


@pytest.fixture(scope="module")
def small_frames(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    settings = [f"server.max.frame.bytes={SMALL_FRAME}", "group.initial.rebalance.delay.ms=0"]
    with running_server(tmp_path_factory.mktemp("small-frames"), settings) as process:
        yield process


def test_describe_groups_whose_answer_would_not_fit_in_a_frame_is_refused(
        small_frames: ServerProcess) -> None:
    # A member whose protocol metadata is 100 KB: described three times over, 300 KB.
    from protocol import classic as wire
    protocol = hostile.classic_body(wire.JOIN_GROUP, 3, "JoinGroupRequestProtocol",
                                    name="sessioned", metadata=b"x" * 100_000)
    join = hostile.classic_frame(wire.JOIN_GROUP, 3, group_id="wide", member_id="",
                                 protocol_type="connect", session_timeout=30_000,
                                 rebalance_timeout=30_000, protocols=(protocol,))
    joined = answer_of(join, small_frames.kafka_port, wire.JOIN_GROUP, 3)
    assert joined.error_code == ErrorCode.NONE  # type: ignore[attr-defined]
    once = answer_of(hostile.classic_frame(wire.DESCRIBE_GROUPS, 5, groups=("wide",)),
                     small_frames.kafka_port, wire.DESCRIBE_GROUPS, 5)
    assert once.groups[0].members[0].member_metadata == b"x" * 100_000  # type: ignore[attr-defined]
    thrice = answer_of(hostile.classic_frame(wire.DESCRIBE_GROUPS, 5, groups=("wide",) * 3),
                       small_frames.kafka_port, wire.DESCRIBE_GROUPS, 5)
    codes = [int(group.error_code) for group in thrice.groups]  # type: ignore[attr-defined]
    assert codes == [ErrorCode.INVALID_REQUEST] * 3
    assert refusals(small_frames, "server.max.frame.bytes") >= 1
    assert alive(small_frames)


def test_list_groups_whose_answer_would_not_fit_in_a_frame_is_refused(
        small_frames: ServerProcess) -> None:
    # 1,100 groups of 240-byte ids list in more than 256 KB.
    with RawConnection(small_frames.kafka_port) as connection:
        for index in range(1_100):
            request = hostile.heartbeat(f"{index:0>240}", "m")
            response = connection.ask(hostile.request_frame(hostile.HEARTBEAT, request,
                                                            index), hostile.HEARTBEAT)
            assert response.error_code == 0
    frame = hostile.classic_frame(wire.LIST_GROUPS, 5)
    response = answer_of(frame, small_frames.kafka_port, wire.LIST_GROUPS, 5)
    assert response.error_code == ErrorCode.INVALID_REQUEST  # type: ignore[attr-defined]
    assert response.groups == ()  # type: ignore[attr-defined]
    # filtered down, the answer fits
    frame = hostile.classic_frame(wire.LIST_GROUPS, 5, types_filter=("classic",))
    response = answer_of(frame, small_frames.kafka_port, wire.LIST_GROUPS, 5)
    assert response.error_code == ErrorCode.NONE  # type: ignore[attr-defined]


def test_the_default_limits_fit_their_answers_in_a_frame() -> None:
    """At the defaults, the largest answer a lookup or a leave may need (ids of the
    longest allowed, a host name as long) fits in a frame with room to spare."""
    entry = 2 * DEFAULTS.max_id_bytes + 64
    for count in (DEFAULTS.max_find_coordinator_keys, DEFAULTS.max_leave_members,
                  DEFAULTS.max_metadata_topics):
        assert count * entry < DEFAULTS.max_frame_bytes // 4


def test_leave_members_at_the_limit_of_a_real_group(tmp_path: Path) -> None:
    """The limit is a configuration key like the others."""
    with running_server(tmp_path, ["group.connect.max.leave.members=2"]) as process:
        response = answer_of(hostile.leave_naming(3), process.kafka_port,
                             wire.LEAVE_GROUP, 5)
        assert response.error_code == ErrorCode.INVALID_REQUEST  # type: ignore[attr-defined]
        response = answer_of(hostile.leave_naming(2), process.kafka_port,
                             wire.LEAVE_GROUP, 5)
        assert len(response.members) == 2  # type: ignore[attr-defined]
