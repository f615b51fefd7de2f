"""`round-robin`: eager and deterministic, like Connect's EagerAssignor.

Members are sorted by id; connectors (by name) are dealt round-robin over them, then tasks (by
connector, then task) continue where the connectors stopped. The previous target is ignored,
so any change may move every unit; use `balanced` to keep units where they are.
"""

from __future__ import annotations

from coordinator.assignors.api import AssignmentResult, AssignmentSpec
from coordinator.units import CONNECTOR, Unit


class RoundRobinAssignor:
    name = "round-robin"

    def assign(self, spec: AssignmentSpec) -> AssignmentResult:
        members = sorted(spec.members)
        if not members:
            return AssignmentResult(target={})
        connectors = sorted(spec.connectors)
        units: list[Unit] = [(name, CONNECTOR) for name in connectors]
        for name in connectors:
            units.extend((name, task) for task in range(spec.connectors[name]))
        # member i takes units i, i + n, i + 2n, ...: exactly dealing one at a time
        count = len(members)
        return AssignmentResult(
            target={member: frozenset(units[i::count]) for i, member in enumerate(members)}
        )
