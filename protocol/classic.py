"""Kafka's classic group APIs and the broker APIs a group client needs, as kio classes.

A Connect worker finds its coordinator and joins its group with Kafka's own APIs:
Metadata and FindCoordinator to find it, then JoinGroup, SyncGroup, Heartbeat and
LeaveGroup, and tools look at groups with DescribeGroups and ListGroups. Their message
classes are kio's (one module per API and version); this module lists the versions served
and builds any version of a message from the same keyword arguments (:func:`build`), so
the code that answers a request does not depend on its version.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
from typing import Any

from kio.schema.errors import ErrorCode as KioErrorCode

JOIN_GROUP = 11
HEARTBEAT = 12
LEAVE_GROUP = 13
SYNC_GROUP = 14
DESCRIBE_GROUPS = 15
LIST_GROUPS = 16
FIND_COORDINATOR = 10
METADATA = 3

# API key -> (kio package, min version, max version) served (the versions of Kafka 4's
# Java client, so a worker never falls back to older ones).
CLASSIC_APIS: dict[int, tuple[str, int, int]] = {
    METADATA: ("metadata", 0, 12),
    FIND_COORDINATOR: ("find_coordinator", 0, 6),
    JOIN_GROUP: ("join_group", 0, 9),
    HEARTBEAT: ("heartbeat", 0, 4),
    LEAVE_GROUP: ("leave_group", 0, 5),
    SYNC_GROUP: ("sync_group", 0, 5),
    DESCRIBE_GROUPS: ("describe_groups", 0, 5),
    LIST_GROUPS: ("list_groups", 0, 5),
}

_ROOT_NAMES = {
    METADATA: "Metadata",
    FIND_COORDINATOR: "FindCoordinator",
    JOIN_GROUP: "JoinGroup",
    HEARTBEAT: "Heartbeat",
    LEAVE_GROUP: "LeaveGroup",
    SYNC_GROUP: "SyncGroup",
    DESCRIBE_GROUPS: "DescribeGroups",
    LIST_GROUPS: "ListGroups",
}


def module(api_key: int, version: int, kind: str) -> Any:
    """kio's module for the request or response (`kind`) of an API version."""
    package = CLASSIC_APIS[api_key][0]
    return importlib.import_module(f"kio.schema.{package}.v{version}.{kind}")


class ClassTable(dict[tuple[int, int], type[Any]]):
    """(API key, version) -> message class, importing kio's module of a version the first
    time it is asked for: the 130 modules of every version served took 1.2 s to import,
    which a coordinator paid at every start (and a worker that never asks for most)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self._kind = kind
        self._served = {(api_key, version) for api_key, (_, low, high) in CLASSIC_APIS.items()
                        for version in range(low, high + 1)}

    def _load(self, key: tuple[int, int]) -> type[Any]:
        api_key, version = key
        suffix = "Request" if self._kind == "request" else "Response"
        loaded: type[Any] = getattr(module(api_key, version, self._kind),
                                    _ROOT_NAMES[api_key] + suffix)
        self[key] = loaded
        return loaded

    def get(self, key: tuple[int, int], default: Any = None) -> Any:
        loaded = dict.get(self, key)  # every request asks: the loaded case first
        if loaded is not None:
            return loaded
        return self._load(key) if key in self._served else default

    def __missing__(self, key: tuple[int, int]) -> type[Any]:
        if key not in self._served:
            raise KeyError(key)
        return self._load(key)

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or key in self._served

    def keys_served(self) -> set[tuple[int, int]]:
        return set(self._served)


REQUEST_CLASSES = ClassTable("request")
RESPONSE_CLASSES = ClassTable("response")


def response_class(api_key: int, version: int) -> type[Any] | None:
    """The response class of any version kio has of a classic API, served or not (a
    newer version is refused in its own form, which is what its client reads)."""
    try:
        return RESPONSE_CLASSES[api_key, version]
    except KeyError:
        pass
    try:
        loaded: type[Any] = getattr(module(api_key, version, "response"),
                                    _ROOT_NAMES[api_key] + "Response")
    except ImportError:
        return None
    return loaded


def kio_error(code: int) -> KioErrorCode:
    try:
        return KioErrorCode(code)
    except ValueError:  # this project's own codes: the classic APIs never carry them
        return KioErrorCode.unknown_server_error


def _convert(entity_field: dataclasses.Field[Any], value: Any) -> Any:
    kind = entity_field.metadata.get("kafka_type")
    if kind == "error_code" and not isinstance(value, KioErrorCode):
        return kio_error(int(value))
    if kind == "timedelta_i32" and isinstance(value, int):
        return datetime.timedelta(milliseconds=value)
    return value


def build(entity_type: type[Any], **values: Any) -> Any:
    """An instance of `entity_type` from `values`: the ones it has no field for are
    dropped (a newer version's field in an older version), error codes and millisecond
    timeouts are converted to kio's types, and required fields not given are zero."""
    arguments: dict[str, Any] = {}
    for entity_field in dataclasses.fields(entity_type):
        name = entity_field.name
        if name in values:
            arguments[name] = _convert(entity_field, values[name])
        elif (entity_field.default is dataclasses.MISSING
              and entity_field.default_factory is dataclasses.MISSING):
            arguments[name] = _zero(entity_field)
    return entity_type(**arguments)


def _zero(entity_field: dataclasses.Field[Any]) -> Any:
    kind = entity_field.metadata.get("kafka_type")
    if kind == "error_code":
        return KioErrorCode.none
    if kind == "timedelta_i32":
        return datetime.timedelta(0)
    if kind in ("string",):
        return ""
    if kind in ("bytes", "records"):
        return b""
    if kind == "bool":
        return False
    if kind is None or str(entity_field.type).startswith("tuple"):
        return ()
    return 0


def nested(api_key: int, version: int, kind: str, struct: str, /, **values: Any) -> Any:
    """A nested struct (a member, a coordinator, ...) of an API version."""
    return build(getattr(module(api_key, version, kind), struct), **values)


def timeout_ms(value: Any) -> int:
    """A kio i32 timedelta field as milliseconds."""
    if isinstance(value, datetime.timedelta):
        return round(value.total_seconds() * 1000)
    return int(value)


def error_body(api_key: int, version: int, code: int, group_ids: tuple[str, ...] = (),
               message: str | None = None) -> Any:
    """The response of an API version reporting `code` and nothing else. The answers that
    are lists of entries (DescribeGroups, FindCoordinator from v4) carry it in an entry per
    id of `group_ids`, or in one with an empty id (a request refused before its ids were
    read), so that a client finds the error where it looks; `message` goes where the
    version has room for it."""
    response_type = response_class(api_key, version)
    if response_type is None:
        raise KeyError((api_key, version))
    if api_key == DESCRIBE_GROUPS:
        groups = tuple(
            nested(api_key, version, "response", "DescribedGroup", error_code=code,
                   group_id=group_id, group_state="Dead")
            for group_id in group_ids or ("",))
        return build(response_type, groups=groups)
    if api_key == JOIN_GROUP:
        # (The protocol name may be null from v7 on; before, it is a string.)
        return build(response_type, error_code=code, generation_id=-1,
                     protocol_name=None if version >= 7 else "")
    if api_key == FIND_COORDINATOR and version >= 4:
        coordinators = tuple(
            nested(api_key, version, "response", "Coordinator", key=key, node_id=-1,
                   host="", port=-1, error_code=code, error_message=message)
            for key in group_ids or ("",))
        return build(response_type, coordinators=coordinators)
    if api_key == FIND_COORDINATOR:
        return build(response_type, error_code=code, error_message=message, node_id=-1,
                     port=-1)
    if api_key == METADATA:
        # (A top-level error code from v13 on; before, Metadata has none.)
        return build(response_type, controller_id=-1, error_code=code)
    return build(response_type, error_code=code)
