"""Where a connect group's units come from: its client-side assignments, until the admin
API sets its connectors; from then on, the connectors set through the admin API."""

from __future__ import annotations

from coordinator.units import units_of
from protocol.errors import ErrorCode
from tests.core.classic_context import ClassicContext
from tests.core.context import Context, units, wire_units
from tests.core.test_classic_bridge import UNITS, ClassicWorker, run


def test_a_group_without_admin_connectors_runs_what_its_leader_assigns() -> None:
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0)
    workers = [ClassicWorker(ctx, "w1")]
    run(ctx, workers, 3)
    group = ctx.core.store.groups["g"]
    assert group.units_source == "installs"
    assert workers[0].held == UNITS  # the leader's units, unknown to the coordinator before
    assert ctx.core.unassigned_units("g") == frozenset()
    workers += [ClassicWorker(ctx, "w2"), ClassicWorker(ctx, "w3")]
    run(ctx, workers)  # `run` checks that no unit is held twice at any step
    assert sorted(len(w.held) for w in workers) == [2, 2, 3]
    assert frozenset().union(*(w.held for w in workers)) == UNITS
    assert ctx.core.describe_group("g").connectors_and_tasks.connectors == ("A", "B")


def test_the_source_survives_a_restart_and_admin_connectors_take_over() -> None:
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0)
    workers = [ClassicWorker(ctx, "w1"), ClassicWorker(ctx, "w2")]
    run(ctx, workers, 10)
    ctx.restart()
    assert ctx.core.store.groups["g"].units_source == "installs"
    assert ctx.core.effective_group_config("g")["units.source"] == "installs"
    # The admin API sets a connector: from now on installs are checked against it, and
    # the leader's A and B tasks beyond A-0 are refused (nothing changes).
    ctx.apply(ctx.core.put_connector("g", "A", 1, ctx.now))
    group = ctx.core.store.groups["g"]
    assert group.units_source == "admin"
    assert ctx.core.effective_group_config("g")["units.source"] == "admin"
    before = group.assignment_epoch
    for worker in workers:
        worker.rejoin = True
        worker.step()
    assert group.assignment_epoch == before
    ctx.restart()
    assert ctx.core.store.groups["g"].units_source == "admin"
    assert units_of({"A": 1}) == ctx.core.store.groups["g"].units


def test_a_new_protocol_install_may_name_units_the_coordinator_did_not_know() -> None:
    ctx = Context()
    assert ctx.join("g", "w1").error_code in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT)
    assert ctx.join("g", "w2").error_code in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT)
    prepared = ctx.prepare("g", "w1", 1)
    assert prepared.error_code == ErrorCode.NONE
    epoch = prepared.group_epoch
    # Every other rule holds: one member per unit, members that existed.
    twice = ctx.install("g", "w1", 1, epoch, {"w1": units("X"), "w2": units("X")})
    assert twice.error_code == ErrorCode.INVALID_ASSIGNMENT
    stranger = ctx.install("g", "w1", 1, epoch, {"w9": units("X")})
    assert stranger.error_code == ErrorCode.INVALID_ASSIGNMENT
    answer = ctx.install("g", "w1", 1, epoch, {"w1": units("X", "X-0"), "w2": units("X-1")})
    assert answer.error_code == ErrorCode.NONE, answer.error_message
    assert wire_units(ctx.describe("g").connectors_and_tasks) == units("X", "X-0", "X-1")
    # With connectors set through the admin API, the same install is refused.
    ctx.put_connector("g", "A", 1)
    epoch = ctx.member_view("g", "w1").member_epoch
    prepared = ctx.prepare("g", "w1", epoch)
    assert prepared.error_code == ErrorCode.NONE, prepared.error_message
    refused = ctx.install("g", "w1", epoch, prepared.group_epoch, {"w1": units("X")})
    assert refused.error_code == ErrorCode.INVALID_ASSIGNMENT
    assert "does not run" in refused.error_message
    assert ctx.core.store.groups["g"].units_source == "admin"


def test_an_install_tells_what_it_left_unassigned_of_the_units_the_group_runs() -> None:
    ctx = Context()
    ctx.join("g", "w1")
    ctx.join("g", "w2")
    epoch = ctx.prepare("g", "w1", 1).group_epoch
    ctx.install("g", "w1", 1, epoch, {"w1": units("X", "X-0"), "w2": units("X-1")})
    installed = [e for e in ctx.last.events if e.name == "target_installed"]
    assert [(e.fields["assigned"], e.fields["unassigned"]) for e in installed] == [(3, 0)]
    group = ctx.core.store.groups["g"]
    answer = ctx.heartbeat("g", "w2", group.members["w2"].current.epoch)
    ctx.heartbeat("g", "w2", answer.member_epoch, owned=units("X-1"))
    assert group.members["w2"].current.assigned == units("X-1")
    # The next install leaves X-1 out on purpose: the group still runs it (w2 holds it
    # until told to release it), and it is in no target.
    ctx.join("g", "w3")
    w1_epoch = group.members["w1"].current.epoch
    ctx.compute_and_install("g", "w1", w1_epoch, lambda prepared: {"w1": units("X", "X-0")})
    installed = [e for e in ctx.last.events if e.name == "target_installed"]
    assert [(e.fields["assigned"], e.fields["unassigned"]) for e in installed] == [(2, 1)]
