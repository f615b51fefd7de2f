"""`make demo-connect`: a local real cluster to point at.

Starts, from Apache Kafka's published jars (fetched by `make interop-jars`): a KRaft broker,
this coordinator in proxy mode in front of it, and three Connect distributed workers whose
`bootstrap.servers` is the coordinator; then creates a VerifiableSource (6 tasks) and a
VerifiableSink, waits until every task is RUNNING, prints where to look, and keeps running
until Ctrl-C (or stops at once with --no-wait). Everything lives in --dir (default
./run/demo-connect): each process's properties, log and stdout.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from coordinator.realkafka import (
    VERIFIABLE_SINK,
    VERIFIABLE_SOURCE,
    InteropUnavailable,
    all_running,
    ensure_jars,
    require_java,
    start_broker,
    start_coordinator,
    start_workers,
    stopping,
    wait_for,
)

GROUP = "connect-demo"
TOPIC = "demo-verifiable"


def _command() -> str:
    """The full path of the `connect-coordinator` command next to this Python: a checkout's
    `.venv/bin` is not on PATH."""
    script = Path(sys.executable).parent / "connect-coordinator"
    if script.exists():
        return shlex.quote(str(script))
    return f"{shlex.quote(sys.executable)} -m coordinator.cli"


def _print_where_to_look(coordinator: Any, workers: list[Any], broker: Any, root: Path,
                         owned: bool) -> None:
    urls = "\n".join(f"    {worker.url}   log: {worker.process.log_path}   "
                     f"stdout: {worker.process.stdout_path}" for worker in workers)
    owner = ("this coordinator (proxy.groups)" if owned
             else "the broker's own coordinator (forwarded)")
    print(f"""
Running. Everything is in {root}

  Kafka broker (upstream, KRaft)   {broker.bootstrap}   log: {broker.process.log_path}
  coordinator (proxy mode)         {coordinator.bootstrap}   admin: {coordinator.admin_url}
      log: {coordinator.process.stdout_path}
  Connect workers (bootstrap.servers={coordinator.bootstrap}, group.id={GROUP}):
{urls}
  The workers' group is served by {owner}.

Where to look:
  curl -s {workers[0].url}/connectors?expand=status      # Connect's view of tasks
  curl -s {workers[0].url}/connectors/source/status
  curl -s {coordinator.admin_url}/proxy                   # broker -> local port mapping
  curl -s {coordinator.admin_url}/metrics | grep proxy_   # forwarded requests and bytes
  curl -s {coordinator.admin_url}/groups                  # groups this coordinator owns
  {_command()} describe --bootstrap {coordinator.bootstrap} --admin \
{coordinator.admin_url}
  tail -f {workers[0].process.stdout_path}   # VerifiableSource/Sink JSON lines

Ctrl-C stops everything.""", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="demo-connect", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path("run/demo-connect"),
                        help="where the processes keep their files (emptied first)")
    owner = parser.add_mutually_exclusive_group()
    owner.add_argument("--owned", dest="owned", action="store_true", default=True,
                       help=f"the coordinator owns the workers' group ({GROUP}); the default")
    owner.add_argument("--forwarded", dest="owned", action="store_false",
                       help="forward the workers' group to the broker's own coordinator "
                            "instead (the coordinator only proxies)")
    parser.add_argument("--no-wait", action="store_true",
                        help="stop everything once the tasks run (a check of the demo)")
    args = parser.parse_args(argv)
    try:
        require_java()
        ensure_jars()
    except InteropUnavailable as error:
        print(f"demo-connect: {error}", file=sys.stderr)
        return 2
    root = args.dir.resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    # Ctrl-C (or SIGTERM) at any moment, start-up included, ends the demo; the processes
    # run in sessions of their own and are stopped here, workers first.
    signal.signal(signal.SIGTERM, _interrupt)
    started: list[Any] = []
    interrupted = False
    try:
        _run(root, args.owned, args.no_wait, started)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        # A second Ctrl-C must not cut the stopping short and leave a JVM behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("stopping ...", flush=True)
        with stopping(started):
            pass
    return 130 if interrupted else 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _run(root: Path, owned: bool, no_wait: bool, started: list[Any]) -> None:
    print("starting the Kafka broker ...", flush=True)
    broker = start_broker(root / "broker")
    started.append(broker)
    print("starting the coordinator in proxy mode ...", flush=True)
    coordinator = start_coordinator(root / "coordinator", broker.bootstrap,
                                    GROUP if owned else "owned-.*")
    started.append(coordinator)
    print("starting three Connect workers ...", flush=True)
    workers = start_workers(root, 3, coordinator.bootstrap, GROUP, started)
    print("creating a VerifiableSource (6 tasks) and a VerifiableSink ...", flush=True)
    workers[0].rest("POST", "/connectors", {"name": "source", "config": {
        "connector.class": VERIFIABLE_SOURCE, "tasks.max": "6", "topic": TOPIC,
        "throughput": "10"}})
    workers[0].rest("POST", "/connectors", {"name": "sink", "config": {
        "connector.class": VERIFIABLE_SINK, "tasks.max": "2", "topics": TOPIC}})
    wait_for(lambda: all_running(workers[0], "source", 6), 180,
             "the source's 6 tasks to run")
    wait_for(lambda: all_running(workers[0], "sink", 2), 180, "the sink's tasks to run")
    _print_where_to_look(coordinator, workers, broker, root, owned)
    if not no_wait:
        threading.Event().wait()  # until Ctrl-C


if __name__ == "__main__":
    sys.exit(main())
