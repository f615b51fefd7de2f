"""A heartbeat checked beforehand (off the event loop, for a large one) is answered exactly
like one that is not: same response, same records, same state."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from coordinator.core.group import units_to_wire
from coordinator.core.validation import check_heartbeat
from coordinator.units import Unit
from protocol.errors import ErrorCode
from protocol.messages import ConnectGroupHeartbeatRequest, ConnectorsAndTasks
from protocol.messages.common import ConnectorTaskId

from .context import Context, units

G = "g"


def stable_group() -> Context:
    ctx = Context()
    ctx.put_connector(G, "A", 3)
    ctx.join(G, "w1", client=False, server_assignor="balanced")
    return ctx


def beat(member: str, epoch: int, owned: Iterable[Unit] | ConnectorsAndTasks | None,
         group: str = G) -> ConnectGroupHeartbeatRequest:
    wire = owned if isinstance(owned, ConnectorsAndTasks) or owned is None \
        else units_to_wire(owned)
    return ConnectGroupHeartbeatRequest(group_id=group, member_id=member, member_epoch=epoch,
                                        owned_connectors_and_tasks=wire)


TWICE = ConnectorsAndTasks(connectors=("A",), tasks=(ConnectorTaskId(connector="A", task=0),
                                                     ConnectorTaskId(connector="A", task=0)))
CASES = {
    "owning what it runs": ("w1", 1, units("A")),
    "owning nothing listed": ("w1", 1, None),
    "an unknown member": ("w9", 3, units("A", "A-0")),
    "a stale epoch": ("w1", 7, units("A")),
    "a unit listed twice": ("w1", 1, TWICE),
    "an empty group id": ("w1", 1, units("A")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_checked_and_unchecked_heartbeats_agree(case: str) -> None:
    plain, checked = stable_group(), stable_group()
    member, epoch, owned = CASES[case]
    request = beat(member, epoch, owned, group="" if case == "an empty group id" else G)
    first = plain.core.heartbeat(request, plain.now)
    second = checked.core.heartbeat(request, checked.now, check_heartbeat(request))
    assert second.response == first.response
    assert second.records == first.records
    plain.apply(first)
    checked.apply(second)
    assert checked.describe(G) == plain.describe(G)
    assert (first.response.error_code == ErrorCode.NONE) == case.startswith("owning")


def test_check_heartbeat_converts_the_owned_list_and_refuses_what_validation_refuses(
        ) -> None:
    request = beat("w1", 1, units("A", "A-1"))
    done = check_heartbeat(request)
    assert done is not None and done.request is request
    assert done.owned == units("A", "A-1")
    assert check_heartbeat(beat("w1", 1, TWICE)) is None
    assert check_heartbeat(beat("w1", 1, None)) == type(done)(request=beat("w1", 1, None),
                                                               owned=None)


def test_a_check_made_for_another_request_is_not_trusted() -> None:
    ctx = stable_group()
    harmless = beat("w1", 1, units("A"))
    bad = beat("w1", 1, TWICE)
    result = ctx.core.heartbeat(bad, ctx.now, check_heartbeat(harmless))
    assert result.response.error_code == ErrorCode.INVALID_REQUEST
