"""Small builders shared by the worker tests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from coordinator.units import CONNECTOR, Unit
from coordinator.workers.assignors import GroupMember, GroupView


def units(*names: str) -> frozenset[Unit]:
    """units("A", "A-0", "B-1") -> {("A", -1), ("A", 0), ("B", 1)}."""
    result: set[Unit] = set()
    for name in names:
        connector, _, task = name.partition("-")
        result.add((connector, int(task)) if task else (connector, CONNECTOR))
    return frozenset(result)


def view(all_units: Iterable[Unit], targets: Mapping[str, Iterable[Unit]],
         urls: Mapping[str, str] | None = None, epoch: int = 10,
         assignor: str = "incremental-cooperative", version: int = 2) -> GroupView:
    """A Prepare response as the assignor sees it; urls default to http://<id>:8083."""
    urls = urls or {}
    members = tuple(
        GroupMember(member_id=mid, worker_url=urls.get(mid, f"http://{mid}:8083"),
                    instance_id=None, version=version, reason=0, metadata=b"",
                    target=frozenset(target))
        for mid, target in sorted(targets.items())
    )
    return GroupView(epoch, assignor, frozenset(all_units), members)


def kinds(assigned: Iterable[Unit]) -> tuple[int, int]:
    """(connectors, tasks) in a set of units."""
    unit_list = list(assigned)
    connectors = sum(1 for _, task in unit_list if task == CONNECTOR)
    return connectors, len(unit_list) - connectors
