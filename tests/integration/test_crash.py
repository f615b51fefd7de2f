"""SIGKILL a real server at random moments while workers join, heartbeat, leave and get
assignments installed and connectors change; after each restart every acknowledged change
is there and no unit has two owners."""

from __future__ import annotations

import http.client
import random
from dataclasses import dataclass, field
from pathlib import Path

import trio

from protocol.errors import ErrorCode

from .helpers import HEARTBEAT, ServerProcess, Worker, connector_tasks, held_units

SEED = 848
ROUNDS = 4
# Acknowledged changes each round waits for before its kill, whatever the machine's speed
# (a busy machine may otherwise fill the round's random window with nothing).
ACKS_PER_ROUND = 20
SETTINGS = ["group.connect.assignment.interval.ms=0",
            "group.connect.session.timeout.ms=600000",
            "group.connect.server.assignors=balanced",
            "log.segment.bytes=4096"]
CONNECTORS = ["c1", "c2", "c3"]
# What a request sees when the server dies under it (an HTTP answer cut short included).
LOST = (OSError, ConnectionError, http.client.HTTPException, trio.BrokenResourceError,
        trio.ClosedResourceError)


@dataclass
class Expectation:
    """What must hold after a restart, from acknowledged changes only."""

    # connector -> task counts it may have (None: absent); one value unless a change was
    # in flight at the crash.
    connectors: dict[str, set[int | None]] = field(default_factory=dict)
    # member -> "present" | "absent" | "either"; acked member epochs (a floor).
    members: dict[str, str] = field(default_factory=dict)
    epochs: dict[str, int] = field(default_factory=dict)
    group_epoch: int = 0
    acks: int = 0  # acknowledged changes: each round waits for some before its kill
    floor: int = 0
    floor_reached: trio.Event = field(default_factory=trio.Event)

    def ack(self) -> None:
        self.acks += 1
        if self.acks >= self.floor:
            self.floor_reached.set()

    def wait_for(self, more: int) -> trio.Event:
        """An event set once `more` further changes are acknowledged."""
        self.floor, self.floor_reached = self.acks + more, trio.Event()
        return self.floor_reached


async def drive_worker(server: ServerProcess, worker: Worker, rng: random.Random,
                       expected: Expectation) -> None:
    """Heartbeat fast; now and then leave and rejoin. Acks update `expected`."""
    name = worker.member_id
    async with await server.client() as client:
        while True:
            if not worker.joined:
                previous = expected.members.get(name, "absent")
                expected.members[name] = "either"  # in flight
                response = await client.request(HEARTBEAT, worker.join_request())
                code = worker.handle(response)
                expected.members[name] = "present" if code == ErrorCode.NONE else previous
                if code == ErrorCode.NONE:
                    expected.ack()
            elif rng.random() < 0.03:
                expected.members[name] = "either"
                response = await client.request(HEARTBEAT, worker.leave_request())
                assert response.error_code == ErrorCode.NONE, response.error_message
                worker.joined, worker.epoch, worker.owned = False, 0, frozenset()
                expected.members[name] = "absent"
                expected.ack()
                expected.epochs.pop(name, None)
            else:
                code = await worker.heartbeat(client)
                assert code in (ErrorCode.NONE, ErrorCode.FENCED_MEMBER_EPOCH,
                                ErrorCode.COORDINATOR_NOT_AVAILABLE), \
                    (code, worker.last_response)
                if code == ErrorCode.FENCED_MEMBER_EPOCH:
                    expected.members[name] = "either"  # it rejoins next
            if worker.joined and expected.members.get(name) == "present":
                expected.epochs[name] = worker.epoch
            await trio.sleep(rng.uniform(0, 0.01))


async def drive_admin(server: ServerProcess, rng: random.Random,
                      expected: Expectation) -> None:
    while True:
        name = rng.choice(CONNECTORS)
        before = expected.connectors.get(name, {None})
        if rng.random() < 0.2:
            target: int | None = None
            method, path, body = "DELETE", f"/groups/g/connectors/{name}", None
        else:
            target = rng.randint(0, 4)
            method, path, body = "PUT", f"/groups/g/connectors/{name}", {"tasks": target}
        expected.connectors[name] = before | {target}  # in flight: either
        status, reply = await server.http(method, path, body)
        if 200 <= status < 300:
            expected.connectors[name] = {target}
            expected.ack()
            if isinstance(reply, dict) and "group_epoch" in reply:
                expected.group_epoch = max(expected.group_epoch, reply["group_epoch"])
        elif status == 404 and method == "DELETE":
            expected.connectors[name] = before & {None} or before
        else:
            expected.connectors[name] = before
            assert status == 503, (status, reply)
        await trio.sleep(rng.uniform(0, 0.02))


async def chaos_round(server: ServerProcess, workers: list[Worker], rng: random.Random,
                      expected: Expectation) -> None:
    """Run the drivers, SIGKILL the server at a random moment, wait for the drivers to see
    their connections die."""

    running = len(workers) + 1
    all_stopped = trio.Event()

    async def guarded(function: object, *args: object) -> None:
        nonlocal running
        try:
            await function(*args)  # type: ignore[operator]
        except LOST:
            pass  # the server died mid-request: the outcome stays "either"
        finally:
            running -= 1
            if running == 0:
                all_stopped.set()

    async with trio.open_nursery() as nursery:
        for worker in workers:
            nursery.start_soon(guarded, drive_worker, server, worker, rng, expected)
        nursery.start_soon(guarded, drive_admin, server, rng, expected)
        enough = expected.wait_for(ACKS_PER_ROUND)
        with trio.fail_after(120):
            await enough.wait()
        await trio.sleep(rng.uniform(0, 1.0))  # then a random moment
        server.kill()
        with trio.move_on_after(3):  # the drivers fail on their own; then stop the rest
            await all_stopped.wait()
        nursery.cancel_scope.cancel()


async def verify(server: ServerProcess, expected: Expectation) -> None:
    view = await server.group("g")
    tasks = connector_tasks(view)
    for name, possible in expected.connectors.items():
        assert tasks.get(name) in possible, (name, tasks.get(name), possible)
    present = {m["member_id"]: m for m in view["members"]}
    for name, status in expected.members.items():
        if status == "present":
            assert name in present, f"acknowledged member {name} is missing"
            assert present[name]["member_epoch"] >= expected.epochs.get(name, 0)
        elif status == "absent":
            assert name not in present, f"{name} left (acknowledged) but is back"
    assert view["group_epoch"] >= expected.group_epoch
    holders = held_units(view)
    assert all(len(owners) == 1 for owners in holders.values()), holders


async def test_sigkill_at_random_moments_loses_nothing_acknowledged(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    server = ServerProcess(tmp_path / "data", tmp_path, SETTINGS)
    workers = [Worker(f"w{index}") for index in range(1, 5)]
    expected = Expectation()
    await server.start()
    try:
        assert (await server.http("PUT", "/groups/g/connectors/c1", {"tasks": 2}))[0] == 200
        expected.connectors["c1"] = {2}
        for _ in range(ROUNDS):
            await chaos_round(server, workers, rng, expected)
            await server.start()
            await verify(server, expected)
            # Carry on from what the server has: members keep their epochs and units.
            view = await server.group("g")
            tasks = connector_tasks(view)
            expected.connectors = {name: {tasks.get(name)} for name in CONNECTORS}
            expected.members = {name: "present" for name in
                                (m["member_id"] for m in view["members"])}
            members = {m["member_id"]: m for m in view["members"]}
            for worker in workers:
                # A join whose answer the kill swallowed may still have been made durable:
                # the worker learns its epoch and units from the server, as after a retry.
                member = members.get(worker.member_id)
                worker.joined = member is not None
                if member is None:
                    worker.epoch, worker.owned = 0, frozenset()
                else:
                    assigned = member["assigned"]
                    worker.epoch = member["member_epoch"]
                    worker.owned = frozenset(
                        [(name, -1) for name in assigned["connectors"]]
                        + [(t["connector"], t["task"]) for t in assigned["tasks"]])
    finally:
        server.kill()
