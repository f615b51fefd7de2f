"""An Install checked beforehand (off the event loop) is answered exactly like one that is
not: same response, same records, same state."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pytest

from coordinator.core.group import units_to_wire
from coordinator.core.validation import check_install, install_unit_count
from coordinator.units import Unit
from protocol.errors import ErrorCode
from protocol.messages import ConnectGroupInstallAssignmentRequest
from protocol.messages.connect_group_install_assignment_request import MemberAssignment

from .context import Context, units

G = "g"


def prepared_group() -> tuple[Context, int]:
    ctx = Context()
    ctx.put_connector(G, "A", 3)
    for worker in ("w1", "w2"):
        ctx.join(G, worker)
    return ctx, ctx.prepare(G, "w1", 1).group_epoch


def request(group_epoch: int, assignment: Mapping[str, Iterable[Unit]],
            member_id: str = "w1") -> ConnectGroupInstallAssignmentRequest:
    return ConnectGroupInstallAssignmentRequest(
        group_id=G, member_id=member_id, member_epoch=1, group_epoch=group_epoch, error=0,
        members=tuple(MemberAssignment(member_id=mid, assigned=units_to_wire(u), version=1,
                                       metadata=b"") for mid, u in assignment.items()))


CASES = {
    "valid": {"w1": units("A", "A-0"), "w2": units("A-1", "A-2")},
    "partial": {"w1": units("A")},
    "unknown unit": {"w1": units("A", "Z")},
    "given twice": {"w1": units("A"), "w2": units("A", "A-1")},
    "not a member": {"w1": units("A"), "w9": units()},
    "empty member id": {"": units("A")},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_checked_and_unchecked_installs_agree(case: str) -> None:
    plain, epoch = prepared_group()
    checked, _ = prepared_group()
    install = request(epoch, CASES[case])
    first = plain.core.install_assignment(install, plain.now)
    second = checked.core.install_assignment(install, checked.now, check_install(install))
    assert second.response == first.response
    assert second.records == first.records
    plain.apply(first)
    checked.apply(second)
    assert checked.describe(G) == plain.describe(G)
    if case == "valid":
        assert first.response.error_code == ErrorCode.NONE
    elif case != "partial":
        assert first.response.error_code != ErrorCode.NONE


def test_a_check_made_for_another_request_is_not_trusted() -> None:
    ctx, epoch = prepared_group()
    harmless = request(epoch, {"w1": units("A")})
    bad = request(epoch, {"w1": units("A", "Z")})
    result = ctx.core.install_assignment(bad, ctx.now, check_install(harmless))
    assert result.response.error_code == ErrorCode.INVALID_ASSIGNMENT
    assert "does not run" in result.response.error_message


def test_check_install_sees_overlaps_and_malformed_requests() -> None:
    overlapping = check_install(request(5, CASES["given twice"]))
    assert overlapping is not None and overlapping.overlapping
    assert overlapping.units == units("A", "A-1")
    assert check_install(request(5, CASES["empty member id"])) is None
    assert install_unit_count(request(5, CASES["valid"])) == 4
