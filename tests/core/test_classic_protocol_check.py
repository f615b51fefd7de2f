"""Whether a join lists a protocol the group supports, and which protocol a generation
selects, cost as much as the names listed: each name is compared a bounded number of
times, whatever the other members list (counted, not timed)."""

from __future__ import annotations

from collections import Counter

from coordinator.core.classic.engine import JoinAnswer
from coordinator.core.classic.state import ClassicGroup
from protocol.errors import ErrorCode
from tests.core.classic_context import JOIN, ClassicContext

E = ErrorCode
NAMES = 2_000  # compared every one with every one: 4,000,000 comparisons


class CountedName(str):
    """A protocol name that counts how often it is hashed or compared."""

    uses = 0

    def __hash__(self) -> int:
        CountedName.uses += 1
        return str.__hash__(self)

    def __eq__(self, other: object) -> bool:
        CountedName.uses += 1
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        CountedName.uses += 1
        return str.__ne__(self, other)


def protocols(prefix: str, count: int = NAMES) -> tuple[tuple[str, bytes], ...]:
    return tuple((CountedName(f"{prefix}{index}"), b"m") for index in range(count))


def uses_while(action: object) -> int:
    CountedName.uses = 0
    assert callable(action)
    action()
    return CountedName.uses


def recount(group: ClassicGroup) -> tuple[Counter[str], int]:
    """The support count as a walk over the members says it is."""
    support: Counter[str] = Counter()
    active = [member for member in group.members.values() if not member.pending]
    for member in active:
        support.update({protocol.name for protocol in member.protocols})
    return support, len(active)


def test_a_join_with_no_protocol_in_common_is_refused_in_linear_time() -> None:
    ctx = ClassicContext()
    first = ctx.join("", version=3, protocols=protocols("a"))
    assert isinstance(first, JoinAnswer) and first.error == E.NONE  # alone: generation 1
    answers: list[object] = []
    uses = uses_while(lambda: answers.append(ctx.join("", version=3,
                                                      protocols=protocols("b"))))
    answer = answers[0]
    assert isinstance(answer, JoinAnswer) and answer.error == E.INCONSISTENT_GROUP_PROTOCOL
    assert uses <= 10 * NAMES, uses
    assert "(and 1990 more)" in str(ctx.events[-1].fields["reason"])


def test_a_join_with_its_last_name_in_common_is_accepted_in_linear_time() -> None:
    ctx = ClassicContext()
    ctx.join("", version=3, protocols=protocols("a"))
    shared = protocols("b", NAMES - 1) + ((CountedName("a1999"), b"m"),)
    uses = uses_while(lambda: ctx.join("", version=3, protocols=shared))
    assert uses <= 10 * NAMES, uses
    assert len(ctx.group().active()) == 2


def test_the_protocol_a_generation_selects_is_found_in_linear_time() -> None:
    """Two members listing the same names in opposite orders: the vote goes to the first
    member's preference, and finding it compares each name a few times."""
    ctx = ClassicContext()
    listed = protocols("p")
    first = ctx.join("", version=3, protocols=listed)
    assert isinstance(first, JoinAnswer)
    second_id = ""

    def second_joins() -> None:
        nonlocal second_id
        parked = ctx.join("", version=3, protocols=tuple(reversed(listed)))
        second_id = parked.key[2]  # type: ignore[union-attr]

    joining = uses_while(second_joins)
    completing = uses_while(lambda: ctx.join(first.member_id, version=3, protocols=listed))
    assert joining <= 10 * NAMES and completing <= 20 * NAMES, (joining, completing)
    answer = ctx.take(JOIN, second_id)
    assert isinstance(answer, JoinAnswer) and answer.generation == 2
    assert answer.protocol_name in ("p0", "p1999")  # one vote each: the first member's
    assert answer.protocol_name == ("p0" if answer.leader == first.member_id else "p1999")


def test_the_support_count_follows_every_change_and_a_restart() -> None:
    ctx = ClassicContext()
    one = ctx.new_member(protocols=(("x", b"1"), ("y", b"1"), ("y", b"2")))
    pending = ctx.join("", protocols=(("y", b"9"), ("q", b"1")))  # pending: not counted
    assert isinstance(pending, JoinAnswer) and pending.error == E.MEMBER_ID_REQUIRED
    group = ctx.group()
    assert (group.protocol_support, group.supporting) == recount(group)
    assert group.protocol_support == Counter({"x": 1, "y": 1})
    two = ctx.new_member(protocols=(("y", b"1"),))
    ctx.join(one, protocols=(("y", b"1"),))  # new metadata: "x" no longer listed
    assert (ctx.group().protocol_support, ctx.group().supporting) == recount(ctx.group())
    assert ctx.group().protocol_support == Counter({"y": 2})
    # a third member listing only "x" is refused: nobody else supports it
    refused = ctx.join("", version=3, protocols=(("x", b"1"),))
    assert isinstance(refused, JoinAnswer) and refused.error == E.INCONSISTENT_GROUP_PROTOCOL
    ctx.leave((two, None))
    assert ctx.group().protocol_support == Counter({"y": 1})
    ctx.restart()
    group = ctx.group()
    assert (group.protocol_support, group.supporting) == recount(group)
    assert group.supporting == 1
    # alone in the group, a member may change to any protocol
    changed = ctx.join(one, protocols=(("w", b"1"),))
    assert not (isinstance(changed, JoinAnswer) and changed.error)
