"""`connect-coordinator groups`, shaped like kafka-consumer-groups.sh, run as a user runs it
against a real server with a worker in a group."""

from __future__ import annotations

import trio

from coordinator.client import KafkaClient
from coordinator.server.app import ServerHandle
from protocol.messages import ConnectGroupHeartbeatRequest
from tests.server.conftest import http
from tests.server.test_cli_errors import run_cli


def where(server: ServerHandle) -> list[str]:
    return ["--bootstrap-server", f"127.0.0.1:{server.kafka_port}",
            "--admin", f"http://127.0.0.1:{server.admin_port}"]


async def worker(server: ServerHandle, group: str, member: str,
                 task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """A minimal worker (as in the README) that heartbeats until cancelled; started once it
    runs what it was given."""
    async with await KafkaClient.connect("127.0.0.1", server.kafka_port) as client:
        epoch, owned, started = 0, None, False
        while True:
            response = await client.request(1000, ConnectGroupHeartbeatRequest(
                group_id=group, member_id=member, member_epoch=epoch,
                worker_url=f"http://{member}:8083" if epoch == 0 else None,
                rebalance_timeout_ms=30_000 if epoch == 0 else -1,
                owned_connectors_and_tasks=owned), api_version=0)
            assert response.error_code == 0, response
            epoch = response.member_epoch
            if response.assignment is not None:
                owned = response.assignment.assigned
                if not started and (owned.connectors or owned.tasks):
                    started = True
                    task_status.started()
            await trio.sleep(0.2)


async def test_groups_list_describe_and_delete(server: ServerHandle) -> None:
    async with trio.open_nursery() as nursery:
        await http(server, "PUT", "/groups/busy/connectors/source", {"tasks": 2})
        await nursery.start(worker, server, "busy", "worker-a")
        await http(server, "PUT", "/groups/idle/config", {})
        await check_groups(server)
        nursery.cancel_scope.cancel()


async def check_groups(server: ServerHandle) -> None:

    listed = await run_cli("groups", "--list", *where(server))
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.decode().split() == ["busy", "idle"]
    with_state = await run_cli("groups", "--list", "--state", *where(server))
    assert "busy" in with_state.stdout.decode()

    units = await run_cli("groups", "--describe", "--group", "busy", *where(server))
    assert units.returncode == 0, units.stderr
    lines = units.stdout.decode().splitlines()
    assert lines[0].split() == ["GROUP", "UNIT", "MEMBER-ID", "INSTANCE-ID", "WORKER-URL"]
    assert {line.split()[1] for line in lines[1:]} == {"source", "source-0", "source-1"}

    members = await run_cli("groups", "--describe", "--members", "--verbose",
                            "--group", "busy", *where(server))
    assert members.returncode == 0, members.stderr
    header, *rows = members.stdout.decode().splitlines()
    assert header.split()[-1] == "ASSIGNED" and len(rows) == 1
    assert rows[0].split()[1] == "worker-a" and "http://worker-a:8083" in rows[0]

    state = await run_cli("groups", "--describe", "--state", "--all-groups", *where(server))
    header, *rows = state.stdout.decode().splitlines()
    assert header.split()[:3] == ["GROUP", "TYPE", "STATE"]
    assert sorted(row.split()[0] for row in rows) == ["busy", "idle"]

    deleted = await run_cli("groups", "--delete", "--group", "idle", *where(server))
    assert deleted.returncode == 0, deleted.stderr
    assert "'idle'" in deleted.stdout.decode() and "successful" in deleted.stdout.decode()
    refused = await run_cli("groups", "--delete", "--group", "busy", *where(server))
    assert refused.returncode == 1
    assert "busy" in refused.stderr.decode() and len(refused.stderr.splitlines()) == 1
    listed = await run_cli("groups", "--list", *where(server))
    assert listed.stdout.decode().split() == ["busy"]


async def test_groups_against_nothing_says_so() -> None:
    with trio.fail_after(60):
        result = await run_cli("groups", "--list", "--admin", "http://127.0.0.1:9")
    assert result.returncode == 1
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1 and "cannot reach" in lines[0] and "--admin" in lines[0]


async def test_groups_changes_connectors_settings_and_members(server: ServerHandle) -> None:
    """The changes a user would otherwise make with curl, through the same command."""
    group = ["--group", "changed", *where(server)]
    added = await run_cli("groups", "--set-connector", "sink", "--tasks", "3", *group)
    assert added.returncode == 0, added.stderr
    assert (await http(server, "GET", "/groups/changed/connectors")) == (200, ["sink"])
    status, one = await http(server, "GET", "/groups/changed/connectors/sink")
    assert one["config"] == {"tasks.max": "3"}

    configured = await run_cli("groups", "--set-config", "connect.session.timeout.ms=20000",
                               "--set-config", "connect.heartbeat.interval.ms=2000", *group)
    assert configured.returncode == 0, configured.stderr
    status, config = await http(server, "GET", "/groups/changed/config")
    assert (config["config"]["connect.session.timeout.ms"],
            config["config"]["connect.heartbeat.interval.ms"]) == (20000, 2000)
    bad = await run_cli("groups", "--set-config", "connect.session.timout.ms=1", *group)
    assert bad.returncode == 1 and bad.stderr.decode().count("\n") == 1, bad.stderr
    assert "HTTP 400" in bad.stderr.decode()

    removed = await run_cli("groups", "--remove-member", "instance-1", *group)
    assert removed.returncode == 0, removed.stderr
    assert "instance-1" in removed.stdout.decode()

    deleted = await run_cli("groups", "--delete-connector", "sink", *group)
    assert deleted.returncode == 0, deleted.stderr
    assert (await http(server, "GET", "/groups/changed/connectors")) == (200, [])
    missing = await run_cli("groups", "--delete-connector", "sink", *group)
    assert missing.returncode == 1 and "no connector 'sink'" in missing.stderr.decode()

    for wrong in (["--set-connector", "sink"],  # no --tasks
                  ["--set-config", "no-equals-sign"]):
        refused = await run_cli("groups", *wrong, *group)
        assert refused.returncode == 2, refused.stderr
    two_groups = await run_cli("groups", "--delete-connector", "sink", "--group", "a",
                               "--group", "b", *where(server))
    assert two_groups.returncode == 2 and b"one group" in two_groups.stderr
