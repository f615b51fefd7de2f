"""Fixtures for the interop tests: one real KRaft broker per session, workers and
coordinators per test, all stopped by PID whatever the outcome.

Without java (or without mvn and the jars not yet fetched) the tests skip, and fail
under CI=true, where `make test` fetches the jars first.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.realkafka import (
    Broker,
    InteropUnavailable,
    ensure_jars,
    require_java,
    start_broker,
)
from tests.programs import in_ci


def _require_interop() -> None:
    try:
        require_java()
        ensure_jars()
    except InteropUnavailable as error:
        if in_ci():
            pytest.fail(f"{error} and CI is set: the interop tests must run in CI")
        pytest.skip(str(error))


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    _require_interop()
    folder = tmp_path_factory.mktemp("kafka-broker")
    broker = start_broker(folder)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def processes() -> Iterator[list[object]]:
    """Append every process a test starts: they are stopped (SIGTERM, then SIGKILL) when
    the test ends, last started first."""
    started: list[object] = []
    try:
        yield started
    finally:
        for process in reversed(started):
            try:
                process.stop()  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - stop the others all the same
                pass


@pytest.fixture
def interop_dir(tmp_path: Path) -> Path:
    return tmp_path
