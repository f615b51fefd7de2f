"""The assignor registry: built-ins, entry-point plug-ins, and unknown names."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

import coordinator.assignors as registry
from coordinator.assignors import (
    ENTRY_POINT_GROUP,
    UnknownAssignorError,
    builtin_assignors,
    get_assignor,
    load_assignors,
)
from coordinator.assignors.api import AssignmentResult, AssignmentSpec
from coordinator.assignors.balanced import BalancedAssignor
from coordinator.assignors.round_robin import RoundRobinAssignor


class FakeAssignor:
    name = "fake"

    def assign(self, spec: AssignmentSpec) -> AssignmentResult:
        return AssignmentResult(target={})


def make_fake() -> FakeAssignor:
    return FakeAssignor()


NOT_AN_ASSIGNOR = object


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Installs fake entry points; returns the groups the registry asked for."""
    asked: list[str] = []
    module = __name__
    installed = [
        EntryPoint(name="fake", value=f"{module}:FakeAssignor", group=ENTRY_POINT_GROUP),
        EntryPoint(name="fake-factory", value=f"{module}:make_fake", group=ENTRY_POINT_GROUP),
        EntryPoint(name="broken", value=f"{module}:NOT_AN_ASSIGNOR", group=ENTRY_POINT_GROUP),
        EntryPoint(name="round-robin", value=f"{module}:FakeAssignor", group=ENTRY_POINT_GROUP),
    ]

    def fake_entry_points(*, group: str) -> list[EntryPoint]:
        asked.append(group)
        return [ep for ep in installed if ep.group == group]

    monkeypatch.setattr(registry, "entry_points", fake_entry_points)
    return asked


def test_builtins_are_keyed_by_their_names() -> None:
    builtins = builtin_assignors()
    assert set(builtins) == {"balanced", "round-robin"}
    assert isinstance(builtins["balanced"], BalancedAssignor)
    assert isinstance(builtins["round-robin"], RoundRobinAssignor)
    assert all(name == assignor.name for name, assignor in builtins.items())


def test_get_assignor_resolves_a_builtin() -> None:
    assert isinstance(get_assignor("balanced"), BalancedAssignor)


def test_an_unknown_name_lists_the_known_ones(plugins: list[str]) -> None:
    with pytest.raises(UnknownAssignorError) as caught:
        load_assignors(["balanced", "nope"])
    error = caught.value
    assert isinstance(error, ValueError)
    assert error.name == "nope"
    message = str(error)
    assert "'nope'" in message
    for known in ("balanced", "round-robin", "fake", "fake-factory"):
        assert f"'{known}'" in message


def test_unknown_name_without_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "entry_points", lambda *, group: [])
    with pytest.raises(UnknownAssignorError, match="known assignors: 'balanced', 'round-robin'"):
        get_assignor("sticky")


def test_entry_points_load_classes_and_factories(plugins: list[str]) -> None:
    loaded = load_assignors(["fake", "fake-factory", "balanced"])
    assert list(loaded) == ["fake", "fake-factory", "balanced"]
    assert isinstance(loaded["fake"], FakeAssignor)
    assert isinstance(loaded["fake-factory"], FakeAssignor)
    assert plugins and set(plugins) == {ENTRY_POINT_GROUP}


def test_a_builtin_wins_over_a_plugin_of_the_same_name(plugins: list[str]) -> None:
    assert isinstance(get_assignor("round-robin"), RoundRobinAssignor)


def test_an_entry_point_that_is_not_an_assignor_is_refused(plugins: list[str]) -> None:
    with pytest.raises(TypeError, match="'broken'"):
        get_assignor("broken")
