"""The proxy's sans-IO part: what to do with a request, and how to rewrite the few responses
that carry broker addresses.

Nothing here touches a socket. A request frame (without its size prefix) is classified by
:func:`classify` into a :class:`Routing`; a forwarded response that carries addresses is
decoded with :func:`decode_response`, its endpoints read with :func:`endpoints` and
replaced with :func:`rewrite`, and encoded again with :func:`encode_response`. ApiVersions
answers are intersected with what the proxy can relay (:func:`intersect_api_versions`).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import io
import re
import struct
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32

from protocol import classic as classic_apis
from protocol._codec import INT16, INT32, EntityDecodeError, read_entity, write_entity
from protocol.framing import (
    DecodedRequest,
    FrameError,
    FrameTooLarge,
    MalformedFrame,
    MalformedRequest,
    MalformedResponse,
    decode_request_as,
    zero_entity,
)
from protocol.guard import NO_LIMITS, Limits
from protocol.sasl import REFUSAL as SASL_REFUSAL
from protocol.sasl import SASL_APIS as SASL_APIS
from protocol.sasl import sasl_refusal

PRODUCE = 0
FETCH = 1
# Kafka's group APIs, numbered once (protocol/classic.py), as the coordinator serves them.
METADATA = classic_apis.METADATA
FIND_COORDINATOR = classic_apis.FIND_COORDINATOR
JOIN_GROUP = classic_apis.JOIN_GROUP
HEARTBEAT = classic_apis.HEARTBEAT
LEAVE_GROUP = classic_apis.LEAVE_GROUP
SYNC_GROUP = classic_apis.SYNC_GROUP
DESCRIBE_GROUPS = classic_apis.DESCRIBE_GROUPS
LIST_GROUPS = classic_apis.LIST_GROUPS
OFFSET_COMMIT = 8
OFFSET_FETCH = 9
API_VERSIONS = 18
TXN_OFFSET_COMMIT = 28
DELETE_GROUPS = 42
OFFSET_DELETE = 47
DESCRIBE_QUORUM = 55
DESCRIBE_CLUSTER = 60
CONSUMER_GROUP_HEARTBEAT = 68
CONSUMER_GROUP_DESCRIBE = 69
SHARE_FETCH = 78
SHARE_ACKNOWLEDGE = 79
CONNECT_GROUP_APIS = frozenset({1000, 1001, 1002, 1003})

GROUP_KEY_TYPE = 0  # FindCoordinator's key type of a consumer/connect group

# Versions above these carry node endpoints (KIP-951) that the proxy does not rewrite, or
# (DescribeCluster v2) may list controllers, whose addresses must not be taken for the
# brokers' own; the proxy's ApiVersions answer caps them so that clients never ask for them.
VERSION_CAPS = {PRODUCE: 9, FETCH: 15, DESCRIBE_CLUSTER: 1}
# Responses that carry broker addresses this proxy does not rewrite (controller endpoints,
# share-group leader endpoints): left out of ApiVersions altogether, and a client that
# asks all the same is answered UNSUPPORTED_VERSION (`refusal`), never relayed.
LEFT_OUT = frozenset({DESCRIBE_QUORUM, SHARE_FETCH, SHARE_ACKNOWLEDGE})
# Responses decoded and rewritten on the way back.
# (ListGroups: the upstream's list, with the owned groups' entries replaced by this
# coordinator's own.)
REWRITTEN = frozenset({METADATA, DESCRIBE_CLUSTER, FIND_COORDINATOR, API_VERSIONS,
                       LIST_GROUPS})


def _snake_to_camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


API_NAMES: dict[int, str] = {key: _snake_to_camel(name) for key, name in api_key_map.items()}
"""Every Kafka API key kio knows -> its name (the proxy's `api` metric label)."""


def api_name(api_key: int) -> str:
    return API_NAMES.get(api_key, "unknown")


@functools.cache
def known_versions(api_key: int) -> tuple[int, int] | None:
    """(lowest, highest) version whose schemas kio has, or None for an unknown API."""
    name = api_key_map.get(api_key)
    if name is None:
        return None
    versions = [version for version, types in schema_name_map[name].items()
                if EntityType.request in types and EntityType.response in types]
    return (min(versions), max(versions)) if versions else None


@functools.cache
def _request_type(api_key: int, api_version: int) -> Any:
    return load_request_schema(api_key, api_version)


@functools.cache
def _response_type(api_key: int, api_version: int) -> Any:
    return load_response_schema(api_key, api_version)


def is_flexible(api_key: int, api_version: int) -> bool:
    return bool(_request_type(api_key, api_version).__flexible__)


# -- requests ------------------------------------------------------------------------------

Frame = bytes | memoryview
"""A request frame as the proxy reads it: a view into the bytes one read returned where
the frame lay whole in that read, so forwarding it copies nothing."""


class FrameCutter:
    """Cuts a client's byte stream into request frames, copying as little as it can.

    The frames that lie whole in one read come back as views of that read's bytes (size
    prefix included), so a forwarded frame reaches the upstream socket with no copy in
    between; only a frame that spans reads is gathered (its pieces appended as they come,
    then taken as bytes once it is whole). Views of immutable bytes stay valid as long as
    they are held. A size prefix is checked as soon as its 4 bytes are there; after a bad
    one, the frames before it are still returned and `error` is set: the stream is out of
    sync and every later `cut` raises it.
    """

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._pending = bytearray()  # the start of a frame that the next reads continue
        self._needed = 0  # bytes `_pending` must hold before cutting again is worth it
        self.error: FrameError | None = None

    @property
    def buffered_bytes(self) -> int:
        return len(self._pending)

    def cut(self, data: bytes) -> list[memoryview]:
        """The frames `data` completes, in order, each a view with its size prefix."""
        if self.error is not None:
            raise self.error
        if self._pending:
            self._pending += data
            if len(self._pending) < self._needed:
                return []
            data = bytes(self._pending)
            self._pending = bytearray()
        frames: list[memoryview] = []
        view = memoryview(data)
        start, length = 0, len(data)
        self._needed = 4
        while length - start >= 4:
            size = INT32.unpack_from(data, start)[0]
            if size < 0 or size > self.max_frame_bytes:
                self.error = (MalformedFrame(f"negative frame size {size}") if size < 0
                              else FrameTooLarge(size, self.max_frame_bytes))
                return frames
            end = start + 4 + size
            if end > length:
                self._needed = end - start
                break
            frames.append(view[start:end])
            start = end
        if start < length:
            self._pending += view[start:]
        return frames



@dataclass(frozen=True, slots=True)
class RequestHead:
    api_key: int
    api_version: int
    correlation_id: int


def peek(frame: Frame) -> RequestHead:
    """The fixed start of every request header (the same in every header version)."""
    if len(frame) < 8:
        raise MalformedRequest(f"request header truncated: {len(frame)} bytes, need 8")
    return RequestHead(INT16.unpack_from(frame, 0)[0], INT16.unpack_from(frame, 2)[0],
                       INT32.unpack_from(frame, 4)[0])


def decode_request(frame: Frame, head: RequestHead,
                   limits: Mapping[int, Limits] | None = None) -> DecodedRequest:
    """The request, decoded by the coordinator's one guarded path (protocol/framing.py):
    walked against its bytes and held to `limits` (API key -> the limits of its requests,
    those the listener applies) before anything is allocated, unknown tagged fields
    skipped. Raises MalformedRequest, or its MalformedBody / RequestOverLimit where the
    frame boundary holds and the request can be answered."""
    if not _has_schema(head.api_key, head.api_version):
        raise MalformedRequest(f"API {head.api_key} v{head.api_version} is beyond what the "
                               "proxy offered in ApiVersions")
    limit = NO_LIMITS if limits is None else limits.get(head.api_key, NO_LIMITS)
    return decode_request_as(bytes(frame), _request_type(head.api_key, head.api_version),
                             is_flexible(head.api_key, head.api_version), limit)


def _read_uvarint(frame: Frame, offset: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if offset >= len(frame) or shift > 28:
            raise MalformedRequest("bad varint in request header")
        byte = frame[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7


def produce_acks(frame: Frame, head: RequestHead) -> int:
    """The `acks` of a Produce request, read without decoding its records: after the
    header come the nullable transactional id and then acks (int16)."""
    flexible = head.api_version >= 9
    try:
        client_id_length = INT16.unpack_from(frame, 8)[0]
        offset = 10 + max(client_id_length, 0)
        if flexible:  # header tagged fields: count, then (tag, size, data) each
            count, offset = _read_uvarint(frame, offset)
            for _ in range(count):
                _, offset = _read_uvarint(frame, offset)
                size, offset = _read_uvarint(frame, offset)
                offset += size
            length_plus_one, offset = _read_uvarint(frame, offset)
            offset += max(length_plus_one - 1, 0)
        else:
            transactional_id_length = INT16.unpack_from(frame, offset)[0]
            offset += 2 + max(transactional_id_length, 0)
        return int(INT16.unpack_from(frame, offset)[0])
    except (IndexError, ValueError, struct.error) as error:
        raise MalformedRequest(f"cannot read the acks of a Produce request: {error}") from None


def _offset_fetch_groups(body: Any) -> tuple[str, ...]:
    groups = getattr(body, "groups", None)
    if groups is not None and not hasattr(body, "group_id"):
        return tuple(group.group_id for group in groups)
    return (body.group_id,)


GROUP_IDS: dict[int, Callable[[Any], tuple[str, ...]]] = {
    OFFSET_COMMIT: lambda body: (body.group_id,),
    OFFSET_FETCH: _offset_fetch_groups,
    JOIN_GROUP: lambda body: (body.group_id,),
    HEARTBEAT: lambda body: (body.group_id,),
    LEAVE_GROUP: lambda body: (body.group_id,),
    SYNC_GROUP: lambda body: (body.group_id,),
    DESCRIBE_GROUPS: lambda body: tuple(body.groups),
    TXN_OFFSET_COMMIT: lambda body: (body.group_id,),
    DELETE_GROUPS: lambda body: tuple(body.groups_names),
    OFFSET_DELETE: lambda body: (body.group_id,),
    CONSUMER_GROUP_HEARTBEAT: lambda body: (body.group_id,),
    CONSUMER_GROUP_DESCRIBE: lambda body: tuple(body.group_ids),
}
"""Group APIs by key -> the group ids a request names. A request naming an owned group is
answered by the coordinator (its local handler, or an error where it has none yet)."""


class Action(enum.Enum):
    LOCAL = "local"  # the coordinator's own handlers answer
    FIND_COORDINATOR = "find_coordinator"  # every key is an owned group: answered here
    FORWARD = "forward"  # relayed to the upstream broker
    REFUSE = "refuse"  # answered here with an error (`refusal`), never relayed


@dataclass(frozen=True, slots=True)
class Routing:
    head: RequestHead
    action: Action
    rewrite: bool = False  # the response is decoded and its addresses rewritten
    expects_response: bool = True  # False for Produce with acks=0
    owned_keys: frozenset[str] = frozenset()  # FindCoordinator keys answered as ours
    coordinator_keys: tuple[str, ...] = ()  # a FindCoordinator's keys, in request order
    # The decoded request, where the rewrite needs it (ListGroups) or an owned group's is
    # answered locally: decoded once, here.
    request: DecodedRequest | None = None


class GroupMatcher:
    """`proxy.groups`: a regular expression a whole group id must match."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._regex = re.compile(pattern)

    def __call__(self, group_id: str) -> bool:
        return self._regex.fullmatch(group_id) is not None


def reads_body(head: RequestHead) -> bool:
    """Whether `classify` decodes this request's body (not only its header)."""
    key = head.api_key
    if key in (FIND_COORDINATOR, LIST_GROUPS) or key in GROUP_IDS:
        return _has_schema(key, head.api_version)
    return False


def classify(frame: Frame, owned: Callable[[str], bool],
             limits: Mapping[int, Limits] | None = None) -> Routing:
    """What to do with one request frame. The requests read here are decoded with `limits`
    (`decode_request`). Raises MalformedRequest for a frame too short to have a header, or
    a request read here that does not parse (MalformedBody / RequestOverLimit where it can
    be answered)."""
    head = peek(frame)
    key = head.api_key
    if key in CONNECT_GROUP_APIS:
        return Routing(head, Action.LOCAL)
    if key in LEFT_OUT or key in SASL_APIS:
        return Routing(head, Action.REFUSE)
    if key == API_VERSIONS and not _has_schema(key, head.api_version):
        # Newer than the proxy can read: the local answer is UNSUPPORTED_VERSION in v0,
        # and the client retries with a version from its list.
        return Routing(head, Action.LOCAL)
    if key == FIND_COORDINATOR and not _has_schema(key, head.api_version):
        # Newer than the proxy can read: refused locally in the nearest form it knows.
        return Routing(head, Action.LOCAL)
    if key == FIND_COORDINATOR:
        body: Any = decode_request(frame, head, limits).body
        keys = tuple(body.coordinator_keys) if head.api_version >= 4 else (body.key,)
        key_type = int(getattr(body, "key_type", GROUP_KEY_TYPE))
        ours = frozenset(k for k in keys if key_type == GROUP_KEY_TYPE and owned(k))
        if keys and len(ours) == len(set(keys)):
            return Routing(head, Action.FIND_COORDINATOR, owned_keys=ours,
                           coordinator_keys=keys)
        return Routing(head, Action.FORWARD, rewrite=True, owned_keys=ours,
                       coordinator_keys=keys)
    if key == LIST_GROUPS and _has_schema(key, head.api_version):
        return Routing(head, Action.FORWARD, rewrite=True,
                       request=decode_request(frame, head, limits))
    group_ids = GROUP_IDS.get(key)
    if group_ids is not None and _has_schema(key, head.api_version):
        request = decode_request(frame, head, limits)
        if any(owned(group) for group in group_ids(request.body)):
            return Routing(head, Action.LOCAL, request=request)
    if key in REWRITTEN:
        return Routing(head, Action.FORWARD, rewrite=True)
    if key == PRODUCE:
        return Routing(head, Action.FORWARD, expects_response=produce_acks(frame, head) != 0)
    return Routing(head, Action.FORWARD)


def refusal(head: RequestHead) -> tuple[bytes | None, str]:
    """The answer to a request the proxy refuses (Action.REFUSE), and why; None for an
    answer that cannot be built (the connection is then closed).

    An API left out of ApiVersions is answered UNSUPPORTED_VERSION, as a broker answers an
    API it does not have: a Kafka client reads it as "not supported by the broker" and
    stops, where a closed connection would only make it retry. SASL: protocol/sasl.py."""
    if head.api_key in SASL_APIS:
        return sasl_refusal(head.api_key, head.api_version, head.correlation_id), SASL_REFUSAL
    message = (f"{api_name(head.api_key)} is not relayed by this proxy: its answer names "
               "addresses the proxy does not rewrite")
    return error_answer(head.api_key, head.api_version, head.correlation_id,
                        KioErrorCode.unsupported_version, message), message


def owned_group_ids(frame: Frame, head: RequestHead) -> tuple[str, ...]:
    """The group ids a group request names, where the proxy can read it; else none."""
    group_ids = GROUP_IDS.get(head.api_key)
    if group_ids is None or not _has_schema(head.api_key, head.api_version):
        return ()
    try:
        return group_ids(decode_request(frame, head).body)
    except MalformedRequest:
        return ()


def _has_schema(api_key: int, api_version: int) -> bool:
    known = known_versions(api_key)
    return known is not None and known[0] <= api_version <= known[1]


def encode_request(api_key: int, api_version: int, correlation_id: int, body: Any,
                   client_id: str = "connect-coordinator") -> bytes:
    """A request frame, size prefix included (the proxy's own probes; tests)."""
    header_type = RequestHeaderV2 if is_flexible(api_key, api_version) else RequestHeaderV1
    header = header_type(request_api_key=i16(api_key), request_api_version=i16(api_version),
                         correlation_id=i32(correlation_id), client_id=client_id)
    with io.BytesIO() as buffer:
        write_entity(buffer, header_type, header)
        write_entity(buffer, type(body), body)
        payload = buffer.getvalue()
    return INT32.pack(len(payload)) + payload


# -- responses -----------------------------------------------------------------------------


def _response_header_type(api_key: int, api_version: int) -> Any:
    if api_key == API_VERSIONS or not is_flexible(api_key, api_version):
        return ResponseHeaderV0
    return ResponseHeaderV1


def decode_response(frame: bytes, api_key: int, api_version: int) -> tuple[int, Any]:
    """(correlation id, body) of a response frame without its size prefix. An ApiVersions
    answer with UNSUPPORTED_VERSION is read as v0, as Kafka sends it."""
    header_type = _response_header_type(api_key, api_version)
    try:
        header, offset = read_entity(header_type, frame, 0)
        if (api_key == API_VERSIONS and len(frame) >= offset + 2
                and INT16.unpack_from(frame, offset)[0] == KioErrorCode.unsupported_version):
            api_version = 0
        body, end = read_entity(_response_type(api_key, api_version), frame, offset)
    except EntityDecodeError as error:
        raise MalformedResponse(str(error)) from error
    if end != len(frame):
        raise MalformedResponse(f"{len(frame) - end} trailing bytes after API {api_key} "
                                f"v{api_version} response")
    return int(header.correlation_id), body


def encode_response(api_key: int, api_version: int, correlation_id: int, body: Any) -> bytes:
    """A response frame, size prefix included (the body's own version decides its schema)."""
    header_type = _response_header_type(api_key, api_version)
    with io.BytesIO() as buffer:
        write_entity(buffer, header_type, header_type(correlation_id=i32(correlation_id)))
        write_entity(buffer, type(body), body)
        payload = buffer.getvalue()
    return INT32.pack(len(payload)) + payload


@dataclass(frozen=True, slots=True)
class Endpoint:
    node_id: int
    host: str
    port: int


def endpoints(api_key: int, api_version: int, body: Any) -> list[Endpoint]:
    """Every broker endpoint a response names (FindCoordinator errors name none)."""
    if api_key == METADATA:
        return [Endpoint(int(b.node_id), b.host, int(b.port)) for b in body.brokers]
    if api_key == DESCRIBE_CLUSTER:
        return [Endpoint(int(b.broker_id), b.host, int(b.port)) for b in body.brokers]
    if api_key == FIND_COORDINATOR:
        entries = body.coordinators if api_version >= 4 else (body,)
        return [Endpoint(int(e.node_id), e.host, int(e.port)) for e in entries
                if e.error_code == KioErrorCode.none and int(e.node_id) >= 0]
    return []


def rewrite(api_key: int, api_version: int, body: Any,
            local_address: Callable[[int], tuple[str, int]],
            coordinator: Endpoint, owned_keys: frozenset[str] = frozenset()) -> Any:
    """The body with every broker endpoint replaced by its local one (`local_address` of
    its node id), and the owned keys of a FindCoordinator answered with the coordinator."""
    replace = dataclasses.replace

    def moved(entry: Any, node_id: int) -> Any:
        host, port = local_address(node_id)
        return replace(entry, host=host, port=i32(port))

    if api_key == METADATA:
        return replace(body, brokers=tuple(moved(b, int(b.node_id)) for b in body.brokers))
    if api_key == DESCRIBE_CLUSTER:
        return replace(body, brokers=tuple(moved(b, int(b.broker_id)) for b in body.brokers))
    if api_key == FIND_COORDINATOR:
        ours = {"node_id": i32(coordinator.node_id), "host": coordinator.host,
                "port": i32(coordinator.port), "error_code": KioErrorCode.none,
                "error_message": None}

        def entry_of(entry: Any, key: str | None) -> Any:
            if key is not None and key in owned_keys:
                return replace(entry, **ours)
            if entry.error_code != KioErrorCode.none or int(entry.node_id) < 0:
                return entry
            return moved(entry, int(entry.node_id))

        if api_version >= 4:
            return replace(body, coordinators=tuple(entry_of(entry, entry.key)
                                                    for entry in body.coordinators))
        return entry_of(body, None)
    return body


@dataclass(frozen=True, slots=True)
class LocalGroup:
    group_id: str
    protocol_type: str
    state: str  # as Kafka names it: "Stable", "PreparingRebalance", ...
    group_type: str  # "classic" or "connect"


def merge_listed_groups(body: Any, request: Any, local: Iterable[LocalGroup],
                        owned: Callable[[str], bool]) -> Any:
    """A ListGroups answer from upstream with the owned groups' entries replaced by the
    coordinator's own groups (those that match `proxy.groups`), filtered as the request
    asks (states from v4, types from v5), in group id order."""
    entry_type = sys.modules[type(body).__module__].ListedGroup
    entry_fields = entry_type.__dataclass_fields__
    states = {state.lower() for state in getattr(request, "states_filter", ())}
    types = {kind.lower() for kind in getattr(request, "types_filter", ())}
    entries = [entry for entry in body.groups if not owned(entry.group_id)]
    for group in local:
        if not owned(group.group_id):
            continue
        if states and group.state.lower() not in states:
            continue
        if types and group.group_type.lower() not in types:
            continue
        values = {"group_id": group.group_id, "protocol_type": group.protocol_type,
                  "group_state": group.state, "group_type": group.group_type}
        entries.append(zero_entity(entry_type, **{name: value for name, value in values.items()
                                                  if name in entry_fields}))
    entries.sort(key=lambda entry: str(entry.group_id))
    return dataclasses.replace(body, groups=tuple(entries))


def find_coordinator_answer(api_version: int, correlation_id: int, keys: Iterable[str],
                            coordinator: Endpoint, error_code: int = 0,
                            error_message: str | None = None) -> bytes:
    """A FindCoordinator response naming the coordinator for every key (or, with an error,
    naming no node: node id -1, empty host, port -1)."""
    response_type = _response_type(FIND_COORDINATOR, api_version)
    failed = error_code != 0
    entry = {
        "node_id": i32(-1 if failed else coordinator.node_id),
        "host": "" if failed else coordinator.host,
        "port": i32(-1 if failed else coordinator.port),
        "error_code": KioErrorCode(error_code),
        "error_message": error_message,
    }
    if api_version >= 4:
        entry_type = sys.modules[response_type.__module__].Coordinator
        body = zero_entity(response_type, coordinators=tuple(
            zero_entity(entry_type, key=key, **entry) for key in keys))
    else:
        fields = {name: value for name, value in entry.items()
                  if name in response_type.__dataclass_fields__}
        body = zero_entity(response_type, **fields)
    return encode_response(FIND_COORDINATOR, api_version, correlation_id, body)


def error_answer(api_key: int, api_version: int, correlation_id: int, error_code: int,
                 message: str) -> bytes | None:
    """A response of this API and version carrying `error_code` at its top level, every
    other field empty; None for an API whose response has no top-level error code."""
    if not _has_schema(api_key, api_version):
        return None
    response_type = _response_type(api_key, api_version)
    fields = response_type.__dataclass_fields__
    if "error_code" not in fields:
        return None
    values: dict[str, Any] = {"error_code": KioErrorCode(error_code)}
    if "error_message" in fields:
        values["error_message"] = message
    return encode_response(api_key, api_version, correlation_id,
                           zero_entity(response_type, **values))


def unsupported_api_versions_answer(correlation_id: int, low: int, high: int) -> bytes:
    """UNSUPPORTED_VERSION for an ApiVersions version newer than the proxy serves, in the
    v0 form every client reads, naming the versions it does serve: the client retries with
    the highest of them on the same connection (KIP-511)."""
    module = sys.modules[_response_type(API_VERSIONS, 0).__module__]
    body = module.ApiVersionsResponse(
        error_code=KioErrorCode.unsupported_version,
        api_keys=(module.ApiVersion(api_key=i16(API_VERSIONS), min_version=i16(low),
                                    max_version=i16(high)),))
    return encode_response(API_VERSIONS, 0, correlation_id, body)


def intersect_api_versions(body: Any, local: Mapping[int, tuple[int, int]],
                           local_group_apis: Iterable[int] = ()) -> Any:
    """The upstream's ApiVersions answer as the proxy gives it to clients.

    An upstream API is kept within the versions the proxy can relay: versions kio can read
    for the APIs whose answers are rewritten (and ApiVersions itself), the caps for Produce
    and Fetch; APIs kio does not know and those with unrewritten addresses are left out.
    APIs answered locally for owned groups (`local_group_apis`) are also capped to the
    local range, so one version works for both; the coordinator's own APIs are added.
    """
    entry_type = type(body.api_keys[0]) if body.api_keys else None
    if entry_type is None:
        return body
    local_group = set(local_group_apis)
    entries: list[Any] = []
    for entry in body.api_keys:
        key, low, high = int(entry.api_key), int(entry.min_version), int(entry.max_version)
        known = known_versions(key)
        if known is None or key in LEFT_OUT:
            continue
        if key in REWRITTEN:
            low, high = max(low, known[0]), min(high, known[1])
        if key in VERSION_CAPS:
            high = min(high, VERSION_CAPS[key])
        if key in local and (key in local_group or key == API_VERSIONS):
            low, high = max(low, local[key][0]), min(high, local[key][1])
        if low <= high:
            entries.append(entry_type(api_key=i16(key), min_version=i16(low),
                                      max_version=i16(high)))
    present = {int(entry.api_key) for entry in entries}
    for key, (low, high) in sorted(local.items()):
        if key not in present and key not in {int(e.api_key) for e in body.api_keys}:
            entries.append(entry_type(api_key=i16(key), min_version=i16(low),
                                      max_version=i16(high)))
    entries.sort(key=lambda entry: int(entry.api_key))
    return dataclasses.replace(body, api_keys=tuple(entries))


__all__ = [
    "Action", "Endpoint", "Frame", "FrameCutter", "GroupMatcher", "LocalGroup", "RequestHead",
    "Routing", "api_name",
    "classify", "merge_listed_groups",
    "decode_response", "encode_request", "encode_response", "endpoints", "error_answer",
    "find_coordinator_answer", "intersect_api_versions", "owned_group_ids",
    "unsupported_api_versions_answer", "rewrite",
]
