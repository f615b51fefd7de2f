"""The proxy's sans-IO part, without sockets: routing, address rewriting, ApiVersions."""

from __future__ import annotations

import random
import struct
from datetime import timedelta

import pytest
from kio.schema.api_versions.v3.response import ApiVersion, ApiVersionsResponse
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.schema.find_coordinator.v3.request import FindCoordinatorRequest as FindV3
from kio.schema.find_coordinator.v6.request import FindCoordinatorRequest as FindV6
from kio.schema.find_coordinator.v6.response import Coordinator as CoordinatorV6
from kio.schema.find_coordinator.v6.response import FindCoordinatorResponse as FoundV6
from kio.schema.join_group.v9.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.list_groups.v4.response import ListedGroup as ListedV4
from kio.schema.list_groups.v4.response import ListGroupsResponse as ListedGroupsV4
from kio.schema.list_groups.v5.request import ListGroupsRequest as ListV5
from kio.schema.list_groups.v5.response import ListedGroup as ListedV5
from kio.schema.list_groups.v5.response import ListGroupsResponse as ListedGroupsV5
from kio.schema.metadata.v12.response import MetadataResponse, MetadataResponseBroker
from kio.schema.produce.v3.request import ProduceRequest as ProduceV3
from kio.schema.produce.v9.request import ProduceRequest as ProduceV9
from kio.static.primitive import i8, i16, i32, i32Timedelta

from coordinator.proxy import wire
from coordinator.proxy.wire import Action
from protocol.framing import SUPPORTED_APIS, MalformedRequest

OWNED = wire.GroupMatcher("connect-.*")
COORDINATOR = wire.Endpoint(2_000_000_000, "proxy.local", 19092)
NO_THROTTLE = i32Timedelta.parse(timedelta(0))


def frame_of(api_key: int, version: int, body: object, correlation: int = 7) -> bytes:
    """A request as the proxy's reader sees it: without the size prefix."""
    return wire.encode_request(api_key, version, correlation, body)[4:]


def local_address(node_id: int) -> tuple[str, int]:
    return "proxy.local", 19092 + 1 + node_id


@pytest.mark.parametrize(("produce", "version"), [(ProduceV3, 3), (ProduceV9, 9)])
@pytest.mark.parametrize(("acks", "transactional_id"), [(0, None), (1, None), (-1, "tx-1")])
def test_produce_with_acks_zero_expects_no_response(produce: type, version: int, acks: int,
                                                    transactional_id: str | None) -> None:
    body = produce(transactional_id=transactional_id, acks=i16(acks),
                   timeout=i32Timedelta.parse(timedelta(seconds=1)),
                   topic_data=())
    routing = wire.classify(frame_of(wire.PRODUCE, version, body), OWNED)
    assert routing.action is Action.FORWARD
    assert routing.expects_response is (acks != 0)
    assert not routing.rewrite


def _join(group: str) -> JoinGroupRequest:
    return JoinGroupRequest(group_id=group, session_timeout=i32Timedelta.parse(
        timedelta(seconds=10)), rebalance_timeout=i32Timedelta.parse(
        timedelta(seconds=60)), member_id="", group_instance_id=None,
        protocol_type="connect", protocols=(JoinGroupRequestProtocol(
            name="sessioned", metadata=b"\x00"),), reason=None)


def test_group_apis_of_owned_groups_are_local_others_forwarded() -> None:
    assert wire.classify(frame_of(wire.JOIN_GROUP, 9, _join("connect-a")),
                         OWNED).action is Action.LOCAL
    forwarded = wire.classify(frame_of(wire.JOIN_GROUP, 9, _join("other")), OWNED)
    assert forwarded.action is Action.FORWARD and not forwarded.rewrite


def test_the_group_pattern_matches_whole_ids() -> None:
    assert OWNED("connect-a") and not OWNED("my-connect-a")


def test_find_coordinator_all_owned_is_local_mixed_is_forwarded_with_owned_keys() -> None:
    owned = wire.classify(frame_of(wire.FIND_COORDINATOR, 6, FindV6(
        key_type=i8(0), coordinator_keys=("connect-a", "connect-b"))), OWNED)
    assert owned.action is Action.FIND_COORDINATOR
    assert owned.coordinator_keys == ("connect-a", "connect-b")
    mixed = wire.classify(frame_of(wire.FIND_COORDINATOR, 6, FindV6(
        key_type=i8(0), coordinator_keys=("connect-a", "other"))), OWNED)
    assert (mixed.action, mixed.rewrite, mixed.owned_keys) == (
        Action.FORWARD, True, frozenset({"connect-a"}))
    # A transaction id that happens to match the pattern is not a group.
    transactional = wire.classify(frame_of(wire.FIND_COORDINATOR, 3, FindV3(
        key="connect-a", key_type=i8(1))), OWNED)
    assert transactional.action is Action.FORWARD and not transactional.owned_keys


def test_a_truncated_header_is_malformed() -> None:
    with pytest.raises(MalformedRequest):
        wire.classify(b"\x00\x03\x00", OWNED)


def test_metadata_brokers_are_rewritten_and_the_upstream_port_is_gone() -> None:
    body = MetadataResponse(
        throttle_time=NO_THROTTLE, cluster_id="c", controller_id=i32(1), topics=(),
        brokers=(MetadataResponseBroker(node_id=i32(1), host="kafka-1.internal",
                                        port=i32(9092), rack=None),
                 MetadataResponseBroker(node_id=i32(2), host="kafka-2.internal",
                                        port=i32(9093), rack="r2")))
    assert [(e.node_id, e.host, e.port) for e in wire.endpoints(wire.METADATA, 12, body)] == [
        (1, "kafka-1.internal", 9092), (2, "kafka-2.internal", 9093)]
    rewritten = wire.rewrite(wire.METADATA, 12, body, local_address, COORDINATOR)
    framed = wire.encode_response(wire.METADATA, 12, 5, rewritten)
    assert b"kafka-1.internal" not in framed and struct.pack(">i", 9092) not in framed
    correlation, decoded = wire.decode_response(framed[4:], wire.METADATA, 12)
    assert correlation == 5
    assert [(b.node_id, b.host, b.port, b.rack) for b in decoded.brokers] == [
        (1, "proxy.local", 19094, None), (2, "proxy.local", 19095, "r2")]


def test_find_coordinator_answers_owned_keys_with_the_coordinator() -> None:
    upstream = FoundV6(throttle_time=NO_THROTTLE, coordinators=(
        CoordinatorV6(key="connect-a", node_id=i32(1), host="kafka-1", port=i32(9092),
                      error_code=KioErrorCode.none, error_message=None),
        CoordinatorV6(key="other", node_id=i32(1), host="kafka-1", port=i32(9092),
                      error_code=KioErrorCode.none, error_message=None),
        CoordinatorV6(key="loading", node_id=i32(-1), host="", port=i32(-1),
                      error_code=KioErrorCode.coordinator_load_in_progress,
                      error_message="later")))
    rewritten = wire.rewrite(wire.FIND_COORDINATOR, 6, upstream, local_address, COORDINATOR,
                             frozenset({"connect-a"}))
    assert [(c.key, c.node_id, c.host, c.port, c.error_code) for c in rewritten.coordinators] \
        == [("connect-a", 2_000_000_000, "proxy.local", 19092, KioErrorCode.none),
            ("other", 1, "proxy.local", 19094, KioErrorCode.none),
            ("loading", -1, "", -1, KioErrorCode.coordinator_load_in_progress)]


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4, 5, 6])
def test_local_find_coordinator_answers_in_every_version(version: int) -> None:
    framed = wire.find_coordinator_answer(version, 9, ["connect-a"], COORDINATOR)
    correlation, body = wire.decode_response(framed[4:], wire.FIND_COORDINATOR, version)
    entry = body.coordinators[0] if version >= 4 else body
    assert (correlation, entry.node_id, entry.host, entry.port) == (
        9, 2_000_000_000, "proxy.local", 19092)
    failed = wire.find_coordinator_answer(version, 9, ["x"], COORDINATOR,
                                          error_code=15, error_message="down")
    _, body = wire.decode_response(failed[4:], wire.FIND_COORDINATOR, version)
    entry = body.coordinators[0] if version >= 4 else body
    assert (entry.error_code, entry.node_id) == (KioErrorCode.coordinator_not_available, -1)


def test_api_versions_keep_what_the_proxy_can_relay_and_add_its_own() -> None:
    def entry(key: int, low: int, high: int) -> ApiVersion:
        return ApiVersion(api_key=i16(key), min_version=i16(low), max_version=i16(high))

    upstream = ApiVersionsResponse(
        error_code=KioErrorCode.none, throttle_time=NO_THROTTLE, api_keys=(
            entry(wire.PRODUCE, 3, 13), entry(wire.FETCH, 4, 18), entry(wire.METADATA, 0, 99),
            entry(wire.API_VERSIONS, 0, 9), entry(wire.JOIN_GROUP, 0, 9),
            entry(wire.SHARE_FETCH, 0, 1), entry(wire.DESCRIBE_QUORUM, 0, 2),
            entry(wire.DESCRIBE_CLUSTER, 0, 2),
            entry(9999, 0, 1)))
    result = wire.intersect_api_versions(upstream, SUPPORTED_APIS)
    ranges = {int(e.api_key): (int(e.min_version), int(e.max_version))
              for e in result.api_keys}
    assert ranges[wire.PRODUCE] == (3, 9)
    assert ranges[wire.FETCH] == (4, 15)
    assert ranges[wire.DESCRIBE_CLUSTER] == (0, 1)  # v2 may list controllers
    assert ranges[wire.METADATA] == (0, wire.known_versions(wire.METADATA)[1])
    assert ranges[wire.API_VERSIONS] == (0, 4)
    assert ranges[wire.JOIN_GROUP] == (0, 9)
    for dropped in (wire.SHARE_FETCH, wire.DESCRIBE_QUORUM, 9999):
        assert dropped not in ranges
    for key in wire.CONNECT_GROUP_APIS:
        assert ranges[key] == SUPPORTED_APIS[key]
    # Once the coordinator serves a group API itself, clients get versions both serve.
    capped = wire.intersect_api_versions(upstream, {**SUPPORTED_APIS, wire.JOIN_GROUP: (0, 5)},
                                         local_group_apis={wire.JOIN_GROUP})
    assert {int(e.api_key): int(e.max_version) for e in capped.api_keys}[wire.JOIN_GROUP] == 5


def test_an_owned_group_api_without_a_local_handler_gets_an_error_in_its_own_shape() -> None:
    framed = wire.error_answer(wire.JOIN_GROUP, 9, 3, 35, "not served")
    assert framed is not None
    correlation, body = wire.decode_response(framed[4:], wire.JOIN_GROUP, 9)
    assert (correlation, body.error_code) == (3, KioErrorCode.unsupported_version)
    # Metadata has no top-level error code: no such answer (the connection closes).
    assert wire.error_answer(wire.METADATA, 12, 3, 35, "x") is None


def test_a_find_coordinator_version_beyond_the_offered_ones_is_refused_locally() -> None:
    # (answered UNSUPPORTED_VERSION by the proxy, not forwarded, not a close)
    frame = bytearray(frame_of(wire.FIND_COORDINATOR, 6, FindV6(
        key_type=i8(0), coordinator_keys=("connect-a",))))
    frame[2:4] = struct.pack(">h", 99)  # a version nobody offered
    assert wire.classify(bytes(frame), OWNED).action is Action.LOCAL


def test_list_groups_is_the_upstreams_list_with_the_owned_groups_ours() -> None:
    request = ListV5(states_filter=(), types_filter=())
    routing = wire.classify(frame_of(wire.LIST_GROUPS, 5, request), OWNED)
    assert routing.action is Action.FORWARD and routing.rewrite
    assert routing.request is not None and routing.request.body == request
    upstream = ListedGroupsV5(throttle_time=NO_THROTTLE, error_code=KioErrorCode.none,
                              groups=(
        ListedV5(group_id="sink-consumers", protocol_type="consumer", group_state="Stable",
                 group_type="classic"),
        # A stale entry of an owned group (it lived on the broker once): not the live one.
        ListedV5(group_id="connect-a", protocol_type="connect", group_state="Empty",
                 group_type="classic")))
    local = [wire.LocalGroup("connect-a", "connect", "Stable", "classic"),
             wire.LocalGroup("connect-b", "connect", "PreparingRebalance", "connect"),
             wire.LocalGroup("elsewhere", "connect", "Stable", "classic")]  # not owned
    merged = wire.merge_listed_groups(upstream, request, local, OWNED)
    assert [(g.group_id, g.group_state, g.group_type) for g in merged.groups] == [
        ("connect-a", "Stable", "classic"), ("connect-b", "PreparingRebalance", "connect"),
        ("sink-consumers", "Stable", "classic")]
    # The request's filters apply to the coordinator's groups too (states from v4 on).
    stable_only = ListV5(states_filter=("Stable",), types_filter=("classic",))
    merged = wire.merge_listed_groups(upstream, stable_only, local, OWNED)
    assert [g.group_id for g in merged.groups] == ["connect-a", "sink-consumers"]
    older = ListedGroupsV4(throttle_time=NO_THROTTLE, error_code=KioErrorCode.none,
                           groups=(ListedV4(group_id="x", protocol_type="consumer",
                                            group_state="Stable"),))
    merged = wire.merge_listed_groups(older, None, local, OWNED)
    assert [g.group_id for g in merged.groups] == ["connect-a", "connect-b", "x"]
    assert not hasattr(merged.groups[0], "group_type")


# -- cutting request frames ------------------------------------------------------------------


def _framed(payloads: list[bytes]) -> list[bytes]:
    return [struct.pack(">i", len(payload)) + payload for payload in payloads]


def test_frames_whole_in_one_read_are_views_of_that_read() -> None:
    frames = _framed([b"a" * 10, b"", b"b" * 300])
    data = b"".join(frames)
    cutter = wire.FrameCutter(1024)
    cut = cutter.cut(data)
    assert [bytes(frame) for frame in cut] == frames
    assert all(frame.obj is data for frame in cut)  # no copy
    assert cutter.buffered_bytes == 0


@pytest.mark.parametrize("case", range(20))
def test_frames_cut_anywhere_across_reads_come_out_whole_and_in_order(case: int) -> None:
    rng = random.Random(case)
    frames = _framed([rng.randbytes(rng.choice((0, 1, 3, 50, 5000, 70_000)))
                      for _ in range(12)])
    stream = b"".join(frames)
    cuts = sorted(rng.sample(range(1, len(stream)), rng.randrange(1, 40)))
    cutter = wire.FrameCutter(100_000)
    out: list[bytes] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        out += [bytes(frame) for frame in cutter.cut(stream[start:end])]
    assert out == frames
    assert cutter.buffered_bytes == 0 and cutter.error is None


@pytest.mark.parametrize("size", [-1, 1025])
def test_a_bad_size_prefix_keeps_the_frames_before_it_and_ends_the_stream(size: int) -> None:
    good = _framed([b"x" * 5])
    cutter = wire.FrameCutter(1024)
    cut = cutter.cut(good[0] + struct.pack(">i", size) + b"rest")
    assert [bytes(frame) for frame in cut] == good
    assert cutter.error is not None
    with pytest.raises(type(cutter.error)):
        cutter.cut(good[0])


def test_produce_and_fetch_frames_classify_as_views() -> None:
    body = ProduceV9(transactional_id=None, acks=i16(1),
                     timeout=i32Timedelta.parse(timedelta(seconds=1)), topic_data=())
    framed = wire.encode_request(wire.PRODUCE, 9, 41, body)
    [frame] = wire.FrameCutter(1024).cut(framed)
    routing = wire.classify(frame[4:], OWNED)
    assert routing.head == wire.RequestHead(wire.PRODUCE, 9, 41)
    assert routing.action is Action.FORWARD and routing.expects_response
    # A request the proxy must read is decoded from a view as well.
    [find] = wire.FrameCutter(1024).cut(wire.encode_request(
        wire.FIND_COORDINATOR, 6, 42, FindV6(key_type=i8(0), coordinator_keys=("connect-a",))))
    assert wire.classify(find[4:], OWNED).action is Action.FIND_COORDINATOR


def test_the_requests_read_here_are_walked_first_and_held_to_the_listeners_limits() -> None:
    from coordinator.config import ServerConfig
    from coordinator.server.limits import decode_limits
    from protocol.framing import MalformedBody, RequestOverLimit
    from tests.interop.test_proxy_hostile import (
        find_coordinator_with_unknown_tag,
        huge_find_coordinator,
        huge_join_group,
        huge_list_groups,
    )

    limits = decode_limits(ServerConfig(max_id_bytes=16))
    for hostile in (huge_find_coordinator, huge_list_groups, huge_join_group):
        with pytest.raises(MalformedBody, match="declared"):
            wire.classify(hostile()[4:], OWNED, limits)
    # An unknown tagged field is skipped.
    routing = wire.classify(find_coordinator_with_unknown_tag("connect-a")[4:], OWNED, limits)
    assert routing.action is Action.FIND_COORDINATOR
    assert routing.coordinator_keys == ("connect-a",)
    # An owned group's request is decoded once, here, and handed on decoded.
    routing = wire.classify(frame_of(wire.JOIN_GROUP, 9, _join("connect-a")), OWNED, limits)
    assert routing.action is Action.LOCAL and routing.request is not None
    assert routing.request.body.group_id == "connect-a"
    # The limits the listener applies apply here too.
    with pytest.raises(RequestOverLimit, match="group.connect.max.id.bytes"):
        wire.classify(frame_of(wire.JOIN_GROUP, 9, _join("connect-" + "a" * 20)), OWNED,
                      limits)


@pytest.mark.parametrize(("api_key", "version"), [(wire.DESCRIBE_QUORUM, 0),
                                                  (wire.DESCRIBE_QUORUM, 2), (17, 0), (17, 1)])
def test_describe_quorum_and_sasl_are_refused_here(api_key: int, version: int) -> None:
    head = wire.RequestHead(api_key, version, 12)
    frame = struct.pack(">hhih", api_key, version, 12, -1) + b"\x00" * 8
    assert wire.classify(frame, OWNED).action is Action.REFUSE
    answer, reason = wire.refusal(head)
    assert answer is not None and reason
    correlation, body = wire.decode_response(answer[4:], api_key, version)
    assert correlation == 12
    assert body.error_code in (KioErrorCode.unsupported_version,
                               KioErrorCode.unsupported_sasl_mechanism)
