"""Every reconciliation transition as a table: (current, target, owned, others) -> next."""

from __future__ import annotations

import pytest

from coordinator.core.reconcile import CurrentAssignment, MemberState, TargetPart, reconcile
from coordinator.units import CONNECTOR, Unit

S, UNREV, UNREL = MemberState.STABLE, MemberState.UNREVOKED, MemberState.UNRELEASED


def u(*names: str) -> frozenset[Unit]:
    out: set[Unit] = set()
    for name in names:
        connector, _, task = name.partition("-")
        out.add((connector, int(task)) if task else (connector, CONNECTOR))
    return frozenset(out)


# (name, current, target epoch, target units, owned, held by others, expected)
CASES = [
    ("stable at target epoch: nothing to do",
     CurrentAssignment(5, 4, S, u("A")), 5, u("A"), None, {}, CurrentAssignment(5, 4, S, u("A"))),
    ("new target, nothing to revoke, all free: straight to target epoch",
     CurrentAssignment(4, 3, S, u("A")), 5, u("A", "B"), None, {},
     CurrentAssignment(5, 4, S, u("A", "B"))),
    ("new target, nothing to revoke, new unit held elsewhere: UNRELEASED at target epoch",
     CurrentAssignment(4, 3, S, u("A")), 5, u("A", "B"), None, {("B", CONNECTOR): "W9"},
     CurrentAssignment(5, 4, UNREL, u("A"))),
    ("new target drops units: UNREVOKED at the old epoch, keeps only the rest",
     CurrentAssignment(4, 3, S, u("A", "B")), 5, u("A"), None, {},
     CurrentAssignment(4, 3, UNREV, u("A"), u("B"))),
    ("new target drops and adds: revoke first, assign nothing yet",
     CurrentAssignment(4, 3, S, u("A", "B")), 5, u("A", "C"), None, {},
     CurrentAssignment(4, 3, UNREV, u("A"), u("B"))),
    ("UNREVOKED, owned not reported: keep waiting",
     CurrentAssignment(4, 3, UNREV, u("A"), u("B")), 5, u("A"), None, {},
     CurrentAssignment(4, 3, UNREV, u("A"), u("B"))),
    ("UNREVOKED, still owns a revoked unit: keep waiting",
     CurrentAssignment(4, 3, UNREV, u("A"), u("B")), 5, u("A"), u("A", "B"), {},
     CurrentAssignment(4, 3, UNREV, u("A"), u("B"))),
    ("UNREVOKED, released: moves to the target epoch",
     CurrentAssignment(4, 3, UNREV, u("A"), u("B")), 5, u("A"), u("A"), {},
     CurrentAssignment(5, 4, S, u("A"))),
    ("UNREVOKED, released, target adds a free unit: gets it with the epoch",
     CurrentAssignment(4, 3, UNREV, u("A"), u("B")), 5, u("A", "C"), u("A"), {},
     CurrentAssignment(5, 4, S, u("A", "C"))),
    ("UNRELEASED, unit still held: stays",
     CurrentAssignment(5, 4, UNREL, u("A")), 5, u("A", "B"), None, {("B", CONNECTOR): "W9"},
     CurrentAssignment(5, 4, UNREL, u("A"))),
    ("UNRELEASED, unit released by the other worker: STABLE with it",
     CurrentAssignment(5, 4, UNREL, u("A")), 5, u("A", "B"), None, {},
     CurrentAssignment(5, 4, S, u("A", "B"))),
    ("UNRELEASED, one of two released: takes that one, stays UNRELEASED",
     CurrentAssignment(5, 4, UNREL, u("A")), 5, u("A", "B", "C"), None,
     {("C", CONNECTOR): "W9"}, CurrentAssignment(5, 4, UNREL, u("A", "B"))),
    ("joining member (epoch 0) with empty target: reaches the target epoch",
     CurrentAssignment(0, -1, S), 1, frozenset(), None, {}, CurrentAssignment(1, 0, S)),
    ("a unit it holds itself is not 'held by another'",
     CurrentAssignment(4, 3, S, u("A")), 5, u("A"), None, {("A", CONNECTOR): "me"},
     CurrentAssignment(5, 4, S, u("A"))),
]


@pytest.mark.parametrize(
    ("current", "epoch", "target", "owned", "others", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_transition(current: CurrentAssignment, epoch: int, target: frozenset[Unit],
                    owned: frozenset[Unit] | None, others: dict[Unit, str],
                    expected: CurrentAssignment) -> None:
    result = reconcile("me", current, epoch, TargetPart(target), 0, owned, others.get)
    assert result == expected
    # A response never revokes and assigns at once.
    assert not (result.pending_revocation and result.assigned - current.assigned)


def test_unchanged_returns_the_same_object() -> None:
    current = CurrentAssignment(5, 4, S, u("A"))
    assert reconcile("me", current, 5, TargetPart(u("A")), 0, None, {}.get) is current


def test_target_metadata_travels_with_the_epoch() -> None:
    result = reconcile("me", CurrentAssignment(4, 3, S), 5, TargetPart(u("A"), 2, b"m"), 7,
                       None, {}.get)
    assert (result.epoch, result.version, result.metadata, result.error) == (5, 2, b"m", 7)


def test_a_new_epoch_with_the_same_units_keeps_the_members_set_object() -> None:
    # Replaying a member's next current-assignment record with unchanged units keeps the
    # set it had (so the rebuilt tuples are freed at once); changed units replace it.
    from coordinator.core.group import GroupStore, current_assignment_record
    from coordinator.core.reconcile import CurrentAssignment

    store = GroupStore()
    units = frozenset({("A", 0), ("A", 1)})
    store.replay(current_assignment_record("g", "w1", CurrentAssignment(epoch=1, assigned=units)))
    held = store.groups["g"].members["w1"].current.assigned
    store.replay(current_assignment_record("g", "w1", CurrentAssignment(epoch=2, assigned=units)))
    current = store.groups["g"].members["w1"].current
    assert current.epoch == 2 and current.assigned is held
    store.replay(current_assignment_record("g", "w1", CurrentAssignment(
        epoch=3, assigned=frozenset({("A", 0)}))))
    current = store.groups["g"].members["w1"].current
    assert current.assigned == frozenset({("A", 0)}) and store.groups["g"].owners == {
        ("A", 0): "w1"}
