"""Reconciliation: how one member moves from its current assignment towards its target.

The rules (KIP-848's member epoch rules as docs/protocol.md gives them), in order:

1. A member first releases what its target no longer holds. While it has units pending
   revocation it is UNREVOKED, stays at its epoch and is sent only what it keeps.
2. It acknowledges by leaving the revoked units out of OwnedConnectorsAndTasks.
3. Only then does it move to the target epoch, and it gets each new unit only once no
   other member still holds it (UNRELEASED until all have been released).

A response therefore never revokes and assigns at once. The function is pure: the caller
passes a lookup into the group's owner index.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Any

from coordinator.units import Unit

EMPTY: frozenset[Unit] = frozenset()


class MemberState(IntEnum):
    STABLE = 0
    UNREVOKED = 1  # must release units before it may go on
    UNRELEASED = 2  # at the target epoch, waiting for units others still hold


@dataclass(frozen=True, slots=True)
class CurrentAssignment:
    """A member's epoch and the units it may run now (plus those it must release)."""

    epoch: int = 0
    previous_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: frozenset[Unit] = EMPTY
    pending_revocation: frozenset[Unit] = EMPTY
    error: int = 0
    version: int = 0
    metadata: bytes = b""

    @property
    def held(self) -> frozenset[Unit]:
        """Units nobody else may be given: those it runs and those it has yet to release."""
        return self.assigned | self.pending_revocation if self.pending_revocation else self.assigned


NO_ASSIGNMENT = CurrentAssignment()  # a new member's (immutable, so shared)


@dataclass(frozen=True, slots=True)
class TargetPart:
    """A member's part of the target assignment."""

    units: frozenset[Unit] = EMPTY
    version: int = 0
    metadata: bytes = b""
    # The units in wire form when they came that way (an Install), so the target record
    # need not build them again; not part of the part's identity.
    wire: Any = field(default=None, compare=False, repr=False)


EMPTY_TARGET = TargetPart()


def reconcile(
    member_id: str,
    current: CurrentAssignment,
    target_epoch: int,
    target: TargetPart,
    target_error: int,
    owned: frozenset[Unit] | None,
    owner_of: Callable[[Unit], str | None],
) -> CurrentAssignment:
    """The member's next assignment; returns `current` itself when nothing changes.

    `owned` is what the worker reported running (None when it did not say), `owner_of`
    tells who holds a unit now (None if free).
    """
    if current.state is MemberState.UNREVOKED:
        if owned is None or not owned.isdisjoint(current.pending_revocation):
            return current  # still waiting for the worker to release
        # Revocation acknowledged: the pending units are free now; go on from here.
        current = replace(current, state=MemberState.STABLE, pending_revocation=EMPTY)
    elif current.epoch == target_epoch:
        if current.state is MemberState.STABLE:
            return current
        return _acquire(member_id, current, target, owner_of)

    if current.epoch != target_epoch:
        to_revoke = current.assigned - target.units
        if to_revoke:
            return replace(
                current,
                state=MemberState.UNREVOKED,
                assigned=current.assigned & target.units,
                pending_revocation=to_revoke,
            )
        current = replace(
            current,
            epoch=target_epoch,
            previous_epoch=current.epoch,
            error=target_error,
            version=target.version,
            metadata=target.metadata,
        )
    return _acquire(member_id, current, target, owner_of)


def _acquire(
    member_id: str,
    current: CurrentAssignment,
    target: TargetPart,
    owner_of: Callable[[Unit], str | None],
) -> CurrentAssignment:
    missing = target.units - current.assigned
    if not missing:
        return replace(current, state=MemberState.STABLE) if current.state else current
    free = {unit for unit in missing if owner_of(unit) in (None, member_id)}
    assigned = current.assigned | free if free else current.assigned
    state = MemberState.STABLE if len(free) == len(missing) else MemberState.UNRELEASED
    if assigned is current.assigned and state is current.state:
        return current
    return replace(current, assigned=frozenset(assigned), state=state)
