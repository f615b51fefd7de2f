"""Rounds a bounce costs bridged classic workers in a connect group, against the core:
no more than a broker's classic coordinator needs for the same bounce. A round starts when
membership changes (or a leader must hand out what was revoked); a worker's rejoin inside
a round is part of that round, whatever its metadata says it holds now, and an eager
worker's SyncGroup waits for the round's assignment instead of starting what the last
one gave it (which the new one would stop again, with one more round)."""

from __future__ import annotations

from collections import Counter

from coordinator.connect_protocol import (
    ConnectAssignment,
    WorkerMetadata,
    decode_assignment,
    encode_assignment,
    encode_worker_metadata,
)
from coordinator.core.classic.engine import JoinAnswer, Parked, SyncAnswer
from tests.core.classic_context import ClassicContext
from tests.core.test_classic_bridge import (
    UNITS,
    ClassicWorker,
    E,
    RememberingWorker,
    allocations,
    cooperative,
    no_double_holding,
    run,
)


class CooperativeWorker(RememberingWorker):
    """A sessioned worker that counts the JoinGroups it completed."""

    def __init__(self, ctx: ClassicContext, name: str) -> None:
        super().__init__(ctx, name)
        self.joins = 0

    def _joined(self, answer: JoinAnswer) -> None:
        if answer.error == E.NONE:
            self.joins += 1
        super()._joined(answer)


class EagerWorker(ClassicWorker):
    """Connect's eager protocol (`connect.protocol=eager`): metadata version 0, every
    task stopped before each rejoin, the leader hands every unit out round-robin, and
    each SyncGroup answer is the whole of what the worker runs."""

    def __init__(self, ctx: ClassicContext, name: str) -> None:
        super().__init__(ctx, name)
        self.joins = 0

    def metadata(self) -> bytes:
        return encode_worker_metadata(WorkerMetadata(0, f"http://{self.name}", 5))

    def step(self) -> None:
        ctx = self.ctx
        if self.joining or self.waiting:
            super().step()
            return
        if not self.rejoin:
            code = ctx.heartbeat(self.member_id, self.generation)
            if code == E.NONE:
                return
            if code == E.UNKNOWN_MEMBER_ID:
                self.member_id = ""
        self.held = frozenset()  # stops every task before it rejoins
        answer = ctx.join(self.member_id, protocols=(("default", self.metadata()),),
                          client_id=self.name)
        if isinstance(answer, JoinAnswer) and answer.error == E.MEMBER_ID_REQUIRED:
            self.member_id = answer.member_id
            answer = ctx.join(self.member_id, protocols=(("default", self.metadata()),),
                              client_id=self.name)
        if isinstance(answer, Parked):
            self.joining = True
            return
        self._joined(answer)

    def _joined(self, answer: JoinAnswer) -> None:
        if answer.error != E.NONE:
            self.rejoin = True
            return
        self.joins += 1
        self.generation = answer.generation
        assignments = {}
        if answer.leader == self.member_id:
            members = sorted(member.member_id for member in answer.members)
            units = sorted(UNITS)
            assignments = {member: encode_assignment(ConnectAssignment(
                0, leader=self.member_id, assigned=frozenset(units[index::len(members)])))
                for index, member in enumerate(members)}
        synced = self.ctx.sync(self.member_id, self.generation, assignments=assignments)
        if isinstance(synced, Parked):
            self.waiting = True
            return
        self._synced(synced)

    def _synced(self, synced: SyncAnswer) -> None:
        if synced.error != E.NONE:
            self.rejoin = True
            return
        self.held = decode_assignment(synced.assignment).assigned
        self.rejoin = False


def follower_bounce(ctx: ClassicContext, kind: type[ClassicWorker]
                    ) -> tuple[list[ClassicWorker], list[ClassicWorker], Counter[str]]:
    """Three workers settle; one that does not assign leaves and comes back as a new
    member. (every worker, the two not bounced, the epoch bumps of the bounce by trigger
    and member kind: "chosen" for the worker that assigns, "other" for the rest)."""
    ctx.apply(ctx.core.put_connector("g", "A", 3, ctx.now))
    ctx.apply(ctx.core.put_connector("g", "B", 2, ctx.now))
    workers = [kind(ctx, f"w{n}") for n in (1, 2, 3)]
    run(ctx, workers, 30)
    assert frozenset().union(*(w.held for w in workers)) == UNITS
    group = ctx.core.store.groups["g"]
    bounced = next(w for w in workers if w.member_id != group.chosen_member)
    others = [w for w in workers if w is not bounced]
    for worker in others:
        worker.joins = 0  # type: ignore[attr-defined]
    first_event = len(ctx.events)
    ctx.leave((bounced.member_id, None))
    workers.remove(bounced)
    run(ctx, workers, 3)
    workers.append(kind(ctx, "w4"))
    run(ctx, workers, 40)
    assert frozenset().union(*(w.held for w in workers)) == UNITS
    no_double_holding(workers, {})
    bumps: Counter[str] = Counter()
    for event in ctx.events[first_event:]:
        if event.name == "group_epoch_bumped":
            who = "chosen" if event.member_id == group.chosen_member else "other"
            bumps[f"{event.fields['trigger']}:{who}"] += 1
    return workers, others, bumps


def test_a_cooperative_workers_rejoin_moves_no_epoch_for_what_it_holds() -> None:
    """What a worker holds is what it reports as owned; the copy its metadata carries is
    not an assignor input: a rejoin after a grant or a revocation starts no round of its
    own (a revocation's second round comes from the release itself)."""
    ctx = ClassicContext(classic_group_type="connect")
    _workers, others, bumps = follower_bounce(ctx, CooperativeWorker)
    assert bumps["assignors_changed:other"] == 0, bumps
    # A broker's rounds for this bounce: the leave's, the return's, and the second round
    # that hands out what the return's revoked: three JoinGroups each at most.
    assert max(w.joins for w in others) <= 3, [w.joins for w in others]  # type: ignore[attr-defined]


def test_an_eager_bounce_takes_the_brokers_two_rounds() -> None:
    """The leave's round and the return's: each worker not bounced completes one
    JoinGroup in each, and no rejoin of the worker that assigns starts another."""
    ctx = ClassicContext(classic_group_type="connect")
    _workers, others, bumps = follower_bounce(ctx, EagerWorker)
    assert [w.joins for w in others] == [2, 2], bumps  # type: ignore[attr-defined]
    assert not [trigger for trigger in bumps if trigger.startswith("assignors_changed")], bumps


DELAY_MS = 10_000


class DelayingWorker(CooperativeWorker):
    """A sessioned worker with Connect's scheduled rebalance delay: as the leader it holds
    a departed worker's units back for `DELAY_MS` (telling every member the time left),
    and any worker told a delay rejoins when it is over, for the leader to hand them out."""

    def __init__(self, ctx: ClassicContext, name: str) -> None:
        super().__init__(ctx, name)
        self.previous: dict[str, frozenset[object]] = {}
        self.scheduled_ms: int | None = None
        self.rejoin_at_ms: int | None = None

    def step(self) -> None:
        if self.rejoin_at_ms is not None and self.ctx.now >= self.rejoin_at_ms \
                and not (self.joining or self.waiting):
            self.rejoin_at_ms = None
            self.rejoin = True
        super().step()

    def _assign(self, answer: JoinAnswer) -> dict[str, bytes]:
        self._note_assigning(answer)
        owned = allocations(answer)
        now = self.ctx.now
        lost: frozenset[object] = frozenset().union(
            *(units for member, units in self.previous.items() if member not in owned))
        lost -= frozenset().union(*owned.values())
        delay, held_back = 0, frozenset()
        if lost and (self.scheduled_ms is None or now < self.scheduled_ms):
            if self.scheduled_ms is None:
                self.scheduled_ms = now + DELAY_MS
            delay, held_back = self.scheduled_ms - now, lost
        else:
            self.scheduled_ms = None
        parts = {member: ConnectAssignment(2, leader=self.member_id,
                                           assigned=part.assigned - held_back,
                                           revoked=part.revoked, delay_ms=delay)
                 for member, part in cooperative(owned, self.member_id).items()}
        self.previous = {m: (owned[m] - parts[m].revoked) | parts[m].assigned
                         for m in owned}
        if held_back:  # (still the departed worker's, for the next leader's view)
            self.previous["departed"] = held_back
        return {m: encode_assignment(a) for m, a in parts.items()}

    def _synced(self, synced: SyncAnswer) -> None:
        if isinstance(synced, SyncAnswer) and synced.error == E.NONE:
            delay = decode_assignment(synced.assignment).delay_ms
            if delay > 0:
                self.rejoin_at_ms = self.ctx.now + delay
        super()._synced(synced)


def test_a_follower_told_the_delay_is_not_called_back_for_it() -> None:
    """A follower back within the leader's scheduled delay: a broker's rounds are the
    leave's, the return's and the one when the delay is over (the units held back go
    out). A worker whose SyncGroup answer told it the target and its delay has nothing
    to learn from a rejoin, even when its epoch moved on in that answer."""
    ctx = ClassicContext(classic_group_type="connect")
    _workers, others, _bumps = follower_bounce(ctx, DelayingWorker)
    assert [w.joins for w in others] == [3, 3], [w.joins for w in others]  # type: ignore[attr-defined]


class LateSyncEagerWorker(EagerWorker):
    """An eager worker whose SyncGroup reaches the coordinator only at its next step: after
    the leader's, whose install may have moved this worker's epoch on meanwhile (it runs
    nothing, so nothing holds it back). Records each SyncGroup's error."""

    def __init__(self, ctx: ClassicContext, name: str) -> None:
        super().__init__(ctx, name)
        self.sync_errors: list[int] = []
        self.to_sync = False

    def step(self) -> None:
        if self.to_sync:
            self.to_sync = False
            synced = self.ctx.sync(self.member_id, self.generation, assignments={})
            if isinstance(synced, Parked):
                self.waiting = True
                return
            self._synced(synced)
            return
        super().step()

    def _joined(self, answer: JoinAnswer) -> None:
        if answer.error != E.NONE or answer.leader == answer.member_id:
            super()._joined(answer)
            return
        self.joins += 1
        self.generation = answer.generation
        self.to_sync = True

    def _synced(self, synced: SyncAnswer) -> None:
        self.sync_errors.append(synced.error)
        super()._synced(synced)


def test_an_eager_followers_late_sync_is_answered_at_its_join_generation() -> None:
    """The leader's install moves an eager follower that runs nothing to the new epoch at
    once; its SyncGroup, sent with its JoinGroup's generation, arriving after that install
    is answered with its part, not ILLEGAL_GENERATION (one more JoinGroup each time, every
    task stopped once more)."""
    ctx = ClassicContext(classic_group_type="connect")
    _workers, others, bumps = follower_bounce(ctx, LateSyncEagerWorker)
    errors = [e for w in others for e in w.sync_errors]  # type: ignore[attr-defined]
    assert E.ILLEGAL_GENERATION not in errors, errors
    assert [w.joins for w in others] == [2, 2], bumps  # type: ignore[attr-defined]
