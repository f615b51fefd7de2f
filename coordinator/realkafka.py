"""Real Apache Kafka processes from the published jars: a KRaft broker, Connect distributed
workers, the perf tools, and the coordinator in proxy mode in front of them.

Used by the interop tests' fixtures, `make demo-connect` and `bench proxy`; it needs a
checkout of this repository (the jars' pom is tests/interop/pom.xml), java and mvn. Each
process writes its log (log4j2, one file per process) and its stdout (the Verifiable
connectors print one JSON line per record there) into a folder of its own, and is stopped
by its PID: SIGTERM, then SIGKILL after a grace period. Nothing here is a mock: real JVMs
on loopback ports.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
INTEROP_DIR = REPO_ROOT / "tests" / "interop"
POM = INTEROP_DIR / "pom.xml"

# Small heaps: the machine has 2 cores shared by everything; the test load is tiny.
BROKER_HEAP = "-Xmx384m"
WORKER_HEAP = "-Xmx256m"
TOOL_HEAP = "-Xmx256m"
JVM_FLAGS = ("-Xms32m", "-XX:+UseSerialGC", "-XX:+ExitOnOutOfMemoryError",
             "-Djava.awt.headless=true")

LOG4J2_TEMPLATE = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
logger.zk.name = org.apache.kafka.raft
logger.zk.level = warn
logger.jetty.name = org.eclipse.jetty
logger.jetty.level = warn
logger.reflections.name = org.reflections
logger.reflections.level = error
logger.assignor.name = org.apache.kafka.connect.runtime.distributed.IncrementalCooperativeAssignor
logger.assignor.level = debug
"""


class InteropUnavailable(Exception):
    """Java, Maven or the jars are missing: the caller skips (or fails under CI)."""


def _pom_property(name: str) -> str:
    if not POM.exists():
        raise InteropUnavailable(f"{POM} is missing: run this from a checkout of the "
                                 "repository")
    match = re.search(rf"<{re.escape(name)}>([^<]+)</{re.escape(name)}>", POM.read_text())
    if match is None:
        raise InteropUnavailable(f"no <{name}> in {POM}")
    return match.group(1).strip()


def kafka_version() -> str:
    """The release the broker, the tools and the workers run unless told otherwise."""
    return _pom_property("kafka.version")


def interop_releases() -> dict[str, bool]:
    """Every release the tests run workers of -> whether Connect's test connectors
    (VerifiableSource/Sink) are published for it (not: `4.4.0-` in the pom)."""
    return {entry.rstrip("-"): not entry.endswith("-")
            for entry in _pom_property("interop.releases").split()}


def has_test_connectors(version: str | None = None) -> bool:
    return interop_releases().get(version or kafka_version(), True)


def jars_dir(version: str | None = None) -> Path:
    return INTEROP_DIR / ".jars" / (version or kafka_version())


def ensure_jars(version: str | None = None) -> Path:
    """The folder of a release's jars (the pom's default release unless named), fetched
    with Maven first if `make interop-jars` has not run (the same command, the same stamp
    file)."""
    version = version or kafka_version()
    folder = jars_dir(version)
    stamp = folder / ".complete"
    if stamp.exists():
        return folder
    for program in ("java", "mvn"):
        if shutil.which(program) is None:
            raise InteropUnavailable(
                f"{program} is not installed (Debian: openjdk-17-jre-headless, maven); the "
                "interop tests need Apache Kafka's jars and a JVM")
    shutil.rmtree(folder, ignore_errors=True)
    completed = subprocess.run(
        ["mvn", "-q", "-B", "-Dstyle.color=never", "-f", str(POM),
         "dependency:copy-dependencies", "-DincludeScope=runtime",
         f"-Dkafka.version={version}",
         *([] if has_test_connectors(version) else ["-Dno.test.plugins"]),
         f"-DoutputDirectory=.jars/{folder.name}"],
        capture_output=True, text=True, timeout=900, check=False)
    if completed.returncode != 0:
        raise InteropUnavailable(f"mvn could not fetch the Kafka {version} jars:\n"
                                 f"{completed.stdout}{completed.stderr}")
    stamp.touch()
    return folder


def require_java() -> None:
    if shutil.which("java") is None:
        raise InteropUnavailable("java is not installed (Debian: openjdk-17-jre-headless)")


# Kafka 3.x brings its own SLF4J binding (reload4j, unconfigured here) beside the log4j2
# one the pom adds; SLF4J 1.7 takes whichever the class path lists first, so with both
# a process could log nowhere its log file is looked for. Only the log4j2 one is kept.
OTHER_SLF4J_BINDING = re.compile(r"^slf4j-(?:reload4j|log4j12)-.*\.jar$")


def classpath(version: str | None = None) -> str:
    folder = ensure_jars(version)
    jars = sorted(path.name for path in folder.glob("*.jar"))
    if not any(name.startswith("log4j-slf4j-impl-") for name in jars):
        return str(folder / "*")
    return os.pathsep.join(str(folder / name) for name in jars
                           if not OTHER_SLF4J_BINDING.match(name))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def free_port_block(count: int, host: str = "127.0.0.1") -> int:
    """A port P such that P .. P+count-1 were all free a moment ago (the proxy maps
    upstream node N to its listen port + 1 + N)."""
    for _ in range(200):
        base = free_port(host)
        if base + count > 65535:
            continue
        sockets: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                probe = socket.socket()
                sockets.append(probe)
                probe.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for probe in sockets:
                probe.close()
    raise RuntimeError(f"no block of {count} free ports found")


def wait_for(predicate: Any, timeout_s: float, what: str, interval_s: float = 0.2,
             process: ManagedProcess | None = None,
             explain: Callable[[], str] | None = None) -> Any:
    """Poll until `predicate()` is truthy; fail with `what`, then what `explain()` says of
    the state it ended in (on the same line: a CI log keeps a failure's summary line), and
    the process's log tail."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if process is not None and process.exited():
            raise RuntimeError(f"{process.name} exited ({process.popen.returncode}) while "
                               f"waiting for {what}\n{process.tail()}")
        if time.monotonic() > deadline:
            state = f" ({explain()})" if explain is not None else ""
            tail = f"\n{process.tail()}" if process is not None else ""
            raise TimeoutError(
                f"timed out after {timeout_s:.0f} s waiting for {what}{state}{tail}")
        time.sleep(interval_s)


@dataclass
class ManagedProcess:
    """A child process with its output in files; `stop()` signals its PID only."""

    name: str
    popen: subprocess.Popen[bytes]
    folder: Path
    stdout_path: Path
    log_path: Path
    # When a process writing to this log was SIGKILLed (epoch s), this one or one before
    # it: what it ran then ended then, with no log line to say so.
    killed_at: list[float] = field(default_factory=list)

    def exited(self) -> bool:
        return self.popen.poll() is not None

    def stop(self, grace_s: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL after `grace_s`; returns the exit code."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.popen.returncode

    def kill(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signal.SIGKILL)
                self.killed_at.append(time.time())
            self.popen.wait(timeout=30)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stdout_text(self) -> str:
        return (self.stdout_path.read_text(errors="replace")
                if self.stdout_path.exists() else "")

    def tail(self, lines: int = 40) -> str:
        text = self.log_text() + self.stdout_text()
        return "\n".join(text.splitlines()[-lines:])


def stop_together(processes: Sequence[ManagedProcess], grace_s: float = 30.0) -> None:
    """SIGTERM to all at once, then SIGKILL to those still running after `grace_s`:
    workers that shut down side by side take one grace period, not one each."""
    for process in processes:
        if process.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.popen.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()


def start_process(name: str, command: Sequence[str], folder: Path,
                  log_path: Path | None = None, env: dict[str, str] | None = None
                  ) -> ManagedProcess:
    folder.mkdir(parents=True, exist_ok=True)
    stdout_path = folder / "stdout.txt"
    with open(stdout_path, "ab") as stdout:
        # A session of its own: a Ctrl-C in the terminal reaches only the parent, which
        # stops its children in order (workers before the broker they need to leave).
        popen = subprocess.Popen(list(command), stdout=stdout, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, cwd=folder, env=env,
                                 start_new_session=True)
    return ManagedProcess(name, popen, folder, stdout_path, log_path or stdout_path)


def java_command(main_class: str, heap: str, folder: Path, *args: str,
                 log_level: str = "INFO", version: str | None = None
                 ) -> tuple[list[str], Path]:
    """`java ... MAIN ARGS` with a log4j2 config that writes `<folder>/server.log`, on a
    release's jars (the default one unless `version` names another)."""
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / "server.log"
    log_config = folder / "log4j2.properties"
    log_config.write_text(LOG4J2_TEMPLATE.format(log_file=log_path, level=log_level))
    command = ["java", heap, *JVM_FLAGS, f"-Dlog4j2.configurationFile={log_config}",
               "-cp", classpath(version), main_class, *args]
    return command, log_path


def write_properties(path: Path, values: dict[str, object]) -> Path:
    path.write_text("".join(f"{key}={value}\n" for key, value in values.items()))
    return path


# -- the broker ---------------------------------------------------------------------------


@dataclass
class Broker:
    process: ManagedProcess
    host: str
    port: int
    node_id: int

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        self.process.stop()


def start_broker(folder: Path, node_id: int = 1, host: str = "127.0.0.1",
                 timeout_s: float = 90.0) -> Broker:
    """A single-node KRaft broker+controller, formatted fresh in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    port, controller_port = free_port(host), free_port(host)
    properties = write_properties(folder / "server.properties", {
        "process.roles": "broker,controller",
        "node.id": node_id,
        "controller.quorum.voters": f"{node_id}@{host}:{controller_port}",
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": folder / "data",
        "num.partitions": 1,
        "offsets.topic.replication.factor": 1,
        "offsets.topic.num.partitions": 4,
        "transaction.state.log.replication.factor": 1,
        "transaction.state.log.min.isr": 1,
        "transaction.state.log.num.partitions": 2,
        "share.coordinator.state.topic.replication.factor": 1,
        "share.coordinator.state.topic.min.isr": 1,
        "group.initial.rebalance.delay.ms": 0,
        "auto.create.topics.enable": "true",
    })
    cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
    format_command, _ = java_command("kafka.tools.StorageTool", TOOL_HEAP, folder / "format",
                                     # (joined: an id may start with "-")
                                     "format", f"--cluster-id={cluster_id}", "-c",
                                     str(properties))
    formatted = subprocess.run(format_command, capture_output=True, text=True, timeout=120,
                               check=False)
    if formatted.returncode != 0:
        raise RuntimeError(f"kafka-storage format failed:\n{formatted.stdout}{formatted.stderr}")
    command, log_path = java_command("kafka.Kafka", BROKER_HEAP, folder, str(properties))
    process = start_process("broker", command, folder, log_path)
    try:
        wait_for(lambda: "Kafka Server started" in process.log_text(), timeout_s,
                 "the broker to start", process=process)
    except BaseException:
        process.stop()
        raise
    return Broker(process, host, port, node_id)


# -- the coordinator in proxy mode ---------------------------------------------------------


@dataclass
class Coordinator:
    process: ManagedProcess
    host: str
    port: int
    admin_port: int

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://{self.host}:{self.admin_port}"

    def stop(self) -> None:
        self.process.stop()

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.admin_url}/metrics", timeout=10) as response:
            return str(response.read().decode())

    def admin(self, path: str) -> Any:
        """GET on the admin API, as JSON."""
        with urllib.request.urlopen(f"{self.admin_url}{path}", timeout=10) as response:
            return json.loads(response.read().decode())


def start_coordinator(folder: Path, upstream: str, groups: str, *, host: str = "127.0.0.1",
                      extra: Sequence[str] = (), timeout_s: float = 30.0,
                      port: int | None = None, admin_port: int | None = None,
                      data_dir: Path | None = None, checkout: Path = REPO_ROOT
                      ) -> Coordinator:
    """`connect-coordinator serve --upstream ...` on a block of free ports: its listen
    port, then one per upstream node id (node N at listen port + 1 + N). In memory, or
    on `data_dir` (a restart on the same ports and data dir carries on where it was).
    The code is this checkout's, or another's (`checkout`: before/after benchmarks)."""
    port = port if port is not None else free_port_block(8, host)
    admin_port = admin_port if admin_port is not None else free_port(host)
    storage = ["--data-dir", str(data_dir)] if data_dir is not None else ["--in-memory"]
    command = [sys.executable, "-m", "coordinator.cli", "serve",
               "--listen", f"{host}:{port}", "--admin-listen", f"{host}:{admin_port}",
               *storage, "--upstream", upstream, "--set", f"proxy.groups={groups}",
               "--log-format", "json", *extra]
    env = dict(os.environ, PYTHONPATH=str(checkout))
    process = start_process("coordinator", command, folder, env=env)

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"http://{host}:{admin_port}/readyz", timeout=2):
                return True
        except (OSError, urllib.error.URLError):
            return False

    try:
        wait_for(ready, timeout_s, "the coordinator to be ready", process=process)
    except BaseException:
        process.stop()
        raise
    return Coordinator(process, host, port, admin_port)


# -- Connect workers -----------------------------------------------------------------------


# Connect 4.3.1 at times hangs on SIGTERM: Jetty's own shutdown hook and Connect's stop
# its REST server at once, one fails with this, and the other waits until it is killed
# (the herder and its tasks run on meanwhile). A clean bounce is then a kill.
STOP_HUNG = "WARN Unable to destroy (org.eclipse.jetty.util.component.ContainerLifeCycle)"


class StopHung(RuntimeError):
    """A worker asked to stop cleanly did not, and was killed."""


@dataclass
class Worker:
    process: ManagedProcess
    host: str
    rest_port: int
    properties: dict[str, object] = field(default_factory=dict)
    kafka_version: str | None = None  # the release it runs (None: the default one)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.rest_port}"

    def stop(self) -> None:
        self.process.stop(grace_s=30)

    def stop_cleanly(self, grace_s: float = 30.0) -> None:
        """SIGTERM, as a clean bounce: StopHung if it had to be killed after `grace_s`."""
        kills = len(self.process.killed_at)
        self.process.stop(grace_s=grace_s)
        if len(self.process.killed_at) > kills:
            hung = STOP_HUNG in self.process.log_text()
            raise StopHung(
                f"{self.process.name} did not stop within {grace_s:.0f} s of SIGTERM and was "
                "killed"
                + ("; Connect's REST server did not stop (Jetty: 'Unable to destroy', a "
                   "race of its shutdown hook with Connect's)" if hung else ""))

    def rest(self, method: str, path: str, body: Any = None, timeout_s: float = 30.0) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            text = response.read().decode()
        return json.loads(text) if text else None


def worker_properties(bootstrap: str, group: str, rest_port: int, host: str = "127.0.0.1",
                      topic_prefix: str | None = None) -> dict[str, object]:
    prefix = topic_prefix or group
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "config.storage.topic": f"{prefix}-configs",
        "config.storage.replication.factor": 1,
        "offset.storage.topic": f"{prefix}-offsets",
        "offset.storage.replication.factor": 1,
        "offset.storage.partitions": 2,
        "status.storage.topic": f"{prefix}-status",
        "status.storage.replication.factor": 1,
        "status.storage.partitions": 2,
        "listeners": f"http://{host}:{rest_port}",
        "rest.advertised.host.name": host,
        "rest.advertised.port": rest_port,
        "offset.flush.interval.ms": 2000,
        "scheduled.rebalance.max.delay.ms": 5000,
        "plugin.discovery": "service_load",
    }


def start_worker(folder: Path, bootstrap: str, group: str, *, host: str = "127.0.0.1",
                 overrides: dict[str, object] | None = None, wait: bool = True,
                 kafka_version: str | None = None) -> Worker:
    """A Connect distributed worker (of the default release, or `kafka_version`'s);
    returns once its REST API answers (it may still be joining its group), or at once
    without `wait` (then call `wait_answering`)."""
    rest_port = free_port(host)
    properties = worker_properties(bootstrap, group, rest_port, host)
    properties.update(overrides or {})
    folder.mkdir(parents=True, exist_ok=True)
    path = write_properties(folder / "worker.properties", properties)
    command, log_path = java_command("org.apache.kafka.connect.cli.ConnectDistributed",
                                     WORKER_HEAP, folder, str(path), version=kafka_version)
    process = start_process(f"worker:{rest_port}", command, folder, log_path)
    worker = Worker(process, host, rest_port, properties, kafka_version)
    if wait:
        try:
            wait_answering(worker)
        except BaseException:
            process.stop()
            raise
    return worker


def restart_worker(worker: Worker, *, wait: bool = True) -> Worker:
    """The same worker (folder, properties, REST port) started again after it stopped;
    its log and stdout files grow on."""
    assert worker.process.exited(), "stop or kill the worker first"
    folder = worker.process.folder
    path = write_properties(folder / "worker.properties", worker.properties)
    command, log_path = java_command("org.apache.kafka.connect.cli.ConnectDistributed",
                                     WORKER_HEAP, folder, str(path),
                                     version=worker.kafka_version)
    process = start_process(worker.process.name, command, folder, log_path)
    process.killed_at = worker.process.killed_at  # (the same log file)
    again = Worker(process, worker.host, worker.rest_port, worker.properties,
                   worker.kafka_version)
    if wait:
        try:
            wait_answering(again)
        except BaseException:
            process.stop()
            raise
    return again


def wait_answering(worker: Worker, timeout_s: float = 120.0) -> None:
    def answers() -> bool:
        try:
            worker.rest("GET", "/", timeout_s=2)
            return True
        except (OSError, urllib.error.URLError, ValueError):
            return False

    wait_for(answers, timeout_s, f"worker {worker.url} to answer REST",
             process=worker.process)


def start_workers(root: Path, count: int, bootstrap: str, group: str,
                  started: list[Any], **options: Any) -> list[Worker]:
    """`count` workers started side by side (appended to `started` at once, so a
    failure still stops them), each in `root/worker-N`."""
    workers = []
    for index in range(count):
        worker = start_worker(root / f"worker-{index + 1}", bootstrap, group, wait=False,
                              **options)
        started.append(worker)
        workers.append(worker)
    for worker in workers:
        wait_answering(worker)
    return workers


VERIFIABLE_SOURCE = "org.apache.kafka.connect.tools.VerifiableSourceConnector"
VERIFIABLE_SINK = "org.apache.kafka.connect.tools.VerifiableSinkConnector"

# The project's own pair (tests/interop/connectors), for the releases Connect's test
# connectors are not published for: the same JSON lines on the worker's stdout (the
# source's task number and sequence number per record; "committed" once acknowledged, the
# sink's "flushed"), the source resuming after its last committed number.
OWN_CONNECTORS_SOURCES = INTEROP_DIR / "connectors"
OWN_SOURCE = "connectcoordinator.verify.SeqnoSourceConnector"
OWN_SINK = "connectcoordinator.verify.SeqnoSinkConnector"
OWN_CONNECTORS_JAR = "seqno-connectors.jar"


@dataclass(frozen=True)
class VerifiableConnectors:
    """A source and a sink class that print the lines `verifiable_lines` reads, and what
    the workers need to load them."""

    source: str
    sink: str
    worker_overrides: dict[str, object] = field(default_factory=dict)


def own_connectors_dir(version: str | None = None) -> Path:
    """A plugin folder holding the project's own connectors compiled with `javac` against
    a release's jars: built at the first call for a release and the current sources, then
    kept (under tests/interop/.jars/connectors/, named by both)."""
    version = version or kafka_version()
    sources = sorted(OWN_CONNECTORS_SOURCES.rglob("*"))
    files = [path for path in sources if path.is_file()]
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(OWN_CONNECTORS_SOURCES)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    root = INTEROP_DIR / ".jars" / "connectors"
    folder = root / f"{version}-{digest.hexdigest()[:12]}"
    if (folder / OWN_CONNECTORS_JAR).exists():
        return folder
    if shutil.which("javac") is None:
        raise InteropUnavailable("javac is not installed (Debian: openjdk-17-jdk-headless); "
                                 "the project's test connectors are compiled with it")
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".build-") as scratch:
        classes = Path(scratch) / "classes"
        compiled = subprocess.run(
            ["javac", "-nowarn", "-encoding", "UTF-8", "-cp", classpath(version),
             "-d", str(classes),
             *(str(path) for path in files if path.suffix == ".java")],
            capture_output=True, text=True, timeout=300, check=False)
        if compiled.returncode != 0:
            raise RuntimeError(f"javac could not compile {OWN_CONNECTORS_SOURCES} against "
                               f"Kafka {version}:\n{compiled.stdout}{compiled.stderr}")
        built = Path(scratch) / "plugin"
        built.mkdir()
        resources = OWN_CONNECTORS_SOURCES / "resources"
        with zipfile.ZipFile(built / OWN_CONNECTORS_JAR, "w") as jar:
            for base in (classes, resources):
                for path in sorted(base.rglob("*")):
                    if path.is_file():
                        jar.write(path, str(path.relative_to(base)))
        try:
            built.rename(folder)
        except OSError:  # built at the same moment by another process: theirs will do
            if not (folder / OWN_CONNECTORS_JAR).exists():
                raise
    return folder


def verifiable_connectors(version: str | None = None, *, own: bool = False
                          ) -> VerifiableConnectors:
    """Connect's test connectors where the release has them published (and not `own`),
    else the project's own, on the workers' plugin path."""
    if not own and has_test_connectors(version):
        return VerifiableConnectors(VERIFIABLE_SOURCE, VERIFIABLE_SINK)
    return VerifiableConnectors(OWN_SOURCE, OWN_SINK,
                                {"plugin.path": str(own_connectors_dir(version))})


def connector_states(worker: Worker, name: str) -> dict[str, Any] | None:
    """`GET /connectors/NAME/status`, or None while Connect cannot answer it."""
    try:
        status: dict[str, Any] = worker.rest("GET", f"/connectors/{name}/status", timeout_s=10)
    except (OSError, urllib.error.URLError, ValueError):
        return None
    return status


def all_running(worker: Worker, name: str, tasks: int) -> dict[str, Any] | None:
    """The status when the connector and exactly `tasks` tasks are RUNNING, else None."""
    status = connector_states(worker, name)
    if status is None or status["connector"]["state"] != "RUNNING":
        return None
    states = [task["state"] for task in status["tasks"]]
    return status if states == ["RUNNING"] * tasks else None


def verifiable_lines(worker: Worker) -> list[dict[str, Any]]:
    """The JSON lines the Verifiable connectors' tasks printed on this worker's stdout."""
    lines = []
    for line in worker.process.stdout_text().splitlines():
        if line.startswith("{") and '"seqno"' in line:
            with contextlib.suppress(ValueError):
                lines.append(json.loads(line))
    return lines


@contextlib.contextmanager
def stopping(processes: list[Any]) -> Iterator[list[Any]]:
    """Stops every process appended to the list, last started first, whatever happens."""
    try:
        yield processes
    finally:
        for process in reversed(processes):
            with contextlib.suppress(Exception):
                process.stop()


def run_tool(main_class: str, folder: Path, *args: str, timeout_s: float = 180.0,
             version: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run one of kafka-tools' programs to completion (its output in the result), of the
    default release or `version`'s."""
    command, _ = java_command(main_class, TOOL_HEAP, folder, *args, log_level="WARN",
                              version=version)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                          check=False)


# -- what the workers' logs say ------------------------------------------------------------

LOG_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] \w+ (.*)$")
TASK_STARTED = re.compile(r"^Creating task ([\w.-]+-\d+)$")
# A run ends with the last of these: the worker stops the task, the stop completes, the
# task's producer (source) or consumer (sink) is closed.
TASK_STOPPING = (
    re.compile(r"^Stopping task ([\w.-]+-\d+)$"),
    re.compile(r"^Graceful stop of task ([\w.-]+-\d+) succeeded"),
    re.compile(r"^App info kafka\.(?:producer|consumer) for "
               r"connector-(?:producer|consumer)-([\w.-]+-\d+) unregistered$"),
)

# Connect gave up waiting for the task to stop (task.shutdown.graceful.timeout.ms): it
# cancels the task, completes the revocation without it, and its clients close whenever
# the task's thread gets to it (after a coordinator or broker outage, tens of seconds on).
TASK_ABANDONED = re.compile(r"^Graceful stop of task ([\w.-]+-\d+) failed")

TaskRuns = dict[str, list[tuple[float, float]]]


def log_time(stamp: str) -> float:
    """A log line's time stamp (the machine's local time) as epoch seconds."""
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def task_intervals(log_text: str, kills: list[float], now: float) -> TaskRuns:
    """(start, end) of every run of each task in one worker's log, over its restarts: from
    "Creating task" to the last line that says it stopped (the stop, its completion, its
    client closed) before it starts again, or to the moment Connect gave up on it and
    cancelled it (its graceful stop failed); a run still open when the process was
    SIGKILLed ends at the kill, one still open at the end of the log ends `now`."""
    runs: dict[str, list[list[float]]] = {}
    running: dict[str, list[float]] = {}  # started, not stopping yet
    stopping: dict[str, list[float]] = {}  # the last run, while more stop lines may come
    pending_kills = sorted(kills)

    def close_killed_before(moment: float) -> None:
        while pending_kills and pending_kills[0] <= moment:
            killed_at = pending_kills.pop(0)
            for task, run in list(running.items()):
                run[1] = killed_at
                del running[task]
            stopping.clear()

    for line in log_text.splitlines():
        match = LOG_LINE.match(line)
        if match is None:
            continue
        moment, message = log_time(match.group(1)), match.group(2)
        close_killed_before(moment)
        message = message.rsplit(" (", 1)[0]  # the logger name
        if started := TASK_STARTED.match(message):
            task = started.group(1)
            if task not in running:
                run = [moment, now]
                runs.setdefault(task, []).append(run)
                running[task] = run
                stopping.pop(task, None)
            continue
        if abandoned := TASK_ABANDONED.match(message):
            task = abandoned.group(1)
            run_or_none = running.pop(task, None) or stopping.pop(task, None)
            if run_or_none is not None:
                run_or_none[1] = moment  # final: what its clients log later does not count
            continue
        for pattern in TASK_STOPPING:
            if stopped := pattern.match(message):
                task = stopped.group(1)
                run_or_none = running.pop(task, None) or stopping.get(task)
                if run_or_none is not None:
                    run_or_none[1] = moment
                    stopping[task] = run_or_none
                break
    close_killed_before(now)
    return {task: [(start, end) for start, end in task_runs] for task, task_runs in runs.items()}


def overlapping_runs(by_worker: dict[str, TaskRuns]) -> list[str]:
    """Every pair of runs of one task on two workers whose times overlap."""
    found = []
    workers = sorted(by_worker)
    for index, first in enumerate(workers):
        for second in workers[index + 1:]:
            for task, runs in by_worker[first].items():
                for start, end in runs:
                    for other_start, other_end in by_worker[second].get(task, []):
                        if start < other_end and other_start < end:
                            found.append(f"{task}: {first} [{start:.3f}, {end:.3f}] and "
                                         f"{second} [{other_start:.3f}, {other_end:.3f}]")
    return found
