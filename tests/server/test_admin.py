"""The admin HTTP API: routes, bad input (4xx with a JSON reason, nothing changed), metrics."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from coordinator.client import KafkaClient
from coordinator.server.app import ServerHandle
from protocol.errors import ErrorCode
from protocol.messages import ConnectGroupDescribeRequest, ConnectGroupHeartbeatRequest
from tests.server.conftest import http


async def join(handle: ServerHandle, group: str, member: str, instance: str | None = None) -> Any:
    async with await KafkaClient.connect("127.0.0.1", handle.kafka_port) as client:
        return await client.request(1000, ConnectGroupHeartbeatRequest(
            group_id=group, member_id=member, member_epoch=0, instance_id=instance,
            worker_url=f"http://{member}:8083", rebalance_timeout_ms=30_000))


def assert_error_body(status: int, body: Any, expected_status: int) -> None:
    assert status == expected_status, body
    assert isinstance(body, dict) and set(body) >= {"error", "message"}, body
    assert body["message"]


async def test_health_and_readiness(server: ServerHandle) -> None:
    assert await http(server, "GET", "/healthz") == (200, {"status": "ok"})
    status, body = await http(server, "GET", "/readyz")
    assert status == 200


async def test_connector_lifecycle_and_group_view(server: ServerHandle) -> None:
    status, body = await http(server, "PUT", "/groups/g1/connectors/sink", {"tasks": 3})
    assert status == 200, body
    status, view = await http(server, "GET", "/groups/g1")
    assert status == 200
    assert view["group_id"] == "g1"
    assert view["state"] == "EMPTY"
    assert view["connectors_and_tasks"]["connectors"] == ["sink"]
    assert view["connectors_and_tasks"]["tasks"] == [
        {"connector": "sink", "task": task} for task in range(3)
    ]
    # nobody is in the group: every unit is unassigned
    assert view["unassigned"]["connectors"] == ["sink"]
    assert len(view["unassigned"]["tasks"]) == 3
    status, listing = await http(server, "GET", "/groups")
    assert status == 200
    assert [group["group_id"] for group in listing["groups"]] == ["g1"]
    epoch = view["group_epoch"]
    status, _ = await http(server, "PUT", "/groups/g1/connectors/sink", {"tasks": 5})
    assert status == 200
    assert (await http(server, "GET", "/groups/g1"))[1]["group_epoch"] == epoch + 1
    status, _ = await http(server, "DELETE", "/groups/g1/connectors/sink")
    assert status == 200
    assert (await http(server, "GET", "/groups/g1"))[1]["connectors_and_tasks"]["connectors"] == []
    status, _ = await http(server, "DELETE", "/groups/g1")
    assert status == 200
    status, body = await http(server, "GET", "/groups/g1")
    assert_error_body(status, body, 404)


async def test_unknown_group_and_connector(server: ServerHandle) -> None:
    status, body = await http(server, "GET", "/groups/missing")
    assert_error_body(status, body, 404)
    assert body["error"] == "GROUP_ID_NOT_FOUND"
    status, body = await http(server, "DELETE", "/groups/missing")
    assert_error_body(status, body, 404)
    await http(server, "PUT", "/groups/g/connectors/a", {"tasks": 1})
    status, body = await http(server, "DELETE", "/groups/g/connectors/nope")
    assert_error_body(status, body, 404)
    status, body = await http(server, "GET", "/no/such/route")
    assert_error_body(status, body, 404)



async def _refused_on_a_connector_of_two_tasks(server: ServerHandle, raw: bytes) -> Any:
    """PUT `raw` to connector a of group g (two tasks): a 400; the group as it was before."""
    await http(server, "PUT", "/groups/g/connectors/a", {"tasks": 2})
    before = (await http(server, "GET", "/groups/g"))[1]
    status, body = await http(server, "PUT", "/groups/g/connectors/a", raw=raw)
    assert_error_body(status, body, 400)
    return before

@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"{not json", "bad JSON"),
        (b"", "empty body"),
        (b'{"tasks": 3, "extra": 1}', "unknown field"),
        (b'{"task": 3}', "misspelt field"),
        (b'{"tasks": "3"}', "string"),
        (b'{"tasks": true}', "bool"),
        (b'{"tasks": 1.5}', "float"),
        (b'{"tasks": null}', "null"),
        (b'{"tasks": -1}', "negative"),
        (b'{"tasks": 100000001}', "too many"),
        (b"[1]", "not an object"),
    ],
)
async def test_bad_connector_bodies_change_nothing(
    server: ServerHandle, raw: bytes, why: str
) -> None:
    before = await _refused_on_a_connector_of_two_tasks(server, raw)
    status, body = await http(server, "PUT", "/groups/g/connectors/b", raw=raw)
    assert_error_body(status, body, 400)
    assert (await http(server, "GET", "/groups/g"))[1] == before, why
    # a bad body never creates a group either
    status, body = await http(server, "PUT", "/groups/fresh/connectors/a", raw=raw)
    assert status == 400
    assert (await http(server, "GET", "/groups/fresh"))[0] == 404


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"connect.session.timeout.ms": 20_000}, 200),
        ({"connect.session.timeout.ms": 5}, 400),  # below its minimum
        ({"connect.session.timeout.ms": "20000"}, 400),  # wrong type
        ({"connect.heartbeat.interval.ms": 60_000}, 400),  # not below the session timeout
        ({"no.such.key": 1}, 400),
        ({"connect.assignor.offload.enable": "yes"}, 400),
    ],
)
async def test_group_config(server: ServerHandle, body: dict[str, Any], status: int) -> None:
    await http(server, "PUT", "/groups/g/connectors/a", {"tasks": 1})
    before = (await http(server, "GET", "/groups/g"))[1]
    answer_status, answer = await http(server, "PUT", "/groups/g/config", body)
    if status == 200:
        assert answer_status == 200, answer
        view = (await http(server, "GET", "/groups/g"))[1]
        assert view["config"]["connect.session.timeout.ms"] == 20_000
    else:
        assert_error_body(answer_status, answer, 400)
        assert (await http(server, "GET", "/groups/g"))[1] == before


async def test_group_config_bad_json(server: ServerHandle) -> None:
    status, body = await http(server, "PUT", "/groups/g/config", raw=b"{")
    assert_error_body(status, body, 400)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"members": [{"instance_id": "i-1", "member_id": null, "x": 1}]}',
        b'{"members": [{"member_id": "m"}]}',
        b'{"members": "i-1"}',
        b'{"members": [{"instance_id": 7}]}',
        b'{"members": []}',
        b'{"member": []}',
        b"nope",
    ],
)
async def test_remove_members_bad_bodies(server: ServerHandle, raw: bytes) -> None:
    await http(server, "PUT", "/groups/g/connectors/a", {"tasks": 1})
    before = (await http(server, "GET", "/groups/g"))[1]
    status, body = await http(server, "POST", "/groups/g/members/remove", raw=raw)
    assert_error_body(status, body, 400)
    assert (await http(server, "GET", "/groups/g"))[1] == before


async def test_remove_static_members_answers_per_member(server: ServerHandle) -> None:
    await http(server, "PUT", "/groups/g/connectors/a", {"tasks": 2})
    joined = await join(server, "g", "m-1", instance="i-1")
    assert joined.error_code == 0, joined.error_message
    status, body = await http(server, "DELETE", "/groups/g")
    assert_error_body(status, body, 409)
    assert body["error"] == "NON_EMPTY_GROUP"
    status, body = await http(server, "POST", "/groups/g/members/remove", {"members": [
        {"instance_id": "i-1", "member_id": "someone-else"},
        {"instance_id": "i-unknown", "member_id": None},
    ]})
    assert status == 200, body
    codes = [member["error_code"] for member in body["members"]]
    assert codes == [ErrorCode.FENCED_INSTANCE_ID, ErrorCode.UNKNOWN_MEMBER_ID]
    assert len((await http(server, "GET", "/groups/g"))[1]["members"]) == 1
    status, body = await http(server, "POST", "/groups/g/members/remove",
                              {"members": [{"instance_id": "i-1", "member_id": None}]})
    assert status == 200, body
    assert body["members"][0]["error_code"] == 0
    assert (await http(server, "GET", "/groups/g"))[1]["members"] == []
    status, _ = await http(server, "DELETE", "/groups/g")
    assert status == 200


async def test_metrics_parse_and_count_requests(server: ServerHandle) -> None:
    async with await KafkaClient.connect("127.0.0.1", server.kafka_port) as client:
        for _ in range(3):
            await client.request(1003, ConnectGroupDescribeRequest(group_ids=("x",)))
    status, text = await http(server, "GET", "/metrics")
    assert status == 200
    families = {family.name: family for family in text_string_to_metric_families(text)}
    requests = families["connect_coordinator_requests"]
    counted = {
        (sample.labels["api"], sample.labels["error"]): sample.value
        for sample in requests.samples if sample.name.endswith("_total")
    }
    assert counted[("ConnectGroupDescribe", "NONE")] == 3
    for api in ("ApiVersions", "ConnectGroupHeartbeat", "ConnectGroupPrepareAssignment",
                "ConnectGroupInstallAssignment"):
        assert (api, "NONE") in counted  # created up front
    assert "connect_coordinator_request_duration_seconds" in families
    groups = families["connect_coordinator_groups"]
    assert {sample.labels["state"] for sample in groups.samples} >= {"EMPTY", "STABLE"}
    assert "connect_coordinator_members" in families
    assert "connect_coordinator_connections" in families
    assert "connect_coordinator_rejected_frames" in families


async def test_two_workers_reach_stable(server: ServerHandle) -> None:
    """The README walkthrough: connectors via the API, two workers, STABLE in describe."""
    await http(server, "PUT", "/groups/walk/connectors/source", {"tasks": 4})
    async with await KafkaClient.connect("127.0.0.1", server.kafka_port) as client:
        epochs: dict[str, int] = {}
        owned: dict[str, Any] = {}

        async def beat(member: str) -> None:
            response = await client.request(1000, ConnectGroupHeartbeatRequest(
                group_id="walk", member_id=member, member_epoch=epochs.get(member, 0),
                worker_url=f"http://{member}:8083" if member not in epochs else None,
                rebalance_timeout_ms=30_000 if member not in epochs else -1,
                owned_connectors_and_tasks=owned.get(member)))
            assert response.error_code == 0, response.error_message
            epochs[member] = response.member_epoch
            if response.assignment is not None:
                owned[member] = response.assignment.assigned

        with trio.fail_after(10):
            while True:
                for member in ("w1", "w2"):
                    await beat(member)
                status, view = await http(server, "GET", "/groups/walk")
                if view["state"] == "STABLE" and all(
                        m["state"] == "STABLE" for m in view["members"]) and \
                        len(view["members"]) == 2:
                    break
                await trio.sleep(0.05)
    assert view["unassigned"]["tasks"] == []
    assigned = sum(len(m["assigned"]["tasks"]) for m in view["members"])
    assert assigned == 4


async def test_group_config_shows_effective_values(server: ServerHandle) -> None:
    await http(server, "PUT", "/groups/g/connectors/a", {"tasks": 1})
    defaults = server.runtime.config
    status, answer = await http(server, "GET", "/groups/g/config")
    assert status == 200
    assert answer["config"]["connect.session.timeout.ms"] == -1  # no override
    assert answer["effective"]["connect.session.timeout.ms"] == defaults.session_timeout_ms
    assert answer["effective"]["scheduled.rebalance.max.delay.ms"] == \
        defaults.scheduled_rebalance_max_delay_ms
    await http(server, "PUT", "/groups/g/config", {"connect.session.timeout.ms": 20_000,
                                                   "connect.assignor.offload.enable": False})
    answer = (await http(server, "GET", "/groups/g/config"))[1]
    assert answer["effective"]["connect.session.timeout.ms"] == 20_000
    assert answer["effective"]["connect.assignor.offload.enable"] is False
    assert answer["effective"]["connect.heartbeat.interval.ms"] == defaults.heartbeat_interval_ms


async def test_a_groups_type_is_set_through_the_config_api(server: ServerHandle) -> None:
    key = "connect.classic.group.type"
    status, answer = await http(server, "PUT", "/groups/fresh/config", {key: "connect"})
    assert status == 200, answer
    assert (await http(server, "GET", "/groups/fresh/config"))[1]["effective"][key] == "connect"
    assert (await http(server, "GET", "/groups/fresh"))[1]["type"] == "connect"
    status, answer = await http(server, "PUT", "/groups/fresh/config", {key: "classic"})
    assert status == 200, answer
    assert (await http(server, "GET", "/groups/fresh"))[1]["type"] == "classic"
    # the type and the settings of a classic group, shown and set like a connect group's
    status, answer = await http(server, "PUT", "/groups/fresh/config",
                                {"connect.session.timeout.ms": 20_000})
    assert status == 200, answer
    assert (await http(server, "GET", "/groups/fresh"))[1]["type"] == "classic"
    shown = (await http(server, "GET", "/groups/fresh/config"))[1]
    assert (shown["config"][key], shown["config"]["connect.session.timeout.ms"]) == (
        "classic", 20_000)
    # connectors would be lost on a classic group: refused, saying why
    status, answer = await http(server, "PUT", "/groups/fresh/connectors/a", {"tasks": 1})
    assert_error_body(status, answer, 400)
    assert "classic" in answer["message"]
    # null: the server's type decides again (classic by default)
    status, answer = await http(server, "PUT", "/groups/fresh/config", {key: None})
    assert status == 200 and answer["config"][key] is None, answer
    assert (await http(server, "GET", "/groups/fresh/config"))[1]["effective"][key] == "classic"
    # a group with connectors keeps its type; the refusal says why
    await http(server, "PUT", "/groups/g/connectors/a", {"tasks": 1})
    status, answer = await http(server, "PUT", "/groups/g/config", {key: "classic"})
    assert_error_body(status, answer, 400)
    assert "connector" in answer["message"]
    status, answer = await http(server, "PUT", "/groups/g/config", {key: "eager"})
    assert_error_body(status, answer, 400)


async def test_connectors_are_listed_and_read_one_at_a_time(server: ServerHandle) -> None:
    await http(server, "PUT", "/groups/shaped/connectors/sink", {"tasks": 2})
    # A connector config as Connect's REST API takes it: tasks.max a string of digits,
    # the rest for the workers.
    status, body = await http(server, "PUT", "/groups/shaped/connectors/source", {
        "connector.class": "FileStreamSource", "tasks.max": "3", "topic": "t"})
    assert status == 200, body
    assert await http(server, "GET", "/groups/shaped/connectors") == (200, ["sink", "source"])
    response = await join(server, "shaped", "w1")
    assert response.error_code == 0
    owned = response.assignment.assigned
    mine = {(t.connector, t.task) for t in owned.tasks} | {(c, None) for c in owned.connectors}
    status, one = await http(server, "GET", "/groups/shaped/connectors/source")
    assert status == 200, one
    assert one["name"] == "source" and one["group"] == "shaped"
    assert one["config"] == {"tasks.max": "3"}
    assert [task["id"] for task in one["tasks"]] == [0, 1, 2]
    for runner, unit in [(one["connector"], ("source", None)),
                         *((task, ("source", task["id"])) for task in one["tasks"])]:
        # The one member runs what its heartbeat was given; the rest is unassigned.
        expected = ("w1", "http://w1:8083") if unit in mine else (None, None)
        assert (runner["member_id"], runner["worker_id"]) == expected, (unit, one)
    status, body = await http(server, "PUT", "/groups/shaped/connectors/source",
                              {"tasks.max": 5})
    assert status == 200, body
    status, one = await http(server, "GET", "/groups/shaped/connectors/source")
    assert one["config"] == {"tasks.max": "5"} and len(one["tasks"]) == 5


async def test_one_connector_or_the_list_of_a_group_not_there_is_a_404(
        server: ServerHandle) -> None:
    await http(server, "PUT", "/groups/there/connectors/a", {"tasks": 1})
    status, body = await http(server, "GET", "/groups/there/connectors/nope")
    assert_error_body(status, body, 404)
    assert body["error"] == "CONNECTOR_NOT_FOUND"
    for path in ("/groups/missing/connectors", "/groups/missing/connectors/a"):
        status, body = await http(server, "GET", path)
        assert_error_body(status, body, 404)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b'{"tasks.max": "three"}', "not a number"),
        (b'{"tasks.max": "-1"}', "negative"),
        (b'{"tasks.max": "1.5"}', "not whole"),
        (b'{"tasks.max": true}', "bool"),
        (b'{"tasks.max": null}', "null"),
        (b'{"tasks.max": "100000001"}', "too many"),
        (b'{"tasks.max": "2", "tasks": 2}', "both"),
        (b'{"connector.class": "X"}', "no task count"),
    ],
)
async def test_bad_connector_configs_change_nothing(
    server: ServerHandle, raw: bytes, why: str
) -> None:
    before = await _refused_on_a_connector_of_two_tasks(server, raw)
    assert (await http(server, "GET", "/groups/g"))[1] == before, why
