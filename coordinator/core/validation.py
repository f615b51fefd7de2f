"""Request validation: the protocol's rules (docs/protocol.md), each with its own message.

Every function raises ApiError(INVALID_REQUEST, message naming the rule) on the first
broken rule and returns nothing otherwise. They look only at the request (and, for the
limits at the end, at the counts they are given), never at state.
"""

from __future__ import annotations

import operator
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from coordinator.units import CONNECTOR, Unit
from protocol.errors import ApiError, ErrorCode

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2


def invalid(message: str) -> ApiError:
    return ApiError(ErrorCode.INVALID_REQUEST, message)


# -- ids -----------------------------------------------------------------------------------

# Characters that change how text around them is shown (bidirectional embeddings,
# overrides and isolates, and the invisible direction marks): an id holding one can be made
# to look like another in a log line or a terminal.
_BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
                           "\u2066\u2067\u2068\u2069")
# C0 and C1 controls (NUL, newline, escape, DEL, ...), and the line and paragraph separators.
_CONTROL_CATEGORIES = frozenset({"Cc", "Zl", "Zp"})


def control_character(text: str) -> str | None:
    """The first character of `text` that an id may not hold, or None."""
    if text.isprintable():  # one C-level pass for the usual id; none of them is printable
        return None
    for char in text:
        if char in _BIDI_CONTROLS or unicodedata.category(char) in _CONTROL_CATEGORIES:
            return char
    return None


def check_id(what: str, value: str | None, code: ErrorCode = ErrorCode.INVALID_REQUEST
             ) -> None:
    """Group ids, member ids, instance ids and connector names, on every surface (KRPC,
    Kafka's classic APIs, the admin API): no control characters, so that an id shows as
    what it is wherever it is logged or printed."""
    if value is None:
        return
    char = control_character(value)
    if char is not None:
        raise ApiError(code, f"{what} holds the control character U+{ord(char):04X} "
                             f"(at index {value.index(char)}); ids may not hold control "
                             "characters")


def check_ids(what: str, values: Iterable[str]) -> None:
    for value in values:
        check_id(what, value)


_connector_of = operator.attrgetter("connector")


def units_from_wire(value: Any, what: str) -> frozenset[Unit]:
    """ConnectorsAndTasks -> a set of units, rejecting empty names, bad ids and repeats."""
    units: set[Unit] = set()
    count = 0
    for name in value.connectors:
        if not name:
            raise invalid(f"{what}: connector names must be non-empty")
        units.add((name, CONNECTOR))
        count += 1
    for task in value.tasks:
        if not task.connector:
            raise invalid(f"{what}: task connector names must be non-empty")
        if task.task < 0:
            raise invalid(f"{what}: task ids must be >= 0, got {task.connector}-{task.task}")
        units.add((task.connector, task.task))
        count += 1
    if len(units) != count:
        raise invalid(f"{what}: a connector or task is listed more than once")
    # Each name once, and in one C-level pass when none holds a control character (a list
    # is up to group.connect.max.units long, mostly tasks of a few connectors).
    names = set(value.connectors)
    names.update(map(_connector_of, value.tasks))
    if not "".join(names).isprintable():
        check_ids(f"{what}: connector name", sorted(names))
    return frozenset(units)


def validate_heartbeat(request: Any) -> frozenset[Unit] | None:
    """Checks a ConnectGroupHeartbeatRequest; returns its owned units (None if not sent)."""
    if not request.group_id:
        raise invalid("GroupId must be non-empty")
    if not request.member_id:
        raise invalid("MemberId must be non-empty")
    epoch = request.member_epoch
    if epoch < STATIC_LEAVE_EPOCH:
        raise invalid(f"MemberEpoch must be >= -2, got {epoch}")
    if request.instance_id is not None and not request.instance_id:
        raise invalid("InstanceId, if provided, must be non-empty")
    check_id("GroupId", request.group_id)
    check_id("MemberId", request.member_id)
    check_id("InstanceId", request.instance_id)
    if epoch == STATIC_LEAVE_EPOCH and request.instance_id is None:
        raise invalid("MemberEpoch -2 (temporary leave) is only allowed with an InstanceId")
    if request.worker_url is not None and not request.worker_url:
        raise invalid("WorkerUrl, if provided, must be non-empty")
    timeout = request.rebalance_timeout_ms
    if epoch == JOIN_EPOCH:
        if timeout <= 0:
            raise invalid("RebalanceTimeoutMs must be larger than zero when joining")
        if request.worker_url is None:
            raise invalid("WorkerUrl must be set when joining")
    elif timeout != -1 and timeout <= 0:
        raise invalid(f"RebalanceTimeoutMs must be -1 (unchanged) or > 0, got {timeout}")
    if request.server_assignor is not None and request.client_assignors is not None:
        raise invalid("ServerAssignor and ClientAssignors cannot be used together")
    if request.server_assignor is not None and not request.server_assignor:
        raise invalid("ServerAssignor, if provided, must be non-empty")
    if request.client_assignors is not None:
        names: set[str] = set()
        for assignor in request.client_assignors:
            _validate_client_assignor(assignor)
            if assignor.name in names:
                raise invalid(f"Assignor {assignor.name!r} is listed more than once")
            names.add(assignor.name)
    owned = request.owned_connectors_and_tasks
    if owned is None:
        return None
    units = units_from_wire(owned, "OwnedConnectorsAndTasks")
    if epoch == JOIN_EPOCH and units:
        raise invalid("a joining member (MemberEpoch 0) may not own connectors or tasks")
    return units


def _validate_client_assignor(assignor: Any) -> None:
    if not assignor.name:
        raise invalid("Assignor.Name must be non-empty")
    if assignor.minimum_version < -1:
        raise invalid(f"Assignor.MinimumVersion must be >= -1 ({assignor.name})")
    if assignor.maximum_version < 0 or assignor.maximum_version < assignor.minimum_version:
        raise invalid(
            f"Assignor.MaximumVersion must be >= 0 and >= Assignor.MinimumVersion ({assignor.name})"
        )
    if not assignor.minimum_version <= assignor.version <= assignor.maximum_version:
        raise invalid(
            "Assignor.Version must be within [Assignor.MinimumVersion, "
            f"Assignor.MaximumVersion] ({assignor.name}: {assignor.version} not in "
            f"[{assignor.minimum_version}, {assignor.maximum_version}])"
        )


def validate_assignment_caller(request: Any) -> None:
    """The rules Prepare and Install share."""
    if not request.group_id:
        raise ApiError(ErrorCode.INVALID_REQUEST, "GroupId must be non-empty")
    if not request.member_id:
        raise invalid("MemberId must be non-empty")
    if request.member_epoch < 0:
        raise invalid(f"MemberEpoch must be >= 0, got {request.member_epoch}")
    check_id("GroupId", request.group_id)
    check_id("MemberId", request.member_id)


def validate_install(request: Any) -> dict[str, tuple[frozenset[Unit], int, bytes]]:
    """Checks an Install request's shape; returns member id -> (units, version, metadata)."""
    validate_assignment_caller(request)
    if request.group_epoch < 0:
        raise invalid(f"GroupEpoch must be >= 0, got {request.group_epoch}")
    parts: dict[str, tuple[frozenset[Unit], int, bytes]] = {}
    for member in request.members:
        if not member.member_id:
            raise invalid("Members[].MemberId must be non-empty")
        check_id("Members[].MemberId", member.member_id)
        if member.member_id in parts:
            raise ApiError(
                ErrorCode.INVALID_ASSIGNMENT,
                f"member {member.member_id} is given more than one assignment",
            )
        units = units_from_wire(member.assigned, f"Members[{member.member_id}].Assigned")
        parts[member.member_id] = (units, member.version, member.metadata)
    return parts


def check_classic_ids(body: Any) -> None:
    """The ids of a classic JoinGroup, SyncGroup, Heartbeat or LeaveGroup: a bad group id
    is INVALID_GROUP_ID (what Kafka answers for a group id it refuses), a bad member or
    instance id INVALID_REQUEST."""
    check_id("GroupId", body.group_id, ErrorCode.INVALID_GROUP_ID)
    check_id("MemberId", getattr(body, "member_id", None))
    check_id("GroupInstanceId", getattr(body, "group_instance_id", None))
    for member in getattr(body, "members", ()):  # LeaveGroup v3 and later
        check_id("Members[].MemberId", member.member_id)
        check_id("Members[].GroupInstanceId", member.group_instance_id)


@dataclass(frozen=True, slots=True)
class CheckedHeartbeat:
    """A heartbeat request that passed `validate_heartbeat` off the event loop, and the
    units it owns (a list of up to group.connect.max.owned.units to convert)."""

    request: Any  # the request checked (the core checks identity)
    owned: frozenset[Unit] | None


def check_heartbeat(request: Any) -> CheckedHeartbeat | None:
    """`validate_heartbeat`, ahead of the core; None if the request breaks a rule (the core
    then finds the problem again and answers with it)."""
    try:
        return CheckedHeartbeat(request, validate_heartbeat(request))
    except ApiError:
        return None


@dataclass(frozen=True, slots=True)
class CheckedInstall:
    """An Install request's members, validated and converted once, off the event loop.

    Only what depends on the request alone is here; the checks against what Prepare handed
    out stay in the core, which reads the group's state.
    """

    request: Any  # the request these parts were made from (the core checks identity)
    parts: dict[str, tuple[frozenset[Unit], int, bytes]]
    units: frozenset[Unit]  # every unit the request hands out
    overlapping: bool  # some unit is handed to two members


def install_unit_count(request: Any) -> int:
    """Units listed in an Install request: what its validation costs is proportional to."""
    return sum(len(member.assigned.connectors) + len(member.assigned.tasks)
               for member in request.members)


def check_install(request: Any) -> CheckedInstall | None:
    """`validate_install` plus the checks that need no group state; None if the request is
    malformed (the core then finds the problem again and answers with it)."""
    try:
        parts = validate_install(request)
    except ApiError:
        return None
    every: set[Unit] = set()
    listed = 0
    for units, _version, _metadata in parts.values():
        every |= units
        listed += len(units)
    return CheckedInstall(request, parts, frozenset(every), len(every) != listed)


# -- limits (their keys are public: README "Limits") ---------------------------------------


def check_group_count(groups: int, maximum: int) -> None:
    """A new group may be created while fewer than `maximum` exist."""
    if groups >= maximum:
        raise invalid(f"the coordinator holds {groups} groups, its limit "
                      f"(group.coordinator.max.groups): no new group can be created")


def check_group_units(connectors: Mapping[str, int], connector: str, tasks: int,
                      maximum: int, max_frame_bytes: int) -> None:
    """Setting `connector` to `tasks` tasks keeps the group within `maximum` units (a
    connector is one unit, each of its tasks another), and keeps the list of them small
    enough to go out in one frame (a member may be given all of them in one answer)."""
    # Every put runs this on the event loop, so it stays in C-level built-ins (sum, max,
    # map) where it can: walking every connector in Python made a put on a group of 1,000
    # connectors take 0.44 ms instead of 0.30 (`bench core --pool-run`).
    before = connectors.get(connector)
    total = len(connectors) + sum(connectors.values()) + 1 + tasks
    if before is not None:
        total -= 1 + before
    if total > maximum:
        raise invalid(f"the group would run {total} connectors and tasks, above its limit "
                      f"of {maximum} (group.connect.max.units)")
    # a task in an answer: its connector's name with its length, an int32, tagged fields.
    # With ASCII names (a byte a character), no list is longer than every unit under the
    # longest name: below that bound the exact sum is not needed.
    longest = max(len(connector), max(map(len, connectors), default=0))
    if connector.isascii() and all(map(str.isascii, connectors)) \
            and total * (longest + 6) <= max_frame_bytes:
        return
    changed = dict(connectors)
    changed[connector] = tasks
    encoded = sum((len(name.encode()) + 6) * (1 + count) for name, count in changed.items())
    if encoded > max_frame_bytes:
        raise invalid(f"the group's connectors and tasks would take {encoded} bytes to "
                      f"list, more than one frame holds ({max_frame_bytes}, "
                      "server.max.frame.bytes)")
