"""Server-side assignors: the built-ins and those registered as entry points.

A plug-in registers under the ``connect_coordinator.assignors`` entry-point group; the entry
point names a class or a factory, called with no arguments, that returns an object with a
``name`` and an ``assign(spec) -> AssignmentResult`` method.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib.metadata import entry_points

from coordinator.assignors.api import ServerAssignor
from coordinator.assignors.balanced import BalancedAssignor
from coordinator.assignors.round_robin import RoundRobinAssignor

ENTRY_POINT_GROUP = "connect_coordinator.assignors"
DEFAULT_ASSIGNOR = BalancedAssignor.name

__all__ = [
    "DEFAULT_ASSIGNOR",
    "ENTRY_POINT_GROUP",
    "UnknownAssignorError",
    "builtin_assignors",
    "get_assignor",
    "load_assignors",
]


class UnknownAssignorError(ValueError):
    """No built-in assignor and no installed entry point has this name."""

    def __init__(self, name: str, known: Iterable[str] = ()) -> None:
        self.name = name
        self.known = sorted(set(known))
        listed = ", ".join(repr(k) for k in self.known) or "none"
        super().__init__(f"unknown server assignor {name!r}; known assignors: {listed}")


def builtin_assignors() -> dict[str, ServerAssignor]:
    assignors: list[ServerAssignor] = [BalancedAssignor(), RoundRobinAssignor()]
    return {assignor.name: assignor for assignor in assignors}


def get_assignor(name: str) -> ServerAssignor:
    return load_assignors([name])[name]


def load_assignors(names: Iterable[str]) -> dict[str, ServerAssignor]:
    """Resolve each name, built-ins first, then the entry points; keyed by the asked name."""
    builtins = builtin_assignors()
    plugins = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    loaded: dict[str, ServerAssignor] = {}
    for name in names:
        if name in builtins:
            loaded[name] = builtins[name]
        elif name in plugins:
            loaded[name] = _instantiate(name, plugins[name].load())
        else:
            raise UnknownAssignorError(name, set(builtins) | set(plugins))
    return loaded


def _instantiate(name: str, factory: object) -> ServerAssignor:
    if not callable(factory):
        raise TypeError(f"entry point {name!r} in {ENTRY_POINT_GROUP} is not a class or factory")
    assignor = factory()
    if not callable(getattr(assignor, "assign", None)) or not isinstance(
        getattr(assignor, "name", None), str
    ):
        raise TypeError(
            f"entry point {name!r} in {ENTRY_POINT_GROUP} did not produce a server assignor "
            "(an object with a str `name` and an `assign(spec)` method)"
        )
    result: ServerAssignor = assignor
    return result
