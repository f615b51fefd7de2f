"""The `connect-coordinator` command line."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DESCRIPTION = """\
connect-coordinator: a standalone group coordinator for Kafka Connect workers, speaking the
KIP-848 style Connect rebalance protocol (ConnectGroupHeartbeat, PrepareAssignment,
InstallAssignment, Describe) over Kafka's binary protocol.
"""

EPILOG = """\
commands:
  serve      run the coordinator (KRPC listener, admin HTTP API, durable log)
  describe   show groups, their epochs and members' assignments
  groups     --list | --describe [--members [--verbose]] [--state] | --delete, in the
             shape of kafka-consumer-groups.sh
  bench      benchmarks: codec | core | heartbeats | classic | assignor | install | log |
             replay | hostile | proxy | bounce; compare (an A/B's verdict from their JSON)
  log        log tools: check | dump | compact | snapshot
  simulate   fake Connect workers under chaos, checked for units run twice
  metrics    record /metrics scrapes (or a Prometheus range) as Parquet
  report     the PySpark capacity report from recorded metrics and a log snapshot
  demo-connect  a KRaft broker, this coordinator in proxy mode and three real Connect
             workers from Apache Kafka's jars (needs a checkout, java and mvn)

Run `connect-coordinator COMMAND --help` for the options of each command.
"""


def _serve_parser(commands: Any) -> None:
    serve = commands.add_parser(
        "serve", help="run the coordinator",
        description="Run the coordinator until SIGTERM or SIGINT, then shut down gracefully "
                    "(stop accepting, finish requests in flight, flush the log).",
    )
    serve.add_argument("--listen", default="127.0.0.1:19092", metavar="HOST:PORT",
                       help="KRPC listener for Connect workers (default %(default)s)")
    serve.add_argument("--admin-listen", default="127.0.0.1:19093", metavar="HOST:PORT",
                       help="admin HTTP API, /metrics, /healthz, /readyz (default %(default)s)")
    serve.add_argument("--data-dir", default="./data", type=Path, metavar="DIR",
                       help="where the record log lives; created if missing (default %(default)s)")
    serve.add_argument("--in-memory", action="store_true",
                       help="keep state in memory only, with no log: nothing survives a "
                            "restart (throwaway test clusters, benchmarks)")
    serve.add_argument("--upstream", metavar="HOST:PORT[,HOST:PORT...]",
                       help="proxy mode: stand in front of this Kafka cluster (its bootstrap "
                            "addresses; config proxy.upstream); requires "
                            "--set proxy.groups=REGEX, the group ids this coordinator owns")
    serve.add_argument("--config", type=Path, metavar="FILE.toml",
                       help="a TOML file of server config keys (see README)")
    serve.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override one config key, e.g. "
                            "--set group.connect.assignment.interval.ms=0 (repeatable)")
    serve.add_argument("--log-level", default="info",
                       choices=["debug", "info", "warning", "error"])
    serve.add_argument("--log-format", choices=["json", "console"],
                       help="default: json unless stderr is a terminal")


def _describe_parser(commands: Any) -> None:
    describe = commands.add_parser(
        "describe", help="describe groups over KRPC",
        description="Describe connect groups with ConnectGroupDescribe. With no GROUP, "
                    "lists the groups through the admin API (--admin) first.")
    describe.add_argument("groups", nargs="*", metavar="GROUP")
    describe.add_argument("--bootstrap", default="127.0.0.1:19092", metavar="HOST:PORT")
    describe.add_argument("--admin", metavar="URL",
                          help="admin API base URL, used to list groups when none are named "
                               "(default: http://HOST:19093 of --bootstrap)")
    describe.add_argument("--json", action="store_true", help="print JSON instead of a table")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="connect-coordinator", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _serve_parser(commands)
    _describe_parser(commands)
    bench = commands.add_parser("bench", help="benchmarks (see BENCHMARKS.md)",
                                description="Benchmarks; each takes --help.")
    bench.add_argument("which", choices=sorted(BENCHES))
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    tools = commands.add_parser("log", help="log tools: check, dump, compact, snapshot",
                                description="Tools for the record log in --data-dir.")
    tools.add_argument("rest", nargs=argparse.REMAINDER)
    for name, text in (("groups", "list, describe, delete groups (kafka-consumer-groups)"),
                       ("simulate", "fake Connect workers under chaos"),
                       ("metrics", "record metrics: metrics record ..."),
                       ("report", "the PySpark capacity report"),
                       ("demo-connect", "Kafka broker + proxy + 3 real Connect workers")):
        extra = commands.add_parser(name, help=text, add_help=False)
        extra.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


FORWARDED = {"log": "coordinator.log.cli", "simulate": "coordinator.workers.simulate",
             "groups": "coordinator.groups_cli",
             "demo-connect": "coordinator.demo_connect",
             "metrics": "coordinator.report.recorder", "report": "coordinator.report.job"}
BENCHES: dict[str, str] = {
    "codec": "bench.codec",
    "assignor": "bench.assignors",
    "heartbeats": "bench.heartbeats",
    "classic": "bench.classic",
    "core": "bench.core",
    "log": "bench.log",
    "replay": "bench.replay",
    "install": "bench.install",
    "hostile": "bench.hostile",
    "proxy": "bench.proxy",
    "bounce": "bench.bounce",
    "compare": "bench.compare",
}


# What `pip install '.[report]'` adds; nothing else needs them.
REPORT_MODULES = frozenset({"pyspark", "pyarrow", "pandas", "matplotlib"})
REPORT_INSTALL = "pip install '.[report]'"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("connect-coordinator")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    """Runs one command. A failure a user can cause ends in one line on stderr naming the
    cause and what to do, and a non-zero status; output cut short by its reader (`| head`)
    ends quietly."""
    try:
        status = _main(argv)
        sys.stdout.flush()  # here, so that a closed pipe is caught below, not at exit
    except BrokenPipeError:
        # The reader went away (`... | head`): nothing is wrong and nothing more is wanted.
        # Point stdout at /dev/null so that the interpreter's last flush stays quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # what a shell reports for a program ended by SIGPIPE
    except (KeyboardInterrupt, BaseExceptionGroup) as raised:
        # Ctrl-C where a command has nothing to save: quiet, with a shell's status for it.
        if not _only_interrupts(raised):
            raise
        print("connect-coordinator: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as error:
        missing = (error.name or "").partition(".")[0]
        if missing not in REPORT_MODULES:
            raise
        words = list(sys.argv[1:] if argv is None else argv)
        command = " ".join(words[:2] if words[:1] in (["log"], ["metrics"]) else words[:1])
        print(f"connect-coordinator: `{command}` needs {missing}, which is not installed: "
              f"{REPORT_INSTALL}", file=sys.stderr)
        return 2
    return status


def _only_interrupts(error: BaseException) -> bool:
    if isinstance(error, BaseExceptionGroup):
        return all(_only_interrupts(inner) for inner in error.exceptions)
    return isinstance(error, KeyboardInterrupt)


def _main(argv: list[str] | None = None) -> int:
    skip_optional_test_imports()
    argv = list(sys.argv[1:] if argv is None else argv)
    # Commands with options of their own get everything after their name untouched.
    if argv and argv[0] in FORWARDED:
        return _forward(FORWARDED[argv[0]], "main", argv[1:])
    if len(argv) >= 2 and argv[0] == "bench" and argv[1] in BENCHES:
        return _forward(BENCHES[argv[1]], "main", argv[2:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "serve":
        return _serve(args)
    if args.command == "describe":
        return _describe(args)
    if args.command == "bench":
        return _forward(BENCHES[args.which], "main", args.rest)
    return _forward(FORWARDED[args.command], "main", args.rest)


def skip_optional_test_imports() -> None:
    """kio imports Hypothesis whenever it is installed (a development install has it), to
    register strategies for its types: that costs about a second at every start and leaves
    a `.hypothesis/` directory wherever a command runs. No command needs it; a process that
    imported it already (a test run) keeps it."""
    if "hypothesis" not in sys.modules:
        sys.modules["hypothesis"] = None  # type: ignore[assignment]  # import -> ImportError


def module_command(module: str, *args: str) -> list[str]:
    """`python -m MODULE ARGS` for a child process, with `skip_optional_test_imports`
    applied before the module imports anything."""
    bootstrap = ("import runpy; from coordinator.cli import skip_optional_test_imports; "
                 f"skip_optional_test_imports(); runpy.run_module({module!r}, "
                 "run_name='__main__', alter_sys=True)")
    return [sys.executable, "-c", bootstrap, *args]


def _forward(module: str, function: str, argv: list[str]) -> int:
    import importlib

    # A missing optional dependency (the report's) is told by main(), naming the extra.
    target = getattr(importlib.import_module(module), function)
    return int(target(argv) or 0)


def _serve(args: argparse.Namespace, instruments: Sequence[Any] = ()) -> int:
    """`serve`; `instruments` (trio Instruments) watch its event loop (bench/loopsteps.py)."""
    from functools import partial

    import trio

    from coordinator.config import ConfigError, load_config
    from coordinator.logs import configure_logging
    from coordinator.server.app import ListenError, parse_address, run_server

    json_logs = None if args.log_format is None else args.log_format == "json"
    configure_logging(args.log_level, json_logs)
    from coordinator.assignors import UnknownAssignorError, load_assignors

    try:
        overrides = list(args.set)
        if args.upstream:
            overrides.insert(0, f"proxy.upstream={args.upstream}")
        config = load_config(args.config, overrides)
        try:
            load_assignors(config.server_assignors)
        except UnknownAssignorError as error:
            raise ConfigError(f"group.connect.server.assignors: {error}") from None
        listen = parse_address(args.listen)
        admin = parse_address(args.admin_listen)
    except (ConfigError, ValueError) as error:
        print(f"connect-coordinator: {error}", file=sys.stderr)
        return 2
    # The data directory is made by the server once both listeners are open: a start
    # refused for a port in use leaves nothing behind.

    async def serve_until_signalled() -> None:
        async with trio.open_nursery() as nursery:
            data_dir = None if args.in_memory else args.data_dir
            handle = await nursery.start(partial(run_server, config, listen, admin, data_dir,
                                                 tune_process=True))
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    handle.stop()
                    break

    from coordinator.log import LogError

    try:
        trio.run(serve_until_signalled, instruments=instruments)
    except BaseException as raised:  # noqa: B036 - unwrap trio's exception groups
        leaf = _first_leaf(raised)
        if isinstance(leaf, (ConfigError, ListenError)):
            print(f"connect-coordinator: {leaf}", file=sys.stderr)
            return 2
        if isinstance(leaf, (LogError, OSError)):
            # e.g. damage in the middle of the log: start-up stops, naming file and offset
            print(f"connect-coordinator: cannot start: {leaf}", file=sys.stderr)
            return 1
        if isinstance(leaf, KeyboardInterrupt):
            return 0
        raise
    return 0


def _first_leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


class CommandError(Exception):
    """A failure the user can act on: main prints its one line and exits with `status`."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


DESCRIBE_TIMEOUT_S = 30.0


def _describe(args: argparse.Namespace) -> int:
    import trio

    from coordinator.server.app import parse_address

    try:
        host, port = parse_address(args.bootstrap)
    except ValueError as error:
        print(f"connect-coordinator: --bootstrap: {error}", file=sys.stderr)
        return 2
    groups = list(args.groups)
    try:
        if not groups:
            admin = args.admin or f"http://{host}:19093"
            groups = _list_groups(admin)
            if not groups:
                trio.run(_describe_groups, host, port, [])  # is --bootstrap a coordinator?
                if args.json:
                    print("[]")
                else:
                    print(f"no groups on the coordinator at {admin} (a group appears when a "
                          "worker joins it or its connectors or config are set)")
                return 0
        described = trio.run(_describe_groups, host, port, groups)
    except CommandError as error:
        print(f"connect-coordinator: {error}", file=sys.stderr)
        return error.status
    if args.json:
        print(json.dumps(described, indent=2))
    else:
        print(render_table(described))
    return 0 if all(g["error_code"] == 0 for g in described) else 1


def _list_groups(admin: str) -> list[str]:
    import http.client
    import urllib.request

    url = f"{admin.rstrip('/')}/groups"
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return [g["group_id"] for g in json.load(reply)["groups"]]
    except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError) as error:
        reason = str(error) or type(error).__name__
        raise CommandError(
            f"cannot list groups from {url} ({reason}): pass the admin listener "
            "(serve --admin-listen, default http://127.0.0.1:19093) with --admin URL, "
            "or name the groups", status=2) from None


async def _describe_groups(host: str, port: int, groups: list[str]) -> list[dict[str, Any]]:
    from coordinator.client import Unreachable, ask_coordinator
    from protocol.messages import ConnectGroupDescribeRequest

    try:
        response = await ask_coordinator(
            host, port, ConnectGroupDescribeRequest(group_ids=tuple(groups)), DESCRIBE_TIMEOUT_S)
    except Unreachable as error:
        raise CommandError(str(error)) from None
    return [_group_json(group) for group in response.groups]


def _units(value: Any) -> list[str]:
    return list(value.connectors) + [f"{t.connector}-{t.task}" for t in value.tasks]


def _group_json(group: Any) -> dict[str, Any]:
    return {
        "group_id": group.group_id, "error_code": group.error_code,
        "error_message": group.error_message, "type": group.group_type,
        "units_source": group.units_source, "state": group.group_state,
        "group_epoch": group.group_epoch, "assignment_epoch": group.assignment_epoch,
        "assignor": group.assignor_name, "units": _units(group.connectors_and_tasks),
        "members": [{
            "member_id": m.member_id, "instance_id": m.instance_id, "worker_url": m.worker_url,
            "protocol": m.protocol, "classic_protocol": m.classic_protocol,
            "member_epoch": m.member_epoch, "state": m.member_state,
            "assigned": _units(m.assigned), "pending_revocation": _units(m.pending_revocation),
            "target": _units(m.target)} for m in group.members],
    }


def render_table(groups: list[dict[str, Any]]) -> str:
    lines = []
    for group in groups:
        if group["error_code"]:
            lines.append(f"GROUP {group['group_id']}: {group['error_message']}")
            continue
        lines.append(f"GROUP {group['group_id']}  type={group['type']}  "
                     f"state={group['state']}  "
                     f"group_epoch={group['group_epoch']}  "
                     f"assignment_epoch={group['assignment_epoch']}  "
                     f"assignor={group['assignor']}  units={len(group['units'])} "
                     f"(from {group['units_source']})")
        header = ("MEMBER", "INSTANCE", "PROTOCOL", "EPOCH", "STATE", "ASSIGNED", "PENDING",
                  "TARGET")
        rows = [header] + [(
            m["member_id"], m["instance_id"] or "-", _protocol(m), str(m["member_epoch"]),
            m["state"],
            _short(m["assigned"]), _short(m["pending_revocation"]), _short(m["target"]))
            for m in group["members"]]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        for row in rows:
            lines.append("  " + "  ".join(cell.ljust(width)
                                          for cell, width in zip(row, widths, strict=True)))
        lines.append("")
    return "\n".join(lines).rstrip()


def _protocol(member: dict[str, Any]) -> str:
    """`connect`, or `classic` with the protocol the worker was told: classic/sessioned."""
    told = member["classic_protocol"]
    return f"{member['protocol']}/{told}" if told else str(member["protocol"])


def _short(units: list[str], limit: int = 6) -> str:
    if not units:
        return "-"
    shown = ",".join(units[:limit])
    return f"{len(units)}:{shown}" + ("..." if len(units) > limit else "")


if __name__ == "__main__":
    sys.exit(main())
