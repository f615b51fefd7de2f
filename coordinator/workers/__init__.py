"""Simulated Kafka Connect workers: Connect's metadata encodings, its client-side assignors,
a sans-IO worker state machine and a trio worker built on it."""

from coordinator.workers.assignors import (
    EagerAssignor,
    IncrementalCooperativeAssignor,
    eager_assign,
    incremental_cooperative_assign,
)
from coordinator.workers.registry import UnitRegistry
from coordinator.workers.state import Actions, Phase, WorkerConfig, WorkerState
from coordinator.workers.worker import Worker, WorkerFailed

__all__ = [
    "Actions",
    "EagerAssignor",
    "IncrementalCooperativeAssignor",
    "Phase",
    "UnitRegistry",
    "Worker",
    "WorkerConfig",
    "WorkerFailed",
    "WorkerState",
    "eager_assign",
    "incremental_cooperative_assign",
]
