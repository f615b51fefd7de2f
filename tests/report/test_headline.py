"""The report's headline from the facts of a run: a capacity figure only for a steady run
long enough to measure, and never a maximum below what ran."""

from __future__ import annotations

import re
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
    # 10 members, 0.005 cores each under 0.8: 160 (latency within budget, not scaled)
    assert "10 workers ran for 120 s" in headline.text
    assert "about 160 workers fit (150 more than ran) within the 0.8 core CPU budget" \
        in headline.text
    # 1/3 heartbeat/s per worker, 0.05 cores / 3.33 heartbeats/s = 15,000 us each
    assert "At 0.33 heartbeats/s per worker and 15,000 us of coordinator CPU" in headline.text
    assert "53 heartbeats/s" in headline.text  # 160 / 3


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


def projected(*, members_ran: float, members_scaled: float, p99_ms: float,
              cores: float) -> RunFacts:
    """A steady run whose model scaled from `members_scaled` (the mean) while at most
    `members_ran` workers ran."""
    projection = project_capacity(members_now=members_scaled, cpu_cores_now=cores,
                                  heartbeats_per_second=members_scaled / 3, p99_now_ms=p99_ms,
                                  average_group_size=members_scaled)
    return RunFacts(window_seconds=120, scrapes=40, members_max=members_ran,
                    heartbeats_per_second=members_ran / 3, heartbeat_p99_ms=p99_ms,
                    rebalances_by_trigger={"member_joined": members_ran},
                    projection=projection)


def comparisons_hold(text: str) -> None:
    """Every "X ... is above the Y ... budget" in the text is true."""
    for found in re.finditer(r"([\d.,]+) (?:ms|cores) is above the ([\d.,]+) (?:ms|core)",
                             text):
        assert float(found.group(1)) > float(found.group(2)), text


def test_the_headline_names_the_cause_that_is_over_its_budget() -> None:
    cases = {  # (p99 ms, cores): what the headline must blame, and must not
        (8.0, 0.05): ("heartbeat p99 8.00 ms is above the 5 ms budget", "CPU use"),
        (2.10, 1.20): ("CPU use 1.20 cores is above the 0.8 core budget", "p99 2.10 ms is"),
        (8.0, 1.20): ("heartbeat p99 8.00 ms is above the 5 ms budget and CPU use 1.20 "
                      "cores is above the 0.8 core budget", "no such text"),
    }
    for (p99_ms, cores), (blamed, innocent) in cases.items():
        headline = make_headline(projected(members_ran=6, members_scaled=6, p99_ms=p99_ms,
                                           cores=cores))
        assert headline.kind == "over_budget", headline.text
        assert blamed in headline.text and innocent not in headline.text, headline.text
        comparisons_hold(headline.text)


def test_the_headline_names_the_limit_a_capacity_figure_reaches_first() -> None:
    # CPU: 0.4 cores for 10 workers -> 0.8 / 0.04 = 20 workers; a p99 near its budget
    # bounds nothing (it is not scaled), but one over it leaves no headroom.
    by_cpu = make_headline(projected(members_ran=10, members_scaled=10, p99_ms=4.9,
                                     cores=0.4))
    assert by_cpu.kind == "capacity"
    assert "about 20 workers fit" in by_cpu.text and "CPU budget" in by_cpu.text
    by_latency = make_headline(projected(members_ran=10, members_scaled=10, p99_ms=5.1,
                                         cores=0.01))
    assert by_latency.kind == "over_budget"
    assert "p99 5.10 ms is above the 5 ms budget" in by_latency.text
    # Cheap heartbeats: the CPU would allow more than one coordinator was measured to
    # answer; the figure is that measured throughput's.
    by_throughput = make_headline(projected(members_ran=10, members_scaled=10, p99_ms=0.2,
                                            cores=10 / 3 * 20e-6))
    assert "about 22,518 workers fit" in by_throughput.text
    assert "7,506 heartbeats/s BENCHMARKS.md measured" in by_throughput.text
    for headline in (by_cpu, by_throughput):
        assert "latency at that load is not measured here" in headline.text
        assert "3,569/s paced at p99 19.5 ms" in headline.text


def test_within_budget_is_never_called_over_it() -> None:
    # 6 workers at most, 2.5 on average: scaled from the mean, 0.8 / (0.4 / 2.5) = 5 < 6,
    # though 2.10 ms and 0.4 cores are well under their budgets.
    headline = make_headline(projected(members_ran=6, members_scaled=2.5, p99_ms=2.10,
                                       cores=0.4))
    assert "above" not in headline.text, headline.text
    assert "heartbeat p99 2.10 ms within the 5 ms budget" in headline.text
    assert "fit" not in headline.text  # no maximum at or below the 6 that ran
