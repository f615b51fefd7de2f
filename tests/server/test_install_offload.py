"""Large client-side Installs are checked in a thread, and answered as usual."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio

from coordinator.config import ServerConfig
from coordinator.server import runtime as runtime_module
from coordinator.server.app import ServerHandle, run_server
from coordinator.units import units_of
from coordinator.workers.assignors import IncrementalCooperativeAssignor
from coordinator.workers.registry import UnitRegistry
from coordinator.workers.state import WorkerConfig
from coordinator.workers.worker import Worker

pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning")

CONFIG = ServerConfig(assignment_interval_ms=0, assignor_offload_enable=False,
                      heartbeat_interval_ms=100, session_timeout_ms=2_000,
                      shutdown_timeout_ms=500)
CONNECTORS = {"A": 6, "B": 4}


@pytest.mark.parametrize("threshold", [1, 10_000])
async def test_installs_above_the_threshold_are_checked_in_a_thread(
        nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, threshold: int) -> None:
    threads: list[bool] = []
    real_check = runtime_module.check_install

    def spying_check(request: Any) -> Any:
        threads.append(threading.current_thread() is not threading.main_thread())
        return real_check(request)

    monkeypatch.setattr(runtime_module, "check_install", spying_check)
    handle: ServerHandle = await nursery.start(run_server, CONFIG, ("127.0.0.1", 0),
                                               ("127.0.0.1", 0))
    handle.runtime.install_offload_units = threshold
    for name, tasks in CONNECTORS.items():
        await handle.runtime.put_connector("g", name, tasks)
    registry = UnitRegistry()
    workers = [
        Worker(WorkerConfig(group_id="g", worker_url=f"http://w{i}:8083", member_id=f"w{i}",
                            session_timeout_ms=2_000),
               registry, address=("127.0.0.1", handle.kafka_port),
               assignors=[IncrementalCooperativeAssignor(0)], name=f"w{i}")
        for i in range(3)]
    for worker in workers:
        nursery.start_soon(worker.run)
    everything = units_of(CONNECTORS)

    def converged() -> bool:
        return (handle.runtime.core.describe_group("g").group_state == "STABLE"
                and set(registry.running()) == everything)

    with trio.fail_after(15):
        while not converged():  # noqa: ASYNC110 - polls state owned by other tasks
            await trio.sleep(0.05)
    assert all(len(holders) == 1 for holders in registry.running().values())
    if threshold == 1:
        assert threads and all(threads)  # every Install was checked, off the loop
    else:
        assert threads == []  # small Installs are checked inline by the core
    for worker in workers:
        worker.shutdown()
    handle.stop()
