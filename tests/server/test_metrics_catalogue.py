"""The metrics catalogue, through the public surface: a real server on real TCP, workers
with the bundled client, and `GET /metrics` parsed with prometheus-client's own parser.

Each test drives the coordinator the way a worker or an operator would and checks that the
numbers move as README.md ("Metrics") says they do. `promtool check metrics` must find
nothing to complain about in a scrape of a server that has seen every kind of traffic.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from coordinator.client import KafkaClient
from coordinator.config import ServerConfig
from coordinator.core.result import ASSIGNMENT_MODES, REBALANCE_TRIGGERS
from coordinator.metrics import MEMBER_STATES, log_bytes_on_disk
from coordinator.server.app import ServerHandle, run_server
from protocol.errors import ErrorCode
from protocol.messages import ConnectGroupHeartbeatRequest
from tests.core.context import units
from tests.integration.helpers import Worker, settle
from tests.programs import require_binary

from .conftest import TEST_CONFIG, http
from .test_case_studies_tcp import ALL, G, compute
from .test_case_studies_tcp import heartbeat as ica_heartbeat
from .test_case_studies_tcp import join as ica_join

P = "connect_coordinator_"
Labels = dict[str, str]


class Scrape:
    """One parsed `GET /metrics`: sample name + labels -> value."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {family.name: family for family in text_string_to_metric_families(text)}
        self.samples: dict[str, list[tuple[Labels, float]]] = {}
        for family in self.families.values():
            for sample in family.samples:
                self.samples.setdefault(sample.name, []).append((sample.labels, sample.value))

    def value(self, name: str, **labels: str) -> float:
        """The value of the one sample `name` with exactly these labels."""
        matches = [value for have, value in self.samples.get(name, []) if have == labels]
        assert len(matches) == 1, (name, labels, self.samples.get(name))
        return matches[0]

    def series(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        return {tuple(sorted(labels.items())): value
                for labels, value in self.samples.get(name, [])}

    def by_label(self, name: str, label: str) -> dict[str, float]:
        return {labels[label]: value for labels, value in self.samples.get(name, [])}


async def scrape(handle: ServerHandle) -> Scrape:
    status, text = await http(handle, "GET", "/metrics")
    assert status == 200, text
    return Scrape(text)


async def start(nursery: trio.Nursery, config: ServerConfig = TEST_CONFIG,
                data_dir: Path | None = None) -> ServerHandle:
    handle: ServerHandle = await nursery.start(
        run_server, config, ("127.0.0.1", 0), ("127.0.0.1", 0), data_dir)
    return handle


@pytest.fixture
async def client(server: ServerHandle) -> AsyncIterator[KafkaClient]:
    async with await KafkaClient.connect("127.0.0.1", server.kafka_port) as connected:
        yield connected


async def put_connector(handle: ServerHandle, group: str, name: str, tasks: int) -> None:
    status, body = await http(handle, "PUT", f"/groups/{group}/connectors/{name}",
                              {"tasks": tasks})
    assert status == 200, body


async def wait_for(handle: ServerHandle, check: Callable[[Scrape], bool],
                   timeout_s: float = 10.0) -> Scrape:
    with trio.fail_after(timeout_s):
        while True:
            scraped = await scrape(handle)
            if check(scraped):
                return scraped
            await trio.sleep(0.05)


# ------------------------------------------------------------------------ rebalances


async def test_every_label_value_exists_before_any_traffic(server: ServerHandle) -> None:
    scraped = await scrape(server)
    assert scraped.by_label(P + "rebalances_total", "trigger") == dict.fromkeys(
        REBALANCE_TRIGGERS, 0.0)
    assert scraped.by_label(P + "target_assignments_installed_total", "mode") == dict.fromkeys(
        ASSIGNMENT_MODES, 0.0)
    assert scraped.by_label(P + "members", "state") == dict.fromkeys(MEMBER_STATES, 0.0)
    assert scraped.by_label(P + "log_compactions_total", "outcome") == {
        "ok": 0.0, "failed": 0.0, "skipped": 0.0}
    assert scraped.value(P + "time_to_stable_seconds_count") == 0
    assert scraped.value(P + "per_group_omitted_groups") == 0
    assert P + "group_epoch" in scraped.families  # declared, no series yet
    assert scraped.series(P + "group_epoch") == {}


async def test_join_rebalance_and_time_to_stable(server: ServerHandle,
                                                 client: KafkaClient) -> None:
    await put_connector(server, "g", "source", 3)
    scraped = await scrape(server)
    # The connector created the group and bumped its epoch; with no member there is no
    # rebalance to finish, so nothing is timed.
    assert scraped.value(P + "rebalances_total", trigger="connectors_changed") == 1
    assert scraped.value(P + "time_to_stable_seconds_count") == 0
    assert scraped.value(P + "target_assignments_installed_total", mode="server") == 0

    w1 = Worker("w1")
    await settle(client, [w1])
    scraped = await scrape(server)
    assert scraped.value(P + "rebalances_total", trigger="member_joined") == 1
    assert scraped.value(P + "target_assignments_installed_total", mode="server") == 1
    assert scraped.value(P + "target_assignments_installed_total", mode="client") == 0
    assert scraped.value(P + "time_to_stable_seconds_count") == 1
    assert scraped.value(P + "groups", state="STABLE") == 1
    assert scraped.value(P + "members", state="STABLE") == 1

    # A second worker: w1 must release half first, which takes a heartbeat round at least
    # 0.3 s later; the rebalance is timed from w2's join to the group being STABLE.
    w2 = Worker("w2")
    assert await w2.join(client) == ErrorCode.NONE
    await trio.sleep(0.3)
    await settle(client, [w1, w2])
    scraped = await scrape(server)
    assert scraped.value(P + "rebalances_total", trigger="member_joined") == 2
    assert scraped.value(P + "target_assignments_installed_total", mode="server") == 2
    assert scraped.value(P + "time_to_stable_seconds_count") == 2
    assert scraped.value(P + "time_to_stable_seconds_sum") >= 0.3
    assert scraped.value(P + "time_to_stable_seconds_bucket", le="0.25") <= 1
    assert scraped.value(P + "members", state="STABLE") == 2

    # Stable heartbeats change none of it.
    for _ in range(5):
        assert await w1.heartbeat(client) == ErrorCode.NONE
        assert await w2.heartbeat(client) == ErrorCode.NONE
    again = await scrape(server)
    for name in (P + "rebalances_total", P + "time_to_stable_seconds_count",
                 P + "target_assignments_installed_total"):
        assert again.series(name) == scraped.series(name), name

    # Both leave: two bumps; the emptied group finishes no rebalance, so no observation.
    for worker in (w1, w2):
        response = await client.request(1000, worker.leave_request())
        assert response.error_code == ErrorCode.NONE
    scraped = await scrape(server)
    assert scraped.value(P + "rebalances_total", trigger="member_left") == 2
    assert scraped.value(P + "time_to_stable_seconds_count") == 2
    assert scraped.value(P + "groups", state="EMPTY") == 1
    assert sum(scraped.by_label(P + "members", "state").values()) == 0


async def test_more_triggers(server: ServerHandle, client: KafkaClient) -> None:
    await put_connector(server, "g", "source", 1)
    static = Worker("w1")
    await settle(client, [static])

    # A heartbeat with a new worker URL changes the member's metadata.
    response = await client.request(1000, ConnectGroupHeartbeatRequest(
        group_id="g", member_id="w1", member_epoch=static.epoch,
        worker_url="http://moved:8083"))
    static.handle(response)
    await settle(client, [static])
    # A stale epoch fences the member (and it rejoins).
    response = await client.request(1000, ConnectGroupHeartbeatRequest(
        group_id="g", member_id="w1", member_epoch=static.epoch + 5))
    assert static.handle(response) == ErrorCode.FENCED_MEMBER_EPOCH
    await settle(client, [static])
    # A static member removed through the admin API.
    response = await client.request(1000, ConnectGroupHeartbeatRequest(
        group_id="g", member_id="s1", member_epoch=0, instance_id="i-1",
        worker_url="http://s1:8083", rebalance_timeout_ms=30_000))
    assert response.error_code == ErrorCode.NONE
    status, body = await http(server, "POST", "/groups/g/members/remove",
                              {"members": [{"instance_id": "i-1", "member_id": None}]})
    assert status == 200, body
    # A member that goes silent past its (per-group, short) session timeout.
    status, body = await http(server, "PUT", "/groups/g/config",
                              {"connect.session.timeout.ms": 1000,
                               "connect.heartbeat.interval.ms": 100})
    assert status == 200, body
    await settle(client, [static])
    silent = Worker("silent")
    assert await silent.join(client) == ErrorCode.NONE

    def timed_out(scraped: Scrape) -> bool:
        return scraped.value(P + "rebalances_total", trigger="session_timeout") == 1

    with trio.fail_after(10):
        while not timed_out(await scrape(server)):
            assert await static.heartbeat(client) == ErrorCode.NONE
            await trio.sleep(0.1)

    scraped = await scrape(server)
    counted = scraped.by_label(P + "rebalances_total", "trigger")
    assert counted == {
        **dict.fromkeys(REBALANCE_TRIGGERS, 0.0),
        "connectors_changed": 1.0,
        "member_joined": 4.0,  # w1, w1 again after the fence, s1, silent
        "metadata_changed": 1.0,
        "member_fenced": 1.0,
        "admin_removal": 1.0,
        "session_timeout": 1.0,
    }
    assert scraped.value(P + "timers_fired_total", kind="session") >= 1


async def test_client_side_assignment_counts_as_client_mode(server: ServerHandle,
                                                            client: KafkaClient) -> None:
    for name, tasks in (("A", 2), ("B", 1)):
        await put_connector(server, G, name, tasks)
    response = await ica_join(client, "W1")
    assert response.error_code == ErrorCode.COMPUTE_ASSIGNMENT
    epoch = await compute(client, "W1", 1, {"W1": ALL})
    response = await ica_heartbeat(client, "W1", 1, owned=frozenset())
    assert response.member_epoch == epoch
    scraped = await scrape(server)
    assert scraped.value(P + "target_assignments_installed_total", mode="client") == 1
    assert scraped.value(P + "target_assignments_installed_total", mode="server") == 0
    assert scraped.value(P + "time_to_stable_seconds_count") == 1


# ------------------------------------------------------------------------ member states


async def test_members_by_state_follow_reconciliation(server: ServerHandle,
                                                      client: KafkaClient) -> None:
    await put_connector(server, "g", "source", 3)
    w1, w2 = Worker("w1"), Worker("w2")
    await settle(client, [w1])
    assert await w2.join(client) == ErrorCode.NONE  # its part is still held by w1
    assert await w1.heartbeat(client) == ErrorCode.NONE  # told to release that part
    scraped = await scrape(server)
    assert scraped.by_label(P + "members", "state") == {
        "STABLE": 0, "UNREVOKED": 1, "UNRELEASED": 1, "UNKNOWN": 0}
    assert scraped.value(P + "groups", state="RECONCILING") == 1
    # Describe says the same.
    status, view = await http(server, "GET", "/groups/g")
    assert status == 200
    assert sorted(m["state"] for m in view["members"]) == ["UNRELEASED", "UNREVOKED"]
    await settle(client, [w1, w2])
    scraped = await scrape(server)
    assert scraped.by_label(P + "members", "state") == {
        "STABLE": 2, "UNREVOKED": 0, "UNRELEASED": 0, "UNKNOWN": 0}
    assert scraped.value(P + "groups", state="STABLE") == 1


# ------------------------------------------------------------------------ per-group gauges


async def test_per_group_gauges_capped_by_metrics_per_group_max(nursery: trio.Nursery) -> None:
    handle = await start(nursery, ServerConfig(
        assignment_interval_ms=0, assignor_offload_enable=False, metrics_per_group_max=2))
    for group, tasks in (("c", 1), ("a", 2), ("b", 3)):
        await put_connector(handle, group, "conn", tasks)
    async with await KafkaClient.connect("127.0.0.1", handle.kafka_port) as client:
        await settle(client, [Worker("w1", group_id="b")], group_id="b")
    scraped = await scrape(handle)
    # The first two group ids in sorted order; "c" is left out and counted.
    assert scraped.by_label(P + "group_units", "group") == {"a": 3, "b": 4}
    assert scraped.by_label(P + "group_members", "group") == {"a": 0, "b": 1}
    # Units in no member's target: all of them while a group has no member.
    assert scraped.by_label(P + "group_unassigned_units", "group") == {"a": 3, "b": 0}
    # Created at epoch 1, bumped by the connector: 2; b also by w1's join.
    assert scraped.by_label(P + "group_epoch", "group") == {"a": 2, "b": 3}
    assert scraped.by_label(P + "group_assignment_epoch", "group") == {"a": 1, "b": 3}
    assert scraped.value(P + "per_group_omitted_groups") == 1
    # Totals still cover every group.
    assert sum(scraped.by_label(P + "groups", "state").values()) == 3
    assert scraped.value(P + "unassigned_units") == 2 + 3  # c and a

    status, _ = await http(handle, "DELETE", "/groups/a")
    assert status == 200
    scraped = await scrape(handle)
    assert set(scraped.by_label(P + "group_epoch", "group")) == {"b", "c"}
    assert scraped.value(P + "per_group_omitted_groups") == 0
    handle.stop()


async def test_per_group_gauges_off(nursery: trio.Nursery) -> None:
    handle = await start(nursery, ServerConfig(
        assignment_interval_ms=0, assignor_offload_enable=False, metrics_per_group_max=0))
    await put_connector(handle, "a", "conn", 1)
    scraped = await scrape(handle)
    assert scraped.series(P + "group_epoch") == {}
    assert scraped.value(P + "per_group_omitted_groups") == 1
    handle.stop()


async def test_unassigned_units_left_out_by_a_client_assignor(server: ServerHandle,
                                                              client: KafkaClient) -> None:
    for name, tasks in (("A", 2), ("B", 1)):
        await put_connector(server, G, name, tasks)
    assert (await ica_join(client, "W1")).error_code == ErrorCode.COMPUTE_ASSIGNMENT
    left_out = units("B", "B-0")
    await compute(client, "W1", 1, {"W1": ALL - left_out})
    scraped = await scrape(server)
    assert scraped.value(P + "unassigned_units") == 2
    assert scraped.value(P + "group_unassigned_units", group=G) == 2
    assert scraped.value(P + "group_units", group=G) == len(ALL)


async def test_a_group_that_takes_its_units_from_installs_counts_them(
        server: ServerHandle, client: KafkaClient) -> None:
    # No connectors set through the admin API: the group runs what the install names.
    assert (await ica_join(client, "W1")).error_code == ErrorCode.COMPUTE_ASSIGNMENT
    await compute(client, "W1", 1, {"W1": units("X", "X-0", "X-1")}, known=frozenset())
    scraped = await scrape(server)
    assert scraped.value(P + "group_units", group=G) == 3
    assert scraped.value(P + "group_unassigned_units", group=G) == 0


async def test_unassigned_units_follow_every_change_between_scrapes(
        nursery: trio.Nursery) -> None:
    # A scrape counts a group's unassigned units again only when its connectors or target
    # changed since the last one: each kind of change must still show.
    handle = await start(nursery, ServerConfig(
        assignment_interval_ms=0, assignor_offload_enable=False))
    await put_connector(handle, "a", "conn", 2)
    assert (await scrape(handle)).value(P + "group_unassigned_units", group="a") == 3
    await put_connector(handle, "a", "conn", 4)  # the connectors changed
    assert (await scrape(handle)).value(P + "group_unassigned_units", group="a") == 5
    async with await KafkaClient.connect("127.0.0.1", handle.kafka_port) as client:
        await settle(client, [Worker("w1", group_id="a")], group_id="a")  # the target did
    scraped = await scrape(handle)
    assert scraped.value(P + "group_unassigned_units", group="a") == 0
    assert scraped.value(P + "group_units", group="a") == 5
    await put_connector(handle, "b", "conn", 1)
    assert (await scrape(handle)).value(P + "group_unassigned_units", group="b") == 2
    status, _ = await http(handle, "DELETE", "/groups/b")
    assert status == 200
    await put_connector(handle, "b", "other", 3)  # a new group, the same id
    scraped = await scrape(handle)
    assert scraped.value(P + "group_unassigned_units", group="b") == 4
    assert scraped.value(P + "unassigned_units") == 4
    handle.stop()


def test_a_scrape_does_not_count_an_unchanged_group_s_units_again() -> None:
    # Counting builds the union of every target part: a scrape of a STABLE group of 1,000
    # members and 50,000 tasks took 14.5 ms of the event loop with it, 3.0 without.
    from bench.core import stable_group
    from coordinator.metrics import Metrics

    core, now = stable_group(20, 5)
    counted: list[str] = []
    count_units = core.unassigned_units

    def counting(group_id: str) -> frozenset[tuple[str, int]]:
        counted.append(group_id)
        return count_units(group_id)

    core.unassigned_units = counting  # type: ignore[method-assign]
    metrics = Metrics(lambda: core)
    metrics.render()
    metrics.render()
    assert len(counted) == 1
    core.put_connector("bench", "source", 101, now + 1_000)  # a resize: counted again
    metrics.render()
    assert len(counted) == 2


# ------------------------------------------------------------------------ the log


async def test_log_metrics(nursery: trio.Nursery, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    handle = await start(nursery, ServerConfig(
        assignment_interval_ms=0, assignor_offload_enable=False,
        log_compaction_interval_ms=1_000), data_dir)
    before = await scrape(handle)
    await put_connector(handle, "g", "source", 3)
    await put_connector(handle, "g", "sink", 2)
    scraped = await scrape(handle)
    written = scraped.value(P + "records_written_total")
    assert written > before.value(P + "records_written_total")
    flushes = scraped.value(P + "log_fsync_seconds_count")
    assert flushes >= 1 and scraped.value(P + "log_append_seconds_count") == flushes
    assert scraped.value(P + "log_fsync_seconds_sum") > 0
    on_disk = sum(path.stat().st_size for path in data_dir.glob("*.log"))
    assert on_disk > 0
    assert scraped.value(P + "log_bytes") == on_disk == log_bytes_on_disk(data_dir)
    # One more change: one more flush, and the log grows.
    await put_connector(handle, "g", "sink", 4)
    scraped = await scrape(handle)
    assert scraped.value(P + "log_fsync_seconds_count") == flushes + 1
    assert scraped.value(P + "log_bytes") > on_disk
    # Periodic compaction runs (every second here) and is counted.
    scraped = await wait_for(
        handle, lambda s: s.value(P + "log_compactions_total", outcome="ok") >= 1)
    assert scraped.value(P + "log_compactions_total", outcome="failed") == 0
    handle.stop()


async def test_log_bytes_without_a_data_dir_is_zero(server: ServerHandle) -> None:
    assert (await scrape(server)).value(P + "log_bytes") == 0


# ------------------------------------------------------------------------ process, promtool


async def test_process_metrics(server: ServerHandle) -> None:
    scraped = await scrape(server)
    assert scraped.value("process_cpu_seconds_total") > 0
    assert scraped.value("process_resident_memory_bytes") > 10_000_000
    assert scraped.value("process_open_fds") > 0
    (info,) = scraped.samples["python_info"]
    assert info[1] == 1 and info[0]["implementation"] == "CPython"


async def test_promtool_accepts_a_real_scrape(nursery: trio.Nursery, tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    handle = await start(nursery, ServerConfig(
        assignment_interval_ms=0, assignor_offload_enable=True, metrics_per_group_max=1),
        tmp_path / "data")
    # Traffic of every kind, so histograms and labelled series have samples.
    await put_connector(handle, "g", "source", 3)
    await put_connector(handle, "other", "source", 1)
    async with await KafkaClient.connect("127.0.0.1", handle.kafka_port) as client:
        await settle(client, [Worker("w1"), Worker("w2")])
        await client.request(1000, ConnectGroupHeartbeatRequest(
            group_id="g", member_id="nobody", member_epoch=3))  # UNKNOWN_MEMBER_ID
    text = (await scrape(handle)).text
    assert 'connect_coordinator_assignor_run_seconds_bucket{assignor="balanced"' in text
    with trio.fail_after(60):
        result = await trio.run_process([promtool, "check", "metrics"], stdin=text.encode(),
                                        capture_stdout=True, capture_stderr=True, check=False)
    output = (result.stdout + result.stderr).decode()
    assert result.returncode == 0, output
    assert output.strip() == "", output  # no lint findings either
    handle.stop()
