"""What each worker of a classic group holds, read from the bytes the group keeps.

A classic group hands the leader's assignment bytes out verbatim, so the coordinator
never needs to read them to run the group. The admin API does, to say which worker runs
which connector and task: Connect's bytes (`coordinator/connect_protocol.py`) tell it.

With the incremental cooperative protocols (versions 1 and 2) a worker's JoinGroup
metadata carries what it held when it joined (its allocation), and its assignment is a
change: units to start (`assigned`) and units to stop (`revoked`). So a member holds
allocation - revoked + assigned once it has synced the generation, and its allocation
while a join phase is in progress. With the eager protocol (version 0) the assignment
is the whole of what it holds, and a member that rejoins holds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.connect_protocol import (
    EAGER_VERSION,
    ConnectProtocolError,
    decode_assignment,
    decode_worker_metadata,
)
from coordinator.core.classic.state import ClassicGroup, protocol_metadata
from coordinator.units import Unit

NO_UNITS: frozenset[Unit] = frozenset()


@dataclass(frozen=True, slots=True)
class ClassicMemberView:
    member_id: str
    instance_id: str | None
    client_id: str
    worker_url: str
    holds: frozenset[Unit]
    joined_generation: int
    synced_generation: int


def member_views(group: ClassicGroup) -> list[ClassicMemberView]:
    """Every member (not those only told MEMBER_ID_REQUIRED), with what it holds. Bytes
    that are not Connect's (another client's) give no url and no units."""
    generation = group.meta.generation
    views = []
    for member_id, member in group.active().items():
        url, holds = "", NO_UNITS
        try:
            metadata = decode_worker_metadata(protocol_metadata(member, group.meta.protocol_name))
            url = metadata.url
            held = metadata.allocation.assigned if metadata.allocation else NO_UNITS
            if metadata.version == EAGER_VERSION and member.joined_generation > generation:
                held = NO_UNITS  # an eager worker stops everything before it rejoins
            elif (member.joined_generation <= generation
                  and member.synced_generation == generation
                  and member.assignment_generation == generation and member.assignment):
                assignment = decode_assignment(member.assignment)
                if assignment.version == EAGER_VERSION:
                    held = assignment.assigned
                else:
                    held = (held - assignment.revoked) | assignment.assigned
            holds = frozenset(held)
        except ConnectProtocolError:
            pass
        views.append(ClassicMemberView(member_id, member.instance_id, member.client_id, url,
                                       holds, member.joined_generation,
                                       member.synced_generation))
    return views


__all__ = ["ClassicMemberView", "member_views"]
