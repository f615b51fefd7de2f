"""SIGKILL the `serve` process and restart it on the same data dir: nothing is lost, and
the workers carry on with their epochs, without rejoining and without a rebalance."""

from __future__ import annotations

from pathlib import Path

from protocol.errors import ErrorCode
from tests.core.context import wire_units

from .helpers import ServerProcess, Worker, describe, settle

SETTINGS = ["group.connect.assignment.interval.ms=0",
            "group.connect.session.timeout.ms=600000",
            "group.connect.server.assignors=balanced"]

async def test_restart_after_sigkill_keeps_epochs_and_assignments(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", tmp_path, SETTINGS)
    await server.start()
    try:
        for name, tasks in (("source", 3), ("sink", 2)):
            status, reply = await server.http("PUT", f"/groups/g/connectors/{name}",
                                              {"tasks": tasks})
            assert status == 200, reply
        workers = [Worker("w1"), Worker("w2")]
        async with await server.client() as client:
            before = await settle(client, workers)
        assert before.group_epoch >= 2
        assert all(wire_units(m.assigned) for m in before.members)
        epochs = {w.member_id: w.epoch for w in workers}
        owned = {w.member_id: w.owned for w in workers}
    finally:
        server.kill()

    await server.start()
    try:
        assert any(e.get("event") == "log_loaded" and e["members"] == 2 for e in server.events())
        async with await server.client() as client:
            after = await describe(client, "g")
            assert after == before
            for worker in workers:
                code = await worker.heartbeat(client)
                assert code == ErrorCode.NONE
                assert worker.epoch == epochs[worker.member_id]
                assert worker.owned == owned[worker.member_id]
            again = await describe(client, "g")
        assert again.group_epoch == before.group_epoch
        assert again.assignment_epoch == before.assignment_epoch
        assert again == before
        # The restarted server logs no new group epoch for the group.
        assert not [e for e in server.events() if e.get("event") == "group_epoch_bumped"]
    finally:
        server.kill()
