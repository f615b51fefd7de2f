"""Random joins, crashes, partitions, restarts and connector changes: no unit ever runs on two
workers at once, and once things calm down the group converges with every unit running."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from coordinator.units import units_of
from coordinator.workers.assignors import EagerAssignor, IncrementalCooperativeAssignor

from .cluster import Cluster, G, SimWorker

DELAY_MS = 20_000
NAMES = [f"W{i}" for i in range(1, 6)]


class WorkerChaos(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cluster = Cluster({"A": 2, "B": 1}, delay_ms=DELAY_MS)
        self.connectors = {"A": 2, "B": 1}
        self.restarts = 0

    def alive(self) -> list[SimWorker]:
        return [w for w in self.cluster.workers.values() if w.alive]

    @rule(name=st.sampled_from(NAMES), rebalance_timeout_ms=st.sampled_from([2_000, 60_000]))
    def start_worker(self, name: str, rebalance_timeout_ms: int = 60_000) -> None:
        old = self.cluster.workers.get(name)
        if old is not None and old.alive:
            return
        self.restarts += 1
        # A restarted process gets a new member id but keeps its url.
        self.cluster.add(name, member_id=f"{name}-{self.restarts}", url=f"http://{name}:8083",
                         rebalance_timeout_ms=rebalance_timeout_ms)

    @precondition(lambda self: bool(self.alive()))
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        data.draw(st.sampled_from(self.alive())).crash()

    @precondition(lambda self: bool(self.alive()))
    @rule(data=st.data())
    def shut_down(self, data: st.DataObject) -> None:
        data.draw(st.sampled_from(self.alive())).shutdown()

    @precondition(lambda self: bool(self.alive()))
    @rule(data=st.data(), partitioned=st.booleans())
    def partition(self, data: st.DataObject, partitioned: bool) -> None:
        data.draw(st.sampled_from(self.alive())).partitioned = partitioned

    @precondition(lambda self: bool(self.alive()))
    @rule(data=st.data(), lossy=st.booleans())
    def lose_responses(self, data: st.DataObject, lossy: bool) -> None:
        data.draw(st.sampled_from(self.alive())).lose_responses = lossy

    @rule(name=st.sampled_from("ABC"), tasks=st.integers(0, 4))
    def set_connector(self, name: str, tasks: int) -> None:
        self.connectors[name] = tasks
        self.cluster.ctx.put_connector(G, name, tasks)

    @rule(ms=st.sampled_from([0, 100, 1_000, 3_000, 7_000, 12_000, 25_000]))
    def wait(self, ms: int) -> None:
        self.cluster.run(ms)

    @invariant()
    def never_twice(self) -> None:
        self.cluster.assert_safe()

    def teardown(self) -> None:
        # Calm: heal every partition, make sure someone is there, wait out every delay.
        for worker in self.alive():
            worker.partitioned = worker.lose_responses = False
        if not self.alive():
            self.start_worker("W9")
        self.cluster.run(2 * DELAY_MS + 30_000)
        described = self.cluster.describe()
        assert described.group_state == "STABLE", described
        running = [w.running for w in self.alive()]
        everything = units_of(self.connectors)
        assert frozenset().union(*running) == everything
        assert sum(map(len, running)) == len(everything)
        self.cluster.assert_safe()


WorkerChaos.TestCase.settings = settings(max_examples=40, stateful_step_count=25,
                                         deadline=None)
TestWorkerChaos = WorkerChaos.TestCase


def test_eager_workers_converge_without_double_runs() -> None:
    cluster = Cluster({"A": 3, "B": 2})
    for name in ("W1", "W2", "W3"):
        cluster.add(name, assignors=[EagerAssignor()])
        cluster.run(1_000)
    cluster.run(10_000)
    cluster.workers["W2"].crash()
    cluster.run(20_000)
    running = [w.running for w in cluster.workers.values() if w.alive]
    assert frozenset().union(*running) == units_of({"A": 3, "B": 2})
    assert cluster.describe().group_state == "STABLE"
    cluster.assert_safe()


def test_mixed_assignor_lists_pick_the_common_one() -> None:
    cluster = Cluster()
    cluster.add("W1", assignors=[IncrementalCooperativeAssignor(0), EagerAssignor()])
    cluster.add("W2", assignors=[EagerAssignor()])
    cluster.run(10_000)
    assert cluster.describe().assignor_name == "eager"
    assert cluster.describe().group_state == "STABLE"
    cluster.assert_safe()
