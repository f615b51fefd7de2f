"""The admin HTTP API (CONTRACT §6), a Starlette app served by hypercorn on trio.

Mutations go through the runtime like KRPC requests: core call, timers, log lines, then
the records are made durable before the answer. Bad input gets a 4xx with a JSON body
`{"error": ..., "message": ...}` and changes nothing.
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from coordinator.server.runtime import NotDurable, Runtime
from coordinator.units import CONNECTOR, format_unit
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


def classic_group_view(runtime: Runtime, group_id: str) -> dict[str, Any] | None:
    """A classic group's view as JSON (None if there is no classic group of that id)."""
    described = runtime.core.classic.describe(group_id)
    if described is None:
        return None
    return {
        "group_id": group_id,
        "type": "classic",
        "state": described.state,
        "generation": described.generation,
        "protocol_type": described.protocol_type,
        "protocol": described.protocol_name or None,
        "leader": described.leader,
        "members": [
            {"member_id": m.member_id, "instance_id": m.instance_id, "client_id": m.client_id,
             "client_host": m.client_host, "protocol": "classic"}
            for m in described.members
        ],
    }


def group_view(runtime: Runtime, group_id: str) -> dict[str, Any]:
    """The describe view as JSON, plus what no member's target holds."""
    classic = classic_group_view(runtime, group_id)
    if classic is not None:
        return classic
    described = runtime.core.describe_group(group_id)
    bridged = runtime.core.classic.store.bridged
    unassigned = sorted(runtime.core.unassigned_units(group_id))
    return {
        "group_id": described.group_id,
        "type": "connect",
        "state": described.group_state,
        "group_epoch": described.group_epoch,
        "assignment_epoch": described.assignment_epoch,
        "assignor": described.assignor_name,
        "connectors_and_tasks": _units_json(described.connectors_and_tasks),
        "unassigned": {
            "connectors": [name for name, task in unassigned if task == CONNECTOR],
            "tasks": [{"connector": name, "task": task}
                      for name, task in unassigned if task != CONNECTOR],
            "names": [format_unit(unit) for unit in unassigned],
        },
        "config": runtime.core.group_config(group_id),
        "members": [
            {
                "member_id": m.member_id,
                "protocol": "classic" if (group_id, m.member_id) in bridged else "connect",
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


def build_admin_app(runtime: Runtime) -> Starlette:
    async def guarded(request: Request, handler: Any) -> Response:
        try:
            return await handler(request)  # type: ignore[no-any-return]
        except ApiError as error:
            return _error(STATUS_BY_CODE.get(error.code, 400), error.code.name, error.message)
        except NotDurable:
            return _error(503, "COORDINATOR_NOT_AVAILABLE",
                          "the change could not be written to the log; retry")

    async def body_of(request: Request, kind: type[Any]) -> Any:
        raw = await request.body()
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

    async def metrics(request: Request) -> Response:
        return Response(runtime.metrics.render(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    async def list_groups(request: Request) -> Response:
        async def handle(request: Request) -> Response:
            require_ready()
            groups = []
            for group_id in runtime.core.group_ids():
                view = group_view(runtime, group_id)
                groups.append({key: view[key] for key in (
                    "group_id", "type", "state", "group_epoch", "assignment_epoch",
                    "assignor")} | {"members": len(view["members"])})
            for group_id in sorted(runtime.core.classic.store.groups):
                view = group_view(runtime, group_id)
                groups.append({key: view[key] for key in (
                    "group_id", "type", "state", "generation", "protocol")}
                    | {"members": len(view["members"])})
            return JSONResponse({"groups": groups})
        return await guarded(request, handle)

    async def get_group(request: Request) -> Response:
        async def handle(request: Request) -> Response:
            require_ready()
            return JSONResponse(group_view(runtime, request.path_params["group"]))
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
            body = await body_of(request, ConnectorBody)
            group, connector = request.path_params["group"], request.path_params["connector"]
            answer = await runtime.call(runtime.core.put_connector, group, connector, body.tasks)
            return JSONResponse(answer)
        return await guarded(request, handle)

    async def delete_connector(request: Request) -> Response:
        async def handle(request: Request) -> Response:
            require_ready()
            group, connector = request.path_params["group"], request.path_params["connector"]
            return JSONResponse(await runtime.call(runtime.core.delete_connector, group,
                                                   connector))
        return await guarded(request, handle)

    async def remove_members(request: Request) -> Response:
        async def handle(request: Request) -> Response:
            require_ready()
            body = await body_of(request, RemoveMembersBody)
            if not body.members:
                raise ApiError(ErrorCode.INVALID_REQUEST, "members must not be empty")
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
        Route("/groups", list_groups, methods=["GET"]),
        Route("/groups/{group}", get_group, methods=["GET"]),
        Route("/groups/{group}", delete_group, methods=["DELETE"]),
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

    return Starlette(routes=routes, exception_handlers={404: not_found, 405: not_allowed})
