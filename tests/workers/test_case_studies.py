"""The Connect rebalance design's case studies, played by sans-IO workers against the real core.

Connectors A (tasks 0, 1) and B (task 0): the design's AC0, AT1, AT2, BC0, BT1. Every worker
offers the incremental cooperative assignor; the coordinator chooses W1 (the first id whose
version range covers everyone's) to compute assignments.
"""

from __future__ import annotations

from coordinator.units import Unit
from protocol.errors import ErrorCode

from .cluster import Cluster, G
from .helpers import kinds, units

ALL = units("A", "A-0", "A-1", "B", "B-0")
SESSION_MS = 10_000
DELAY_MS = 60_000


def assert_stable_and_complete(cluster: Cluster) -> dict[str, frozenset[Unit]]:
    described = cluster.describe()
    assert described.group_state == "STABLE"
    running = {name: w.running for name, w in cluster.workers.items() if w.alive}
    assert frozenset().union(*running.values()) == ALL
    cluster.assert_safe()
    return running


def test_w1_joins() -> None:
    cluster = Cluster()
    w1 = cluster.add("W1")
    cluster.run(0)
    # The join is answered with epoch 1 and COMPUTE_ASSIGNMENT; W1 installs everything for
    # itself and picks it up with its next heartbeat.
    assert w1.responses[0].error_code == ErrorCode.COMPUTE_ASSIGNMENT
    assert w1.responses[0].member_epoch == 1
    assert cluster.installs == 1
    cluster.run(3_000)
    assert w1.running == ALL
    assert w1.state.member_epoch == cluster.describe().group_epoch
    assert_stable_and_complete(cluster)


def test_w2_joins() -> None:
    cluster = Cluster()
    w1 = cluster.add("W1")
    cluster.run(3_000)
    w2 = cluster.add("W2")
    cluster.run(10_000)
    running = assert_stable_and_complete(cluster)
    assert kinds(running["W1"])[0] == kinds(running["W2"])[0] == 1  # a connector each
    assert {kinds(running["W1"])[1], kinds(running["W2"])[1]} == {1, 2}
    # W1 gave up what moved to W2, and did so before W2 started any of it.
    moved = w2.running
    for unit in moved:
        w1_runs = [r for r in cluster.registry.runs if r.unit == unit and r.worker == "W1"]
        w2_run = next(r for r in cluster.registry.runs if r.unit == unit and r.worker == "W2")
        assert w1_runs and all(r.stop_seq is not None and r.stop_seq < w2_run.start_seq
                               for r in w1_runs)
    assert w1.state.member_epoch == w2.state.member_epoch == cluster.describe().group_epoch


def seed_35(cluster: Cluster) -> None:
    """W1, W2, W3 stable, as in the design's 'Worker Leaving' starting point."""
    cluster.add("W1")
    cluster.run(3_000)
    cluster.add("W2")
    cluster.add("W3")
    cluster.run(10_000)
    running = assert_stable_and_complete(cluster)
    assert sorted(len(part) for part in running.values()) == [1, 2, 2]


def advertised_reason(cluster: Cluster, member_id: str) -> int:
    """The Reason the coordinator has for the member's (only) client assignor."""
    metadata = cluster.ctx.core.store.groups[G].members[member_id].metadata
    assert metadata is not None
    reason: int = metadata.client_assignors[0].reason
    return reason


def test_worker_leaving_waits_for_the_delay_then_reassigns() -> None:
    cluster = Cluster(delay_ms=DELAY_MS)
    seed_35(cluster)
    w2 = cluster.workers["W2"]
    lost = w2.running
    epoch = cluster.describe().group_epoch
    w2.crash()
    cluster.run(SESSION_MS + 4_000)  # its session ends, then everyone heartbeats once more

    # W2 was removed; W1 kept the assignment as it was: W2's units stay unassigned.
    described = cluster.describe()
    assert {m.member_id for m in described.members} == {"W1", "W3"}
    assert described.group_epoch == epoch + 1
    assert cluster.ctx.core.unassigned_units(G) == lost
    assert described.group_state == "STABLE"
    w1 = cluster.workers["W1"]
    assert w1.state.connect_assignment is not None
    assert 0 < w1.state.connect_assignment.delay_ms <= DELAY_MS

    # Just before the delay ends nothing has moved; then W1's assignor asks for a rebalance
    # through its Reason field and hands the units out.
    deadline = w1.assignors[0].wake_at_ms()
    assert deadline is not None
    cluster.run(deadline - cluster.ctx.now - 1)
    assert cluster.ctx.core.unassigned_units(G) == lost
    reason_before = advertised_reason(cluster, "W1")
    cluster.run(1)
    assert advertised_reason(cluster, "W1") != reason_before
    assert cluster.describe().group_epoch == epoch + 2
    cluster.run(5_000)
    running = assert_stable_and_complete(cluster)
    assert set(running) == {"W1", "W3"}
    for index in (0, 1):
        counts = [kinds(part)[index] for part in running.values()]
        assert max(counts) - min(counts) <= 1


def test_worker_bounce_gets_its_units_back_within_the_delay() -> None:
    cluster = Cluster(delay_ms=DELAY_MS)
    seed_35(cluster)
    w2 = cluster.workers["W2"]
    before = {name: w.running for name, w in cluster.workers.items()}

    # W2 stops reaching the coordinator: it keeps its units until its own session check
    # stops them, never after the coordinator could hand them to anyone else.
    w2.partitioned = True
    deadline = w2.state.session_deadline_ms
    assert deadline is not None
    cluster.run(deadline - cluster.ctx.now - 1)
    assert w2.running == before["W2"]
    assert "W2" in {m.member_id for m in cluster.describe().members}
    cluster.run(1)
    assert w2.running == frozenset()
    cluster.run(1_000)
    assert {m.member_id for m in cluster.describe().members} == {"W1", "W3"}
    cluster.run(5_000)
    assert cluster.ctx.core.unassigned_units(G) == before["W2"]

    # W2 restarts as a new process (new member id, same url) well within the delay.
    w2.crash()
    cluster.add("W2'", member_id="W2-restarted", url="http://W2:8083")
    cluster.run(10_000)
    running = assert_stable_and_complete(cluster)
    assert running["W2'"] == before["W2"]
    assert running["W1"] == before["W1"] and running["W3"] == before["W3"]
    # The delay was cancelled: nothing more happens when it would have ended.
    epoch = cluster.describe().group_epoch
    cluster.run(DELAY_MS)
    assert cluster.describe().group_epoch == epoch
    assert_stable_and_complete(cluster)


def test_partitioned_worker_rejoins_with_the_same_id_and_gets_its_units_back() -> None:
    cluster = Cluster(delay_ms=DELAY_MS)
    seed_35(cluster)
    w3 = cluster.workers["W3"]
    before = w3.running
    w3.partitioned = True
    cluster.run(SESSION_MS + 2_000)
    assert w3.running == frozenset()
    w3.partitioned = False
    cluster.run(10_000)
    # It rejoined with epoch 0 under the same member id and got its old units back.
    assert w3.running == before
    assert_stable_and_complete(cluster)


def test_clean_shutdown_releases_units_for_the_others() -> None:
    cluster = Cluster(delay_ms=0)
    seed_35(cluster)
    cluster.workers["W3"].shutdown()
    cluster.run(10_000)
    running = assert_stable_and_complete(cluster)
    assert set(running) == {"W1", "W2"}


def test_the_chosen_worker_leaving_hands_the_job_on() -> None:
    cluster = Cluster(delay_ms=0)
    seed_35(cluster)
    cluster.workers["W1"].shutdown()
    cluster.run(10_000)
    running = assert_stable_and_complete(cluster)
    assert set(running) == {"W2", "W3"}


def test_a_lost_response_is_retried_with_the_previous_epoch() -> None:
    cluster = Cluster()
    w1 = cluster.add("W1")
    cluster.run(3_000)
    w2 = cluster.add("W2")
    cluster.run(0)
    w1.heartbeat()  # COMPUTE_ASSIGNMENT: W1 installs a target that moves units to W2
    revoking = w1.heartbeat()
    assert revoking is not None and revoking.assignment is not None
    old_epoch = w1.state.member_epoch
    assert w1.running < ALL  # it stopped what moves

    # The acknowledgement moves W1 to the new epoch, but the answer is lost.
    w1.lose_responses = True
    assert w1.heartbeat() is None
    assert cluster.ctx.member_view(G, "W1").member_epoch > old_epoch
    w1.lose_responses = False
    retry = w1.heartbeat()  # still at the old epoch, every field, its owned units
    assert retry is not None and retry.error_code == ErrorCode.NONE
    assert retry.member_epoch == cluster.ctx.member_view(G, "W1").member_epoch
    cluster.run(10_000)
    assert_stable_and_complete(cluster)
    assert w2.running


def test_static_member_restart_takes_over_without_a_rebalance() -> None:
    cluster = Cluster(delay_ms=DELAY_MS)
    cluster.add("W1", instance_id="i-1")
    cluster.run(3_000)
    cluster.add("W2", instance_id="i-2")
    cluster.run(10_000)
    before = assert_stable_and_complete(cluster)
    epoch = cluster.describe().group_epoch

    # W2 stops for a restart: units first, then a temporary leave (-2).
    cluster.workers["W2"].shutdown()
    cluster.run(3_000)
    assert cluster.ctx.core.unassigned_units(G) == frozenset()  # its part is kept
    cluster.add("W2'", member_id="W2-restarted", instance_id="i-2", url="http://W2:8083")
    cluster.run(6_000)
    running = assert_stable_and_complete(cluster)
    assert running["W2'"] == before["W2"] and running["W1"] == before["W1"]
    assert cluster.describe().group_epoch == epoch  # no rebalance


def test_a_lost_revocation_ack_stops_units_within_the_rebalance_timeout() -> None:
    """The coordinator fences a member that has not acknowledged a revocation within its
    rebalance timeout and frees all its units, even below the session timeout."""
    cluster = Cluster(delay_ms=0)
    w1 = cluster.add("W1", rebalance_timeout_ms=3_000)
    cluster.run(3_000)
    w2 = cluster.add("W2", rebalance_timeout_ms=3_000)
    cluster.run(0)
    w1.heartbeat()  # COMPUTE_ASSIGNMENT: W1 installs a target that moves units to W2
    w1.heartbeat()  # the revocation
    kept = w1.running
    assert kept and kept < ALL
    w1.partitioned = True  # its acknowledgement never arrives
    cluster.run(8_000)  # fenced after 3 s; W2 runs everything; W1 stopped in time
    assert w1.running == frozenset()
    assert w2.running == ALL
    cluster.assert_safe()
    w1.partitioned = False
    cluster.run(10_000)
    assert_stable_and_complete(cluster)
