"""The report's headline from the facts of a run: a capacity figure only for a steady run
long enough to measure, and never a maximum below what ran."""

from __future__ import annotations

from typing import Any

from coordinator.report.figures import project_capacity
from coordinator.report.headline import RunFacts, make_headline


def facts(*, members: float = 10, seconds: float = 120, scrapes: int = 40,
          p99_ms: float = 1.0, cores: float = 0.05, triggers: dict[str, float] | None = None,
          simulation: dict[str, Any] | None = None) -> RunFacts:
    heartbeats = members / 3  # one heartbeat per member every 3 s
    projection = project_capacity(members_now=members, cpu_cores_now=cores,
                                  heartbeats_per_second=heartbeats, p99_now_ms=p99_ms,
                                  average_group_size=members)
    return RunFacts(window_seconds=seconds, scrapes=scrapes, members_max=members,
                    heartbeats_per_second=heartbeats, heartbeat_p99_ms=p99_ms,
                    rebalances_by_trigger=triggers if triggers is not None
                    else {"member_joined": members, "connectors_changed": 4},
                    simulation=simulation, projection=projection)


def test_a_steady_run_gets_a_capacity_figure() -> None:
    headline = make_headline(facts())
    assert headline.kind == "capacity"
    # 10 members at p99 1 ms under 5 ms: 50 by latency; 0.005 cores each under 0.8: 160
    assert "10 workers ran for 120 s" in headline.text
    assert "about 50 workers fit (40 more than ran)" in headline.text
    assert "p99 latency" in headline.text


def test_a_chaos_run_gets_no_capacity_figure_and_says_why() -> None:
    chaos = {"violations": [], "converged": True, "disruptions": [
        {"kind": "kill"}, {"kind": "bounce"}, {"kind": "pause"}, {"kind": "kill"}]}
    headline = make_headline(facts(
        p99_ms=20.0, simulation=chaos,
        triggers={"member_joined": 13, "session_timeout": 2, "member_fenced": 1,
                  "connectors_changed": 4}))
    assert headline.kind == "disturbed"
    assert "no capacity figure" in headline.text
    assert "fit" not in headline.text  # no maximum, so none below the 10 that ran
    reasons = " | ".join(headline.reasons)
    assert "4 times (bounce 1, kill 2, pause 1)" in reasons
    assert "member_fenced 1, session_timeout 2" in reasons
    assert "joined 13 times for at most 10 workers" in reasons


def test_rebalances_alone_mark_a_run_disturbed() -> None:
    headline = make_headline(facts(triggers={"member_joined": 10, "revocation_timeout": 1}))
    assert headline.kind == "disturbed"
    assert "revocation_timeout 1" in headline.reasons[0]


def test_a_short_recording_is_too_short() -> None:
    headline = make_headline(facts(seconds=30, scrapes=11))
    assert headline.kind == "too_short"
    assert "the recording lasted 30 s, less than the 60 s" in headline.reasons[0]


def test_over_the_budget_says_so_instead_of_a_lower_maximum() -> None:
    headline = make_headline(facts(p99_ms=8.0))  # 10 * 5 / 8 = 6.25 < 10
    assert headline.kind == "over_budget"
    assert "heartbeat p99 8.00 ms is above the 5 ms budget" in headline.text
    assert "fit" not in headline.text  # no 6.25-worker maximum while 10 ran


def test_units_run_twice_fail_the_run() -> None:
    broken = {"violations": [{"unit": "c-0"}], "converged": True, "disruptions": []}
    headline = make_headline(facts(simulation=broken))
    assert headline.kind == "failed"
    assert "ran on two workers at once" in headline.text


def test_no_heartbeats_no_figure() -> None:
    empty = RunFacts(window_seconds=100, scrapes=30, members_max=0,
                     heartbeats_per_second=0, heartbeat_p99_ms=None)
    assert make_headline(empty).kind == "no_data"


def test_rebalances_outside_a_long_enough_steady_part_leave_the_figure() -> None:
    steady = RunFacts(**{**facts(triggers={"member_joined": 12, "session_timeout": 2}).__dict__,
                         "steady_seconds": 100.0, "all_members_max": 12.0})
    headline = make_headline(steady)
    assert headline.kind == "capacity"
    assert headline.reasons == ["outside the steady part: 2 rebalances other than joins, "
                                "leaves and connector changes (session_timeout 2)"]
    too_little = RunFacts(**{**steady.__dict__, "steady_seconds": 20.0})
    headline = make_headline(too_little)
    assert headline.kind == "disturbed"
    assert "no group was rebalancing for 20 s of the 120 s recorded" in headline.reasons[-1]
