"""The hostile corpus and the mutations of tests/server/test_fuzz.py, through the proxy
listener with a real broker upstream, plus the requests only the proxy reads itself
(FindCoordinator, ListGroups, the group APIs of owned and other groups) and their
mutations.

After every case the process must still run and the attacker's connection must have been
answered or closed, and a healthy member of a connect group heartbeats on its own
connection: always answered without error (never evicted), at the median within 50 ms,
and never near a session timeout (the machine may be loaded; `bench hostile` measures
the latency properly).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterator
from typing import Any

import pytest
from kio.schema.describe_groups.v5.request import DescribeGroupsRequest
from kio.schema.find_coordinator.v3.request import FindCoordinatorRequest as FindV3
from kio.schema.find_coordinator.v6.request import FindCoordinatorRequest as FindV6
from kio.schema.heartbeat.v4.request import HeartbeatRequest
from kio.schema.join_group.v9.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.leave_group.v5.request import LeaveGroupRequest, MemberIdentity
from kio.schema.list_groups.v4.request import ListGroupsRequest as ListV4
from kio.schema.list_groups.v5.request import ListGroupsRequest as ListV5
from kio.schema.sync_group.v5.request import SyncGroupRequest
from kio.static.primitive import i8, i32, i32Timedelta

from coordinator.proxy import wire
from coordinator.realkafka import Broker
from tests.interop.test_proxy_hostile import (
    HOSTILE_FRAMES,
    Proxy,
    find_coordinator_with_unknown_tag,
    start_proxy,
)
from tests.server.test_fuzz import HEALTHY_LATENCY_S, Attacker, Healthy, corpus, mutate, seeds

MUTATIONS = 1_500


@pytest.fixture(scope="module")
def fuzzed(kafka_broker: Broker, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[Proxy, Healthy]]:
    proxy = start_proxy(tmp_path_factory.mktemp("proxy-fuzz"), kafka_broker.bootstrap,
                        "server.max.frame.bytes=1048576", "group.connect.max.owned.units=2000",
                        "group.connect.max.describe.groups=100")
    try:
        healthy = Healthy(proxy)  # type: ignore[arg-type]
        yield proxy, healthy
        healthy.connection.close()
        assert proxy.alive()
        assert "Traceback" not in proxy.output()
    finally:
        proxy.coordinator.stop()


def _ms(milliseconds: int) -> Any:
    from datetime import timedelta

    return i32Timedelta.parse(timedelta(milliseconds=milliseconds))


def proxy_seeds() -> list[bytes]:
    """Valid requests the proxy reads itself, framed: of owned groups and of others."""
    join = JoinGroupRequest(group_id="owned-fz", session_timeout=_ms(10_000),
                            rebalance_timeout=_ms(10_000), member_id="", group_instance_id=None,
                            protocol_type="consumer", reason=None, protocols=(
                                JoinGroupRequestProtocol(name="range", metadata=b"\x00\x01"),))
    bodies: list[tuple[int, int, Any]] = [
        (wire.FIND_COORDINATOR, 6, FindV6(key_type=i8(0), coordinator_keys=("owned-fz",))),
        (wire.FIND_COORDINATOR, 6, FindV6(key_type=i8(0),
                                          coordinator_keys=("owned-fz", "other-fz"))),
        (wire.FIND_COORDINATOR, 3, FindV3(key="owned-fz", key_type=i8(0))),
        (wire.LIST_GROUPS, 4, ListV4(states_filter=("Stable", "Empty"))),
        (wire.LIST_GROUPS, 5, ListV5(states_filter=(), types_filter=("classic",))),
        (wire.JOIN_GROUP, 9, join),
        (wire.SYNC_GROUP, 5, SyncGroupRequest(group_id="owned-fz", generation_id=i32(1),
                                              member_id="m", group_instance_id=None,
                                              protocol_type="consumer", protocol_name="range",
                                              assignments=())),
        (wire.HEARTBEAT, 4, HeartbeatRequest(group_id="owned-fz", generation_id=i32(1),
                                             member_id="m", group_instance_id=None)),
        (wire.LEAVE_GROUP, 5, LeaveGroupRequest(group_id="owned-fz", members=(
            MemberIdentity(member_id="m", group_instance_id=None, reason=None),))),
        (wire.DESCRIBE_GROUPS, 5, DescribeGroupsRequest(
            groups=("owned-fz", "owned-b"), include_authorized_operations=False)),
    ]
    return [wire.encode_request(key, version, 11, body) for key, version, body in bodies]


def test_the_corpus_through_the_proxy(fuzzed: tuple[Proxy, Healthy]) -> None:
    proxy, healthy = fuzzed
    frames = corpus() + [make() for make in HOSTILE_FRAMES.values()] + [
        find_coordinator_with_unknown_tag()]
    with Attacker(proxy) as attacker:  # type: ignore[arg-type]
        for frame in frames:
            attacker.send(frame)
            healthy.beat()
    assert statistics.median(healthy.latencies) < HEALTHY_LATENCY_S, healthy.latencies
    assert max(healthy.latencies) < 2.0


def test_mutated_requests_through_the_proxy(fuzzed: tuple[Proxy, Healthy]) -> None:
    proxy, healthy = fuzzed
    rng = random.Random(20261128)
    frames = seeds() + proxy_seeds()
    answered = closed = 0
    before = len(healthy.latencies)
    with Attacker(proxy) as attacker:  # type: ignore[arg-type]
        for _ in range(MUTATIONS):
            if attacker.send(mutate(rng.choice(frames), rng)) is None:
                closed += 1
            else:
                answered += 1
            healthy.beat()  # after every case
    latencies = healthy.latencies[before:]
    assert answered and closed  # both outcomes were reached
    assert statistics.median(latencies) < HEALTHY_LATENCY_S, latencies
    assert max(latencies) < 2.0  # nothing stalled the loop near a session timeout

