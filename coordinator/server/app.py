"""Assembles and runs the coordinator: runtime, KRPC listener, admin HTTP, the log."""

from __future__ import annotations

import errno
import gc
import logging
import os
import socket
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import structlog
import trio
from hypercorn.config import Config as HypercornConfig

from coordinator.assignors import load_assignors
from coordinator.config import ServerConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.log.files import FileLayer
from coordinator.log.lock import DataDirLock
from coordinator.metrics import API_NAMES, Metrics, ProxyMetrics
from coordinator.proxy.server import ProxyServer
from coordinator.proxy.wire import API_NAMES as PROXY_API_NAMES
from coordinator.server.admin import build_admin_app
from coordinator.server.admin_listener import AdminListener
from coordinator.server.kafka import KafkaServer
from coordinator.server.priority import lower_this_thread
from coordinator.server.runtime import Clock, RecordSink, Runtime
from coordinator.storage import LogReplayer, LogSink, compact_periodically, ensure_data_dir

log = structlog.get_logger("connect_coordinator")

# In `serve`'s own process, a full collection happens after this many collections of the
# middle generation instead of 10 (the young ones keep their thresholds). A full
# collection walks every object the collector tracks, holding the GIL: a client sending
# large requests back to back (a maximum Install is some 300,000 objects while it is
# decoded) set off one every few requests, 15-190 ms each, in which no heartbeat was
# answered (`bench hostile`). What the coordinator keeps is not cyclic; the cycles that
# do arise (tracebacks, mostly) die young and are found by the young collections.
FULL_COLLECTION_EVERY = 1_000
# In `serve`'s own process, a thread running Python hands the interpreter lock over after
# this long when another asks for it, instead of 5 ms. The event loop gives the lock up at
# every system call (each poll, receive and send), and while the listener's thread decodes
# a large request or builds a large describe answer, the loop waited up to the whole
# interval each time to get it back: with 1 ms, healthy heartbeats' p99 under
# `install-max`, `describe-max-ids` and `describe-largest` went from a median of 41, 27
# and 30 ms to 24, 15 and 14 ms (`bench hostile`, three alternating runs each).
SWITCH_INTERVAL_S = 0.001


def tune_serving_process() -> None:
    """Once ready, in `serve`'s own process: what start-up allocated leaves the cyclic
    collector's sight (`gc.freeze`), full collections become rare, and the interpreter lock
    changes hands sooner."""
    gc.freeze()
    young, middle, _full = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_EVERY)
    sys.setswitchinterval(SWITCH_INTERVAL_S)


@dataclass
class ServerHandle:
    runtime: Runtime
    kafka_port: int
    admin_port: int
    stop_requested: trio.Event = field(default_factory=trio.Event)

    def stop(self) -> None:
        self.stop_requested.set()


class ListenError(Exception):
    """A listener could not be opened; the message names which one, where, and why."""


def _listen_error(error: OSError, name: str, option: str, address: tuple[str, int]
                  ) -> ListenError:
    where = f"{address[0]}:{address[1]}"
    if error.errno == errno.EADDRINUSE:
        why = (f"address already in use: another program (another coordinator?) listens "
               f"there; stop it or pick another port with {option} "
               f"(make run ARGS='{option} {address[0]}:PORT')")
    elif error.errno == errno.EADDRNOTAVAIL:
        why = f"no interface of this machine has that address; fix the host in {option}"
    elif error.errno == errno.EACCES:
        why = f"permission denied (ports below 1024 need privileges); pick another with {option}"
    else:
        why = f"{error.strerror or error}; check {option}"
    return ListenError(f"cannot open the {name} on {where}: {why}")


async def open_kafka_listeners(address: tuple[str, int]) -> list[trio.SocketListener]:
    try:
        return await trio.open_tcp_listeners(address[1], host=address[0])
    except OSError as error:
        raise _listen_error(error, "Kafka listener", "--listen", address) from error


def open_admin_socket(address: tuple[str, int]) -> socket.socket:
    """The admin listener's socket, bound and listening (`AdminListener` serves it)."""
    host, port = address
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as hypercorn's own
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
    except OSError as error:
        sock.close()
        raise _listen_error(error, "admin HTTP listener", "--admin-listen", address) \
            from error
    return sock


def parse_address(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


async def run_server(
    config: ServerConfig,
    listen: tuple[str, int],
    admin_listen: tuple[str, int],
    data_dir: Path | None = None,
    *,
    clock: Clock | None = None,
    sink: RecordSink | None = None,
    file_layer: FileLayer | None = None,
    tune_process: bool = False,
    task_status: trio.TaskStatus[ServerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until `ServerHandle.stop()`, then shut down gracefully.

    With a data dir the state lives in the record log there: it is replayed before the
    server reports ready (KRPC answers COORDINATOR_LOAD_IN_PROGRESS meanwhile).
    `file_layer` replaces the OS file layer under the log (tests inject faults with it).
    `tune_process`: the process is the coordinator's own (`serve`): the log's load may
    pause the cyclic collector and freeze what it loaded (`LogReplayer`), and once ready
    full collections become rare and the interpreter lock changes hands sooner
    (`tune_serving_process`); the assignor pool's processes and the log's flush thread run
    at background priority (`coordinator.server.priority`). Library callers and tests leave
    their process alone.
    """
    # Both listeners first: a port in use stops start-up at once, before the log loads.
    kafka_listeners = await open_kafka_listeners(listen)
    try:
        admin_socket = open_admin_socket(admin_listen)
    except BaseException:
        for bound in kafka_listeners:
            bound.socket.close()
        raise
    # One coordinator per data directory: a second one's appends would interleave.
    data_dir_lock: DataDirLock | None = None
    try:
        if sink is None and data_dir is not None:
            ensure_data_dir(data_dir)
            data_dir_lock = DataDirLock.acquire(data_dir)
        core = GroupCoordinator(config, load_assignors(config.server_assignors))
        metrics = Metrics(lambda: core, per_group_max=config.metrics_per_group_max,
                          data_dir=data_dir if sink is None else None)
        log_sink: LogSink | None = None
        loader: LogReplayer | None = None
        if sink is None and data_dir is not None:
            log_sink = LogSink(None, lambda: runtime.now_ms(), metrics,
                               flush_thread_init=lower_this_thread if tune_process else None)
            loader = LogReplayer(data_dir, config, log_sink, file_layer,
                                    freeze_loaded=tune_process)
            sink = log_sink
        runtime = Runtime(core, config, sink, clock, loader=loader, metrics=metrics,
                          background_priority=tune_process)
        if log_sink is not None:
            log_sink.on_failure = runtime.roll_back_writes
        kafka = KafkaServer(runtime)
        listener: KafkaServer | ProxyServer = kafka
        if config.proxy_mode:  # in front of a real Kafka cluster; owned groups answered here
            proxy_metrics = ProxyMetrics(metrics.registry, {**PROXY_API_NAMES, **API_NAMES})
            listener = ProxyServer(kafka, config, proxy_metrics)
        proxy = listener if isinstance(listener, ProxyServer) else None
        admin_stopped = trio.Event()
        http_config = HypercornConfig()
        http_config.accesslog = None
        http_config.errorlog = logging.getLogger("hypercorn.error")
        http_config.graceful_timeout = config.shutdown_timeout_ms / 1000
        async with trio.open_nursery() as nursery:
            if log_sink is not None:
                await nursery.start(log_sink.run)
            await nursery.start(runtime.run)
            kafka_port = await nursery.start(partial(listener.serve, listen[0], listen[1],
                                                     listeners=kafka_listeners))
            # The listener takes over a duplicate of the bound socket (it closes it).
            admin_listener = trio.SocketListener(
                trio.socket.from_stdlib_socket(socket.socket(fileno=os.dup(admin_socket.fileno()))))
            await nursery.start(partial(
                AdminListener(build_admin_app(runtime, proxy), http_config, config).serve,
                admin_listener, shutdown_trigger=admin_stopped.wait))
            admin_port = int(admin_socket.getsockname()[1])
            handle = ServerHandle(runtime, kafka_port, admin_port)
            await runtime.wait_ready()
            if tune_process:
                tune_serving_process()
            if log_sink is not None:  # compaction runs in a thread, never on the request path
                nursery.start_soon(compact_periodically, log_sink, config, runtime.now_ms,
                                   metrics)
            log.info("ready", listen=f"{listen[0]}:{kafka_port}",
                     admin=f"http://{admin_listen[0]}:{admin_port}",
                     data_dir=str(data_dir) if data_dir else None,
                     groups=len(core.group_ids()), members=core.member_count(),
                     classic_groups=len(core.classic.store.groups),
                     classic_members=core.classic.store.member_count())
            task_status.started(handle)
            await handle.stop_requested.wait()
            log.info("shutting_down", in_flight=kafka.in_flight)
            await listener.drain(config.shutdown_timeout_ms / 1000)
            admin_stopped.set()
            await runtime.close()
            nursery.cancel_scope.cancel()
    finally:
        if data_dir_lock is not None:
            data_dir_lock.release()
        admin_socket.close()
        for bound in kafka_listeners:
            bound.socket.close()  # already closed when kafka.serve ran; harmless then
    log.info("stopped")
