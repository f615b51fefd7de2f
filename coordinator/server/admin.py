"""The admin HTTP API (README, "Admin HTTP API"), a Starlette app served by hypercorn on trio.

Mutations go through the runtime like KRPC requests: core call, timers, log lines, then
the records are made durable before the answer. Bad input gets a 4xx with a JSON body
`{"error": ..., "message": ...}` and changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from contextlib import aclosing
from typing import Any, Protocol
from urllib.parse import quote, unquote_to_bytes

import msgspec
import trio
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from coordinator.config import FIELD_KEYS
from coordinator.core import describe as describing
from coordinator.core.classic.view import member_views
from coordinator.core.validation import check_id
from coordinator.server.limits import too_long
from coordinator.server.runtime import NotDurable, Runtime
from coordinator.units import CONNECTOR, Unit, format_unit, split_units
from coordinator.urls import redacted_url
from protocol.errors import ApiError, ErrorCode

STATUS_BY_CODE = {
    ErrorCode.GROUP_ID_NOT_FOUND: 404,
    ErrorCode.NON_EMPTY_GROUP: 409,
    ErrorCode.INCONSISTENT_GROUP_PROTOCOL: 409,  # a classic group with members
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.INVALID_GROUP_ID: 400,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS: 503,
    ErrorCode.COORDINATOR_NOT_AVAILABLE: 503,
}


class ConnectorBody(msgspec.Struct, forbid_unknown_fields=True):
    tasks: int


TASKS_MAX = "tasks.max"


def connector_task_count(body: Any) -> int:
    """The task count a connector PUT asks for: ``{"tasks": N}``, or a connector config as
    Kafka Connect's REST API takes one, whose ``tasks.max`` (a string of digits, as Connect
    writes every config value, or a number) is the one key the coordinator uses; the rest
    of such a config (``connector.class`` and so on) is the workers' business."""
    if isinstance(body, dict) and TASKS_MAX in body:
        if "tasks" in body:
            raise ApiError(ErrorCode.INVALID_REQUEST,
                           'invalid body: give "tasks" or "tasks.max", not both')
        value = body[TASKS_MAX]
        if isinstance(value, str) and value.isascii() and value.isdecimal():
            return int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ApiError(ErrorCode.INVALID_REQUEST,
                       f'invalid body: "tasks.max" must be a whole number, got {value!r}')
    try:
        return msgspec.convert(body, ConnectorBody).tasks
    except msgspec.ValidationError as error:
        raise ApiError(ErrorCode.INVALID_REQUEST,
                       f'invalid body: {error} (the body is {{"tasks": N}} or a connector '
                       f'config with "tasks.max")') from None


Runners = dict[tuple[str, int | None], dict[str, Any]]


def connector_units(view: dict[str, Any]) -> tuple[dict[str, list[int]], Runners]:
    """From a group's view: each connector's task ids, and the member running each unit
    (by (connector, task), the task None for the connector itself)."""
    tasks: dict[str, list[int]] = {}
    runners: Runners = {}
    owned_key = "holds" if view["type"] == "classic" else "assigned"
    for member in view["members"]:
        units = member[owned_key]
        for name in units["connectors"]:
            runners[(name, None)] = member
        for task in units["tasks"]:
            runners[(task["connector"], task["task"])] = member
    every = (view["connectors_and_tasks"] if view["type"] != "classic"
             else {"connectors": [], "tasks": []})
    held = [m[owned_key] for m in view["members"]] + [every]
    if view["type"] != "classic":
        held.append(view["unassigned"])
    for units in held:
        for name in units["connectors"]:
            tasks.setdefault(name, [])
        for task in units["tasks"]:
            ids = tasks.setdefault(task["connector"], [])
            if task["task"] not in ids:
                ids.append(task["task"])
    return {name: sorted(ids) for name, ids in sorted(tasks.items())}, runners


def _runner_json(member: dict[str, Any] | None) -> dict[str, Any]:
    if member is None:
        return {"member_id": None, "worker_id": None}
    return {"member_id": member["member_id"], "worker_id": member["worker_url"]}


class MemberToRemove(msgspec.Struct, forbid_unknown_fields=True):
    instance_id: str
    member_id: str | None = None


class RemoveMembersBody(msgspec.Struct, forbid_unknown_fields=True):
    members: list[MemberToRemove]


def _error(status: int, error: str, message: str) -> JSONResponse:
    return JSONResponse({"error": error, "message": message}, status_code=status)


def _units_json(value: Any) -> dict[str, Any]:
    return {
        "connectors": list(value.connectors),
        "tasks": [{"connector": t.connector, "task": t.task} for t in value.tasks],
    }


def view_of(taken: describing.GroupSnapshot, config: dict[str, Any],
            unassigned_units: frozenset[Unit]) -> dict[str, Any]:
    """A connect group's view from a snapshot: touches no shared state, so it may run in
    a thread."""
    described = describing.build(taken)
    unassigned = sorted(unassigned_units)
    return {
        "group_id": described.group_id,
        "type": "connect",
        "state": described.group_state,
        "group_epoch": described.group_epoch,
        "assignment_epoch": described.assignment_epoch,
        "assignor": described.assignor_name,
        "connectors_and_tasks": _units_json(described.connectors_and_tasks),
        "units_source": taken.units_source,
        "unassigned": {
            "connectors": [name for name, task in unassigned if task == CONNECTOR],
            "tasks": [{"connector": name, "task": task}
                      for name, task in unassigned if task != CONNECTOR],
            "names": [format_unit(unit) for unit in unassigned],
        },
        "config": config,
        "members": [
            {
                "member_id": m.member_id,
                "protocol": m.protocol,
                "classic_protocol": m.classic_protocol,
                "instance_id": m.instance_id,
                "worker_url": m.worker_url,
                "member_epoch": m.member_epoch,
                "state": m.member_state,
                "assigned": _units_json(m.assigned),
                "pending_revocation": _units_json(m.pending_revocation),
                "target": _units_json(m.target),
            }
            for m in described.members
        ],
    }


def _held_json(units: Iterable[Unit]) -> dict[str, Any]:
    connectors, tasks = split_units(units)
    return {"connectors": connectors,
            "tasks": [{"connector": name, "task": task} for name, task in tasks]}


def classic_group_view(runtime: Runtime, group_id: str) -> dict[str, Any] | None:
    """A classic group as JSON (None: no classic group of that id): its generation and
    phase, and each member's worker url and what it holds, read from Connect's bytes."""
    group = runtime.core.classic.store.groups.get(group_id)
    if group is None:
        return None
    meta = group.meta
    return {
        "group_id": group_id,
        "type": "classic",
        # The admin API spells every state as ConnectGroupDescribe does (STABLE, not the
        # Stable of Kafka's own APIs), whatever the group's type.
        "state": group.state.name,
        "generation": meta.generation,
        "protocol_type": meta.protocol_type,
        "protocol": meta.protocol_name,
        "leader": meta.leader,
        "members": [
            {
                "member_id": view.member_id,
                "instance_id": view.instance_id,
                "client_id": view.client_id,
                "worker_url": redacted_url(view.worker_url),
                "protocol": "classic",
                "classic_protocol": meta.protocol_name,
                "joined_generation": view.joined_generation,
                "synced_generation": view.synced_generation,
                "holds": _held_json(view.holds),
            }
            for view in member_views(group)
        ],
        # told MEMBER_ID_REQUIRED, not joined yet: they count against the group's size
        "pending_members": [
            {"member_id": member_id, "client_id": member.client_id,
             "client_host": member.client_host}
            for member_id, member in sorted(group.pending().items())
        ],
    }


def group_view(runtime: Runtime, group_id: str) -> dict[str, Any]:
    """A group's view as JSON, on the event loop: a classic group's, or a connect group's
    (raises ApiError when there is no such group)."""
    classic = classic_group_view(runtime, group_id)
    if classic is not None:
        return classic
    taken = _connect_snapshot(runtime, group_id)
    return view_of(taken, runtime.core.group_config(group_id),
                   runtime.core.unassigned_units(group_id))


def _connect_snapshot(runtime: Runtime, group_id: str) -> describing.GroupSnapshot:
    """A connect group's snapshot (raises ApiError when there is no such group)."""
    taken = runtime.core.describe_snapshot(group_id)
    if isinstance(taken, tuple):
        raise taken[1]
    if not isinstance(taken, describing.GroupSnapshot):  # a classic group appeared
        raise describing.not_found(group_id)
    return taken


# A view of a group of more members than this is built in a thread.
VIEW_OFFLOAD_MEMBERS = 100


class BodyTooLarge(Exception):
    """An admin request body over server.admin.max.body.bytes."""


class ProxyView(Protocol):
    def mapping(self) -> dict[str, Any]: ...


def build_admin_app(runtime: Runtime, proxy: ProxyView | None = None) -> ASGIApp:
    config = runtime.config
    id_key = FIELD_KEYS["max_id_bytes"]

    def check_path(request: Request) -> None:
        """Group ids and connector names in the path, percent-decoded (the app routes on
        the raw path: see `routed_on_raw_path`), are held to the id rules and limit."""
        params = request.scope.get("path_params", {})
        for name, what in (("group", "group id"), ("connector", "connector name")):
            if name not in params:
                continue
            value = params[name] = decoded_segment(params[name])
            problem = too_long(what, value, config.max_id_bytes, id_key)
            if problem is not None:
                raise ApiError(ErrorCode.INVALID_REQUEST, problem)
            check_id(what, value)

    async def guarded(request: Request, handler: Any) -> Response:
        try:
            check_path(request)
            return await handler(request)  # type: ignore[no-any-return]
        except BodyTooLarge as error:
            # The rest of the body is never read: the connection cannot be reused.
            response = _error(413, "BODY_TOO_LARGE", str(error))
            response.headers["connection"] = "close"
            return response
        except ApiError as error:
            return _error(STATUS_BY_CODE.get(error.code, 400), error.code.name, error.message)
        except NotDurable:
            return _error(503, "COORDINATOR_NOT_AVAILABLE",
                          "the change could not be written to the log; retry")
        except ClientDisconnect:
            # The client went (or was cut off by the listener's read deadline) before its
            # body arrived: nothing was changed and there is no one to answer.
            return Response(status_code=400)

    max_body = runtime.config.admin_max_body_bytes
    body_key = FIELD_KEYS["admin_max_body_bytes"]

    async def read_body(request: Request) -> bytes:
        """The body, read as it streams in and refused once over the limit."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_body:
            raise BodyTooLarge(f"the body of {declared} bytes is over the limit of "
                               f"{max_body} ({body_key})")
        chunks: list[bytes] = []
        size = 0
        async with aclosing(request.stream()) as stream:
            async for chunk in stream:
                size += len(chunk)
                if size > max_body:
                    raise BodyTooLarge(f"the body is over the limit of {max_body} bytes "
                                       f"({body_key})")
                chunks.append(chunk)
        return b"".join(chunks)

    async def body_of(request: Request, kind: type[Any]) -> Any:
        raw = await read_body(request)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ApiError(ErrorCode.INVALID_REQUEST,
                           f"body is not valid UTF-8 (byte {error.start})") from None
        try:
            return msgspec.json.decode(raw, type=kind)
        except msgspec.ValidationError as error:
            raise ApiError(ErrorCode.INVALID_REQUEST, f"invalid body: {error}") from None
        except msgspec.DecodeError as error:
            raise ApiError(ErrorCode.INVALID_REQUEST, f"body is not valid JSON: {error}") \
                from None

    def require_ready() -> None:
        if not runtime.ready:
            raise ApiError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                           "the coordinator is loading its log")

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        if runtime.ready:
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "loading"}, status_code=503)

    async def proxy_mapping(request: Request) -> Response:
        if proxy is None:
            return _error(404, "NOT_PROXY", "the coordinator is not in proxy mode "
                                            "(serve --upstream)")
        return JSONResponse(proxy.mapping())

    async def metrics(request: Request) -> Response:
        return Response(runtime.metrics.render(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    async def list_groups(request: Request) -> Response:
        async def handle(request: Request) -> Response:
            require_ready()
            groups = []
            for group_id in runtime.core.group_ids():  # a summary: no member's units
                taken = runtime.core.describe_snapshot(group_id)
                if not isinstance(taken, describing.GroupSnapshot):
                    continue
                groups.append({"group_id": taken.group_id, "state": taken.state,
                               "group_epoch": taken.epoch,
                               "assignment_epoch": taken.assignment_epoch,
                               "assignor": taken.assignor, "type": "connect",
                               "members": len(taken.members)})
            for group_id in sorted(runtime.core.classic.store.groups):
                classic = classic_group_view(runtime, group_id)
                assert classic is not None
                groups.append({key: classic[key] for key in (
                    "group_id", "type", "state", "generation", "protocol")}
                    | {"members": len(classic["members"])})
            return JSONResponse({"groups": groups})
        return await guarded(request, handle)

    async def get_group(request: Request) -> Response:
        async def handle(request: Request) -> Response:
            require_ready()
            group_id = request.path_params["group"]
            classic = classic_group_view(runtime, group_id)
            if classic is not None:
                return JSONResponse(classic)
            taken = _connect_snapshot(runtime, group_id)  # on the loop: consistent
            config = runtime.core.group_config(group_id)
            unassigned = runtime.core.unassigned_units(group_id)
            if len(taken.members) <= VIEW_OFFLOAD_MEMBERS:
                return JSONResponse(view_of(taken, config, unassigned))

            def encoded() -> bytes:
                return msgspec.json.encode(view_of(taken, config, unassigned))

            # Building a large group's view and its JSON takes about a millisecond per 25
            # members: in a thread, from the snapshot.
            return Response(await trio.to_thread.run_sync(encoded),
                            media_type="application/json")
        return await guarded(request, handle)

    async def delete_group(request: Request) -> Response:
        async def handle(request: Request) -> Response:
            require_ready()
            group = request.path_params["group"]
            return JSONResponse(await runtime.call(runtime.core.delete_group, group))
        return await guarded(request, handle)

    async def put_connector(request: Request) -> Response:
        async def handle(request: Request) -> Response:
            require_ready()
            tasks = connector_task_count(await body_of(request, dict[str, Any]))
            group, connector = request.path_params["group"], request.path_params["connector"]
            answer = await runtime.call(runtime.core.put_connector, group, connector, tasks)
            return JSONResponse(answer)
        return await guarded(request, handle)

    async def list_connectors(request: Request) -> Response:
        async def handle(request: Request) -> Response:
            require_ready()
            view = group_view(runtime, request.path_params["group"])
            return JSONResponse(list(connector_units(view)[0]))
        return await guarded(request, handle)

    async def get_connector(request: Request) -> Response:
        async def handle(request: Request) -> Response:
            require_ready()
            group, connector = request.path_params["group"], request.path_params["connector"]
            tasks, runners = connector_units(group_view(runtime, group))
            if connector not in tasks:
                return _error(404, "CONNECTOR_NOT_FOUND",
                              f"group {group!r} has no connector {connector!r}; "
                              f"GET /groups/{quote(group, safe='')}/connectors lists them")
            return JSONResponse({
                "name": connector,
                "group": group,
                "config": {TASKS_MAX: str(len(tasks[connector]))},
                "connector": _runner_json(runners.get((connector, None))),
                "tasks": [{"id": task, **_runner_json(runners.get((connector, task)))}
                          for task in tasks[connector]],
            })
        return await guarded(request, handle)

    async def delete_connector(request: Request) -> Response:
        async def handle(request: Request) -> Response:
            require_ready()
            group, connector = request.path_params["group"], request.path_params["connector"]
            try:
                answer = await runtime.call(runtime.core.delete_connector, group, connector)
            except ApiError as error:
                if error.code == ErrorCode.GROUP_ID_NOT_FOUND \
                        and group in runtime.core.group_ids():
                    # The group is there; the connector is what was not found.
                    return _error(404, "CONNECTOR_NOT_FOUND",
                                  f"group {group!r} has no connector {connector!r}; "
                                  f"GET /groups/{quote(group, safe='')} lists its connectors")
                raise
            return JSONResponse(answer)
        return await guarded(request, handle)

    async def remove_members(request: Request) -> Response:
        async def handle(request: Request) -> Response:
            require_ready()
            body = await body_of(request, RemoveMembersBody)
            if not body.members:
                raise ApiError(ErrorCode.INVALID_REQUEST, "members must not be empty")
            for member in body.members:
                check_id("instance_id", member.instance_id)
                check_id("member_id", member.member_id)
            pairs = [(m.instance_id, m.member_id) for m in body.members]
            group = request.path_params["group"]
            return JSONResponse(await runtime.call(runtime.core.remove_static_members, group,
                                                   pairs))
        return await guarded(request, handle)

    async def put_config(request: Request) -> Response:
        async def handle(request: Request) -> Response:
            require_ready()
            body = await body_of(request, dict[str, Any])
            group = request.path_params["group"]
            return JSONResponse(await runtime.call(runtime.core.set_group_config, group, body))
        return await guarded(request, handle)

    async def get_config(request: Request) -> Response:
        async def handle(request: Request) -> Response:
            require_ready()
            group = request.path_params["group"]
            return JSONResponse({"group": group, "config": runtime.core.group_config(group),
                                 "effective": runtime.core.effective_group_config(group)})
        return await guarded(request, handle)

    routes = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/proxy", proxy_mapping, methods=["GET"]),
        Route("/groups", list_groups, methods=["GET"]),
        Route("/groups/{group}", get_group, methods=["GET"]),
        Route("/groups/{group}", delete_group, methods=["DELETE"]),
        Route("/groups/{group}/connectors", list_connectors, methods=["GET"]),
        Route("/groups/{group}/connectors/{connector}", get_connector, methods=["GET"]),
        Route("/groups/{group}/connectors/{connector}", put_connector, methods=["PUT"]),
        Route("/groups/{group}/connectors/{connector}", delete_connector, methods=["DELETE"]),
        Route("/groups/{group}/members/remove", remove_members, methods=["POST"]),
        Route("/groups/{group}/config", put_config, methods=["PUT"]),
        Route("/groups/{group}/config", get_config, methods=["GET"]),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error(404, "NOT_FOUND", f"no route {request.method} {request.url.path}")

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return _error(405, "METHOD_NOT_ALLOWED",
                      f"{request.method} is not allowed on {request.url.path}")

    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_allowed})
    return routed_on_raw_path(app)


# A percent sign not followed by two hex digits.
_BAD_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})")


def path_problem(raw_path: bytes) -> str | None:
    """Why a request's raw path cannot be taken as percent-encoded UTF-8 segments (None:
    it can). Nothing is guessed: a broken escape or byte is refused, never replaced."""
    if not raw_path.isascii():
        return "the path holds bytes outside ASCII: percent-encode them (UTF-8)"
    bad = _BAD_ESCAPE.search(raw_path)
    if bad is not None:
        return (f"the path has an invalid percent-escape at byte {bad.start()} (a '%' must "
                "be followed by two hex digits; send '%' itself as %25)")
    for segment in raw_path.split(b"/"):
        try:
            unquote_to_bytes(segment).decode("utf-8")
        except UnicodeDecodeError as error:
            return (f"the path segment {segment.decode('ascii', 'replace')!r} is not "
                    f"percent-encoded UTF-8 (byte {error.start} of its decoded form)")
    return None


def decoded_segment(segment: str) -> str:
    """A path segment as the raw path has it, percent-decoded (checked by `path_problem`)."""
    return unquote_to_bytes(segment).decode("utf-8") if "%" in segment else segment


def routed_on_raw_path(app: ASGIApp) -> ASGIApp:
    """The app, routed on the path as sent rather than as the server decoded it, so that
    a group id holding '/' can be addressed (sent as %2F, it stays inside its segment);
    each path parameter is then decoded on its own. A path that is not percent-encoded
    UTF-8 gets a 400 instead of a name with replacement characters in it."""

    async def routed(scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if raw is not None:
            raw_path = bytes(raw).partition(b"?")[0]
            problem = path_problem(raw_path)
            if problem is not None:
                await _error(400, "INVALID_PATH", problem)(scope, receive, send)
                return
            scope = {**scope, "path": raw_path.decode("ascii", "replace")}
        await app(scope, receive, send)

    return routed
