"""A group with no members and no connectors goes away after a retention, with records,
and a restart does not reset the clock."""

from __future__ import annotations

from coordinator.config import ServerConfig
from coordinator.core.result import EXPIRY_TIMER, TimerSet

from .context import Context

G = "g"
RETENTION = 60_000


def context() -> Context:
    return Context(ServerConfig(assignment_interval_ms=0, empty_group_retention_ms=RETENTION,
                                server_assignors=("balanced",)))


def test_an_empty_group_without_connectors_expires_after_the_retention() -> None:
    ctx = context()
    ctx.join(G, "w1", server_assignor="balanced")
    ctx.heartbeat(G, "w1", -1)  # the last member leaves
    assert G in ctx.core.group_ids()
    ctx.advance(RETENTION - 1)
    assert G in ctx.core.group_ids()
    ctx.advance(2)
    assert G not in ctx.core.group_ids()
    assert G not in ctx.replayed().group_ids()  # by records, not only in memory


def test_a_member_or_a_connector_keeps_it() -> None:
    ctx = context()
    ctx.join(G, "w1", server_assignor="balanced")
    ctx.heartbeat(G, "w1", -1)
    ctx.advance(RETENTION // 2)
    ctx.join(G, "w2", server_assignor="balanced")  # back in use: the expiry is cleared
    ctx.advance(RETENTION // 2 + 1)  # past the first expiry (w2's session ended meanwhile:
    assert G in ctx.core.group_ids()  # the clock started again then)
    ctx.advance(RETENTION)
    assert G not in ctx.core.group_ids()
    ctx.put_connector("h", "c", 1)  # a group with a connector never expires
    ctx.advance(RETENTION * 3)
    assert "h" in ctx.core.group_ids()


def test_a_restart_keeps_the_original_expiry() -> None:
    ctx = context()
    ctx.join(G, "w1", server_assignor="balanced")
    ctx.heartbeat(G, "w1", -1)
    left_at = ctx.now
    restarted = ctx.replayed()
    timers = {op.key: op.deadline_ms for op in restarted.timers_after_load(left_at + 5_000)
              if isinstance(op, TimerSet)}
    assert timers[(EXPIRY_TIMER, G, "")] == left_at + RETENTION
