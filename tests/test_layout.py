"""The package layout's import rules, read from the source with `ast` (nothing is imported):
the runtime packages never import the benchmarks, and the core state machine never imports
the shells around it (the server, the worker pool's transport)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def imported_names(source: str, module: str) -> Iterator[tuple[int, str]]:
    """(line, dotted name) for every import in `source`, the source of `module`: `import
    a.b` gives a.b; `from a import b` gives a and a.b (b may be a module); relative
    imports are resolved against `module`."""
    package = module.split(".")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield node.lineno, target
            for alias in node.names:
                yield node.lineno, f"{target}.{alias.name}"


def module_name(path: Path) -> str:
    """Dotted, `__init__` kept: a package's own relative imports resolve one level up."""
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def violations(packages: list[str], forbidden: list[str]) -> list[str]:
    found = []
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, name in imported_names(path.read_text(), module_name(path)):
                if any(name == bad or name.startswith(bad + ".") for bad in forbidden):
                    found.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return found


def test_the_runtime_packages_import_nothing_from_the_benchmarks() -> None:
    assert (ROOT / "bench" / "core.py").is_file()  # the rule below checks a real package
    assert violations(["coordinator", "protocol"], ["bench"]) == []


def test_the_core_imports_neither_the_server_nor_the_pool_transport() -> None:
    assert violations(["coordinator/core"],
                      ["coordinator.server", "coordinator.assignors.transport"]) == []


@pytest.mark.parametrize(("source", "module", "expected"), [
    ("import bench.core", "coordinator.cli", "bench.core"),
    ("from bench import log", "protocol.framing", "bench.log"),
    ("from coordinator.assignors import transport", "coordinator.core.group",
     "coordinator.assignors.transport"),
    ("from ..server import runtime", "coordinator.core.group", "coordinator.server.runtime"),
    ("from .. import server", "coordinator.core.__init__", "coordinator.server"),
    ("def f():\n    import bench\n", "coordinator.cli", "bench"),
])
def test_the_scan_sees_every_form_of_import(source: str, module: str, expected: str) -> None:
    assert expected in {name for _, name in imported_names(source, module)}
