"""`connect-coordinator groups`: list, describe and delete groups, in the shape of Kafka's
`kafka-consumer-groups.sh` (--list, --describe [--members [--verbose]] [--state],
--delete), for people who know that tool; and the changes the admin API makes: a
connector's task count (--set-connector C --tasks N), a connector deleted
(--delete-connector C), group settings (--set-config KEY=VALUE), a static member removed
(--remove-member INSTANCE_ID).

Listing, deleting and changes go through the admin HTTP API; describing through the Kafka
listener (ConnectGroupDescribe), as `describe` does."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

PROG = "connect-coordinator groups"
ADMIN_HINT = ("--admin takes the coordinator's admin HTTP listener (serve --admin-listen, "
              "default http://127.0.0.1:19093)")


class GroupsError(Exception):
    """One line for the user; exit status 1."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--list", action="store_true", help="list the groups")
    action.add_argument("--describe", action="store_true",
                        help="describe groups: their units and the member running each "
                             "(with --members: the members; --state: the groups' state)")
    action.add_argument("--delete", action="store_true",
                        help="delete groups (an empty group only)")
    action.add_argument("--set-connector", metavar="CONNECTOR",
                        help="add a connector to the group, or change its task count "
                             "(with --tasks N)")
    action.add_argument("--delete-connector", metavar="CONNECTOR",
                        help="delete a connector from the group")
    action.add_argument("--set-config", action="append", metavar="KEY=VALUE",
                        help="set a group setting (repeatable; VALUE null removes it, as "
                             "PUT /groups/G/config does)")
    action.add_argument("--remove-member", action="append", metavar="INSTANCE_ID",
                        help="remove a static member by its instance id (repeatable)")
    parser.add_argument("--tasks", type=int, metavar="N",
                        help="with --set-connector: the connector's task count")
    parser.add_argument("--bootstrap-server", "--bootstrap", dest="bootstrap",
                        default="127.0.0.1:19092", metavar="HOST:PORT",
                        help="the coordinator's Kafka listener (default %(default)s)")
    parser.add_argument("--admin", metavar="URL",
                        help="the admin API (default: http://HOST:19093 of --bootstrap-server)")
    parser.add_argument("--group", action="append", default=[], metavar="GROUP",
                        help="a group (repeatable)")
    parser.add_argument("--all-groups", action="store_true", help="every group")
    parser.add_argument("--members", action="store_true", help="with --describe: the members")
    parser.add_argument("--verbose", action="store_true",
                        help="with --describe --members: each member's assigned units")
    parser.add_argument("--state", action="store_true",
                        help="with --list: each group's state; with --describe: the groups' "
                             "state, epochs, assignor and member count")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from coordinator.server.app import parse_address

    try:
        host, port = parse_address(args.bootstrap)
    except ValueError as error:
        parser.error(f"--bootstrap-server: {error}")
    if args.verbose and not args.members:
        parser.error("--verbose goes with --describe --members")
    if (args.describe or args.delete) and not (args.group or args.all_groups):
        parser.error("--describe and --delete need --group GROUP (or --all-groups)")
    changes = (args.set_connector is not None, args.delete_connector is not None,
               bool(args.set_config), bool(args.remove_member))
    if any(changes) and len(args.group) != 1:
        parser.error("a change goes to one group: give --group GROUP once")
    if (args.set_connector is not None) != (args.tasks is not None):
        parser.error("--set-connector CONNECTOR and --tasks N go together")
    admin = (args.admin or f"http://{host}:19093").rstrip("/")
    try:
        if any(changes):
            print(json.dumps(_change(admin, args.group[0], args, parser), indent=2))
            return 0
        if args.list:
            groups = _admin(admin, "GET", "/groups")["groups"]
            for group in sorted(groups, key=lambda g: g["group_id"]):
                print(f"{group['group_id']}  {_state(group)}" if args.state
                      else group["group_id"])
            return 0
        names = list(args.group) or [g["group_id"]
                                     for g in _admin(admin, "GET", "/groups")["groups"]]
        if args.delete:
            return _delete(admin, names)
        return _describe(host, port, names, args)
    except GroupsError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 1


def _change(admin: str, group: str, args: argparse.Namespace,
            parser: argparse.ArgumentParser) -> Any:
    """One change through the admin API; its answer."""
    path = f"/groups/{urllib.parse.quote(group, safe='')}"
    if args.set_connector is not None:
        connector = urllib.parse.quote(args.set_connector, safe="")
        return _admin(admin, "PUT", f"{path}/connectors/{connector}", {"tasks": args.tasks})
    if args.delete_connector is not None:
        connector = urllib.parse.quote(args.delete_connector, safe="")
        return _admin(admin, "DELETE", f"{path}/connectors/{connector}")
    if args.set_config:
        settings: dict[str, Any] = {}
        for pair in args.set_config:
            key, equals, value = pair.partition("=")
            if not equals or not key:
                parser.error(f"--set-config takes KEY=VALUE, got {pair!r}")
            settings[key] = _config_value(value)
        return _admin(admin, "PUT", f"{path}/config", settings)
    return _admin(admin, "POST", f"{path}/members/remove",
                  {"members": [{"instance_id": instance} for instance in args.remove_member]})


def _config_value(text: str) -> Any:
    """A setting's value as the config API takes it: null, a whole number, or the text."""
    if text == "null":
        return None
    try:
        return int(text)
    except ValueError:
        return text


def _state(group: dict[str, Any]) -> str:
    return str(group.get("state") or group.get("group_state") or "-")


def _admin(admin: str, method: str, path: str, body: Any = None) -> Any:
    url = admin + path
    data = None if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"Content-Type": "application/json"}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, method=method,
                                                           headers=headers),
                                    timeout=10) as reply:
            return json.loads(reply.read() or b"null")
    except urllib.error.HTTPError as error:
        raw = error.read()
        error.close()
        try:
            message = json.loads(raw).get("message", raw.decode(errors="replace"))
        except (ValueError, AttributeError):
            message = raw.decode(errors="replace")
        raise GroupsError(f"{method} {path}: HTTP {error.code}: {message}") from None
    except (OSError, ValueError) as error:
        reason = getattr(error, "reason", None) or error
        reason = getattr(reason, "strerror", None) or reason
        raise GroupsError(f"cannot reach {url} ({reason}): is the coordinator running "
                          f"there? {ADMIN_HINT}") from None


def _delete(admin: str, names: list[str]) -> int:
    failed = []
    for name in names:
        try:
            _admin(admin, "DELETE", f"/groups/{urllib.parse.quote(name, safe='')}")
        except GroupsError as error:
            failed.append(f"{name}: {error}")
    deleted = [name for name in names if not any(f.startswith(f"{name}: ") for f in failed)]
    if deleted:
        print("Deletion of requested groups (" + ", ".join(f"'{n}'" for n in deleted)
              + ") was successful.")
    for failure in failed:
        print(f"{PROG}: {failure}", file=sys.stderr)
    return 1 if failed else 0


def _describe(host: str, port: int, names: list[str], args: argparse.Namespace) -> int:
    import trio

    from coordinator.cli import CommandError, _describe_groups

    try:
        groups = trio.run(_describe_groups, host, port, names)
    except CommandError as error:
        raise GroupsError(str(error)) from None
    status = 0
    rows: list[tuple[str, ...]] = []
    if args.state:
        header: tuple[str, ...] = ("GROUP", "TYPE", "STATE", "GROUP-EPOCH",
                                   "ASSIGNMENT-EPOCH", "ASSIGNOR", "#MEMBERS")
    elif args.members:
        header = ("GROUP", "MEMBER-ID", "INSTANCE-ID", "WORKER-URL", "PROTOCOL", "EPOCH",
                  "#UNITS") + (("ASSIGNED",) if args.verbose else ())
    else:
        header = ("GROUP", "UNIT", "MEMBER-ID", "INSTANCE-ID", "WORKER-URL")
    for group in groups:
        if group["error_code"]:
            print(f"{PROG}: group {group['group_id']}: {group['error_message']}",
                  file=sys.stderr)
            status = 1
            continue
        gid = group["group_id"]
        if args.state:
            rows.append((gid, str(group["type"]), str(group["state"]),
                         str(group["group_epoch"]), str(group["assignment_epoch"]),
                         str(group["assignor"] or "-"), str(len(group["members"]))))
        elif args.members:
            for m in group["members"]:
                row: tuple[str, ...] = (
                    gid, m["member_id"], m["instance_id"] or "-", m["worker_url"] or "-",
                    m["protocol"], str(m["member_epoch"]), str(len(m["assigned"])))
                rows.append(row + ((",".join(m["assigned"]) or "-",) if args.verbose else ()))
        else:
            runner = {unit: m for m in group["members"] for unit in m["assigned"]}
            for unit in group["units"]:
                m = runner.get(unit)
                rows.append((gid, unit, m["member_id"] if m else "-",
                             (m["instance_id"] or "-") if m else "-",
                             (m["worker_url"] or "-") if m else "-"))
    if rows or status == 0:
        table = [header, *rows]
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        for row in table:
            print("  ".join(cell.ljust(width)
                            for cell, width in zip(row, widths, strict=True)).rstrip())
    return status
