"""The unit of work a Connect group shares: a connector instance or one of its tasks.

A unit is ``(connector, task)``; ``task == CONNECTOR`` (-1) names the connector instance
itself, ``task >= 0`` names task ``task`` of that connector (Connect's ConnectorTaskId).
Plain tuples keep sets of units cheap to build, hash and sort.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

Unit = tuple[str, int]
CONNECTOR = -1


def units_of(connectors: Mapping[str, int]) -> frozenset[Unit]:
    """Every unit a group runs: each connector plus its tasks 0..n-1."""
    units: set[Unit] = set()
    for name, task_count in connectors.items():
        units.add((name, CONNECTOR))
        units.update((name, task) for task in range(task_count))
    return frozenset(units)


def format_unit(unit: Unit) -> str:
    name, task = unit
    return name if task == CONNECTOR else f"{name}-{task}"


def split_units(units: Iterable[Unit]) -> tuple[list[str], list[tuple[str, int]]]:
    """Sorted connectors and sorted tasks, the order they travel in on the wire."""
    connectors = sorted(name for name, task in units if task == CONNECTOR)
    tasks = sorted((name, task) for name, task in units if task != CONNECTOR)
    return connectors, tasks
