"""KRPC framing and request/response codecs, sans-IO.

Every message on the wire is an int32 big-endian size followed by that many bytes.
:class:`FrameBuffer` cuts a byte stream into frames; :func:`decode_request` /
:func:`encode_response` (server side) and :func:`encode_request` / :func:`decode_response`
(client side) turn frames into kio entities and back.

Headers, per Kafka: requests use header v2 when the API version is flexible and v1 otherwise
(so ApiVersions v0-v2 use v1); responses use header v1 when flexible, except ApiVersions,
whose response header is always v0 so that a client can read it before it knows which
versions the server speaks.
"""

from __future__ import annotations

import datetime
import enum
import io
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields, is_dataclass, replace
from typing import Any, TypeAlias, get_args, get_origin

import kio.schema.api_versions.v0 as api_versions_v0
import kio.schema.api_versions.v0.response as api_versions_response_v0
import kio.schema.api_versions.v1 as api_versions_v1
import kio.schema.api_versions.v1.response as api_versions_response_v1
import kio.schema.api_versions.v2 as api_versions_v2
import kio.schema.api_versions.v2.response as api_versions_response_v2
import kio.schema.api_versions.v3 as api_versions_v3
import kio.schema.api_versions.v3.response as api_versions_response_v3
import kio.schema.api_versions.v4 as api_versions_v4
import kio.schema.api_versions.v4.response as api_versions_response_v4
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.static.primitive import i16, i32, i32Timedelta

from protocol import classic
from protocol._codec import INT16, INT32, EntityDecodeError, read_entity, write_entity
from protocol.errors import ErrorCode
from protocol.guard import (
    NO_LIMITS,
    SPLIT_ARRAYS,
    Limit,
    LimitExceeded,
    WalkError,
    check_request,
    compact_string_at,
    request_header_end,
)
from protocol.messages import (
    ConnectGroupDescribeRequest,
    ConnectGroupDescribeResponse,
    ConnectGroupDescribeResponseV0,
    ConnectGroupHeartbeatRequest,
    ConnectGroupHeartbeatResponse,
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupInstallAssignmentResponse,
    ConnectGroupPrepareAssignmentRequest,
    ConnectGroupPrepareAssignmentResponse,
)
from protocol.messages.connect_group_describe_response import DescribedGroup, DescribedGroupV0

API_VERSIONS = 18
CONNECT_GROUP_HEARTBEAT = 1000
CONNECT_GROUP_PREPARE_ASSIGNMENT = 1001
CONNECT_GROUP_INSTALL_ASSIGNMENT = 1002
CONNECT_GROUP_DESCRIBE = 1003

SUPPORTED_APIS: dict[int, tuple[int, int]] = {
    API_VERSIONS: (0, 4),
    CONNECT_GROUP_HEARTBEAT: (0, 0),
    CONNECT_GROUP_PREPARE_ASSIGNMENT: (0, 0),
    CONNECT_GROUP_INSTALL_ASSIGNMENT: (0, 0),
    CONNECT_GROUP_DESCRIBE: (0, 1),
} | {api_key: (low, high) for api_key, (_, low, high) in classic.CLASSIC_APIS.items()}
"""API key -> (min version, max version) the coordinator serves."""

ApiVersionsRequest: TypeAlias = (
    api_versions_v0.ApiVersionsRequest
    | api_versions_v1.ApiVersionsRequest
    | api_versions_v2.ApiVersionsRequest
    | api_versions_v3.ApiVersionsRequest
    | api_versions_v4.ApiVersionsRequest
)
ApiVersionsResponse: TypeAlias = (
    api_versions_v0.ApiVersionsResponse
    | api_versions_v1.ApiVersionsResponse
    | api_versions_v2.ApiVersionsResponse
    | api_versions_v3.ApiVersionsResponse
    | api_versions_v4.ApiVersionsResponse
)
RequestBody: TypeAlias = (
    ApiVersionsRequest
    | ConnectGroupHeartbeatRequest
    | ConnectGroupPrepareAssignmentRequest
    | ConnectGroupInstallAssignmentRequest
    | ConnectGroupDescribeRequest
)
ResponseBody: TypeAlias = (
    ApiVersionsResponse
    | ConnectGroupHeartbeatResponse
    | ConnectGroupPrepareAssignmentResponse
    | ConnectGroupInstallAssignmentResponse
    | ConnectGroupDescribeResponse
    | ConnectGroupDescribeResponseV0
)

_API_VERSIONS_MODULES = (
    api_versions_v0,
    api_versions_v1,
    api_versions_v2,
    api_versions_v3,
    api_versions_v4,
)

# ApiVersion (the list entry) lives in the response modules only.
_API_VERSIONS_RESPONSE_MODULES = (
    api_versions_response_v0,
    api_versions_response_v1,
    api_versions_response_v2,
    api_versions_response_v3,
    api_versions_response_v4,
)

# Kafka's classic APIs load their kio classes on first use (`protocol.classic.ClassTable`);
# the table holds the ApiVersions and Connect classes from the start.
REQUEST_CLASSES: dict[tuple[int, int], type[RequestBody]] = classic.REQUEST_CLASSES
REQUEST_CLASSES.update({
    (API_VERSIONS, version): module.ApiVersionsRequest
    for version, module in enumerate(_API_VERSIONS_MODULES)
} | {
    (CONNECT_GROUP_HEARTBEAT, 0): ConnectGroupHeartbeatRequest,
    (CONNECT_GROUP_PREPARE_ASSIGNMENT, 0): ConnectGroupPrepareAssignmentRequest,
    (CONNECT_GROUP_INSTALL_ASSIGNMENT, 0): ConnectGroupInstallAssignmentRequest,
    (CONNECT_GROUP_DESCRIBE, 0): ConnectGroupDescribeRequest,  # the same fields in v0 and v1
    (CONNECT_GROUP_DESCRIBE, 1): ConnectGroupDescribeRequest,
})
"""(API key, version) -> request class."""

RESPONSE_CLASSES: dict[tuple[int, int], type[ResponseBody]] = classic.RESPONSE_CLASSES
RESPONSE_CLASSES.update({
    (API_VERSIONS, version): module.ApiVersionsResponse
    for version, module in enumerate(_API_VERSIONS_MODULES)
} | {
    (CONNECT_GROUP_HEARTBEAT, 0): ConnectGroupHeartbeatResponse,
    (CONNECT_GROUP_PREPARE_ASSIGNMENT, 0): ConnectGroupPrepareAssignmentResponse,
    (CONNECT_GROUP_INSTALL_ASSIGNMENT, 0): ConnectGroupInstallAssignmentResponse,
    (CONNECT_GROUP_DESCRIBE, 0): ConnectGroupDescribeResponseV0,
    (CONNECT_GROUP_DESCRIBE, 1): ConnectGroupDescribeResponse,
})
"""(API key, version) -> response class."""


# api_key, api_version, correlation_id: the part of every request header we can read
# before knowing which header version the request uses.
_FIXED_HEADER_BYTES = 8


# -- errors ------------------------------------------------------------------------------


class ProtocolError(Exception):
    """Base of every error this module raises."""


class FrameError(ProtocolError):
    """The byte stream cannot be cut into frames any more; close the connection."""


class MalformedFrame(FrameError):
    """A frame size prefix that cannot be right (negative)."""


class FrameTooLarge(FrameError):
    """A frame size prefix above the configured maximum."""

    def __init__(self, size: int, max_frame_bytes: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the maximum of {max_frame_bytes}")
        self.size = size
        self.max_frame_bytes = max_frame_bytes


class MalformedRequest(ProtocolError):
    """A request whose header or body does not parse, or that has trailing bytes."""


class MalformedBody(MalformedRequest):
    """A request whose header parsed but whose body does not have its schema's shape.

    The frame boundary is intact, so the server answers INVALID_REQUEST (it knows the API,
    version and correlation id) and keeps the connection.
    """

    def __init__(self, message: str, api_key: int, api_version: int,
                 correlation_id: int) -> None:
        super().__init__(message)
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


class RequestOverLimit(MalformedBody):
    """A request with an array over a configured limit (the message names its key)."""


class MalformedResponse(ProtocolError):
    """A response whose header or body does not parse, or that has trailing bytes."""


class UnsupportedApi(ProtocolError):
    """A request for an API key or version the coordinator does not serve.

    Raised after the fixed part of the header is read, so the server can answer it with
    :func:`error_response` and keep the connection.
    """

    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        if api_key in SUPPORTED_APIS:
            low, high = SUPPORTED_APIS[api_key]
            detail = f"version {api_version} of API {api_key} (supported: {low}-{high})"
        else:
            detail = f"API key {api_key} (version {api_version})"
        super().__init__(f"unsupported {detail}")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


# -- framing -------------------------------------------------------------------------------


class FrameBuffer:
    """Cuts a byte stream into frames (int32 big-endian size prefix + body).

    Feed it whatever the socket returns; take complete frames with :meth:`next_frame` or by
    iterating. A size prefix is checked as soon as its 4 bytes arrive, so an oversized frame
    is refused before its body is buffered. After a :class:`FrameError` the stream is out of
    sync: frames completed before the bad prefix can still be taken, further feeds raise.
    """

    def __init__(self, max_frame_bytes: int) -> None:
        if max_frame_bytes < 0:
            raise ValueError("max_frame_bytes must not be negative")
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._body_size: int | None = None  # size of the frame being read, once known
        self._frames: deque[bytes] = deque()
        self._error: FrameError | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        return len(self._buffer)

    @property
    def missing_bytes(self) -> int:
        """Bytes still to come for the frame being read (0 if its size is not known yet)."""
        if self._body_size is None:
            return 0
        return max(0, self._body_size - len(self._buffer))

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._error is not None:
            raise self._error
        self._buffer += data
        self._cut_frames()

    def _cut_frames(self) -> None:
        buffer = self._buffer
        start = 0
        try:
            while True:
                if self._body_size is None:
                    if len(buffer) - start < INT32.size:
                        break
                    size: int = INT32.unpack_from(buffer, start)[0]
                    start += INT32.size
                    self._check_size(size)
                    self._body_size = size
                if len(buffer) - start < self._body_size:
                    break
                end = start + self._body_size
                # One copy: slicing the bytearray first would make two (an 8 MiB frame:
                # 2,048 page faults each, on the event loop).
                with memoryview(buffer) as view:
                    self._frames.append(bytes(view[start:end]))
                start = end
                self._body_size = None
        finally:
            del buffer[:start]

    def _check_size(self, size: int) -> None:
        if size < 0:
            self._error = MalformedFrame(f"negative frame size {size}")
        elif size > self.max_frame_bytes:
            self._error = FrameTooLarge(size, self.max_frame_bytes)
        if self._error is not None:
            raise self._error

    def next_frame(self) -> bytes | None:
        """The next complete frame (without its size prefix), or None if there is none yet."""
        return self._frames.popleft() if self._frames else None

    def __iter__(self) -> Iterator[bytes]:
        while self._frames:
            yield self._frames.popleft()


# -- headers -------------------------------------------------------------------------------


def _is_flexible(api_key: int, api_version: int) -> bool:
    return REQUEST_CLASSES[api_key, api_version].__flexible__


def _request_header_type(
    api_key: int, api_version: int
) -> type[RequestHeaderV1] | type[RequestHeaderV2]:
    return RequestHeaderV2 if _is_flexible(api_key, api_version) else RequestHeaderV1


def _response_header_type(
    api_key: int, api_version: int
) -> type[ResponseHeaderV0] | type[ResponseHeaderV1]:
    if api_key == API_VERSIONS or not _is_flexible(api_key, api_version):
        return ResponseHeaderV0
    return ResponseHeaderV1


def _framed(write: Any) -> bytes:
    """Run ``write(buffer)`` and return what it wrote behind an int32 size prefix."""
    with io.BytesIO() as buffer:
        write(buffer)
        payload = buffer.getvalue()
    return INT32.pack(len(payload)) + payload


# -- server side ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DecodedRequest:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: RequestBody


def decode_request(frame: bytes, limits: Mapping[int, Mapping[tuple[str, str], Limit]] | None = None
                   ) -> DecodedRequest:
    """Parse one request frame (without its size prefix).

    The frame is walked first (protocol/guard.py): lengths checked against the bytes
    there, unknown tagged fields dropped, `limits` applied to its arrays. Raises
    UnsupportedApi for an API key or version not in SUPPORTED_APIS, MalformedRequest for a
    header that does not parse, MalformedBody for a body that does not (or bytes left over
    after it), RequestOverLimit for an array over its limit (`limits`: API key -> the
    array limits of its requests). Nothing else.
    """
    api_key, api_version, correlation_id = _fixed_header(frame)
    body_type = REQUEST_CLASSES.get((api_key, api_version))
    if body_type is None:
        raise UnsupportedApi(api_key, api_version, correlation_id)
    return decode_request_as(frame, body_type, _is_flexible(api_key, api_version),
                             NO_LIMITS if limits is None else limits.get(api_key, NO_LIMITS))


def _fixed_header(frame: bytes) -> tuple[int, int, int]:
    """The API key, version and correlation id every request header starts with."""
    if len(frame) < _FIXED_HEADER_BYTES:
        raise MalformedRequest(
            f"request header truncated: {len(frame)} bytes, need at least {_FIXED_HEADER_BYTES}"
        )
    return (INT16.unpack_from(frame, 0)[0], INT16.unpack_from(frame, 2)[0],
            INT32.unpack_from(frame, 4)[0])


def decode_request_as(frame: bytes, body_type: type[Any], flexible: bool,
                      limits: Mapping[tuple[str, str], Limit] = NO_LIMITS) -> DecodedRequest:
    """Parse one request frame (without its size prefix) whose body is a `body_type`: the
    one path every request the coordinator reads goes through, whichever listener read
    it. The frame is walked first (lengths against the bytes there, unknown tagged fields
    dropped, `limits` applied), then decoded. Raises MalformedRequest for a header that
    does not parse, MalformedBody for a body that does not, RequestOverLimit for a field
    over its limit. Nothing else."""
    api_key, api_version, correlation_id = _fixed_header(frame)
    header_type: type[RequestHeaderV1] | type[RequestHeaderV2] = (
        RequestHeaderV2 if flexible else RequestHeaderV1)
    try:
        body_offset, header_tagged = request_header_end(frame, flexible)
    except WalkError as error:
        raise MalformedRequest(f"bad request header: {error}") from None
    try:
        frame, marks = check_request(frame, body_type, body_offset, header_tagged, limits)
    except LimitExceeded as error:
        raise RequestOverLimit(f"{_what(body_type, api_version)}: {error}", api_key, api_version,
                               correlation_id) from None
    except WalkError as error:
        raise MalformedBody(f"bad {_what(body_type, api_version)} body: {error}", api_key,
                            api_version, correlation_id) from None
    try:
        header, offset = read_entity(header_type, frame, 0)
        if len(marks) > SPLIT_ELEMENTS:
            return DecodedRequest(api_key, api_version, correlation_id, header.client_id,
                                  _read_split(body_type, frame, offset, marks))
        body, end = read_entity(body_type, frame, offset)
    except EntityDecodeError as error:  # e.g. a string that is not UTF-8
        raise MalformedBody(f"bad {_what(body_type, api_version)} body: {error}", api_key,
                            api_version, correlation_id) from None
    if end != len(frame):  # pragma: no cover - the walk checked this
        raise MalformedBody(f"{len(frame) - end} trailing bytes after the "
                            f"{_what(body_type, api_version)} body",
                            api_key, api_version, correlation_id)
    return DecodedRequest(api_key, api_version, correlation_id, header.client_id, body)


def peek_caller(frame: bytes) -> tuple[str, str, int] | None:
    """The group id, member id and member epoch a flexible request body opens with (a
    Connect assignment request's first three fields), read without decoding the rest;
    None where they do not read that way (the full decode then says what is wrong)."""
    if len(frame) < _FIXED_HEADER_BYTES:
        return None
    api = (INT16.unpack_from(frame, 0)[0], INT16.unpack_from(frame, 2)[0])
    if api not in REQUEST_CLASSES or not _is_flexible(*api):
        return None
    try:
        offset, _tagged = request_header_end(frame, True)
        group_id, offset = compact_string_at(frame, offset, "GroupId")
        member_id, offset = compact_string_at(frame, offset, "MemberId")
    except (WalkError, UnicodeDecodeError):
        return None
    if group_id is None or member_id is None or len(frame) < offset + 4:
        return None
    epoch: int = INT32.unpack_from(frame, offset)[0]
    return group_id, member_id, epoch


def _what(body_type: type[Any], api_version: int) -> str:
    return f"{body_type.__name__} v{api_version}"


# Arrays of more elements than this (of SPLIT_ARRAYS) are decoded an element at a time,
# offering the GIL to other threads every YIELD_EVERY elements.
SPLIT_ELEMENTS = 64
YIELD_EVERY = 32


def _read_split(body_type: type[Any], frame: bytes, offset: int, marks: list[int]) -> Any:
    """A body whose split array is read an element at a time (each a short native call,
    so another thread may take the GIL between them), the rest as a shell with the array
    empty."""
    array_start, elements, array_end = marks[0], marks[1:-1], marks[-1]
    shell_frame = frame[:array_start] + b"\x01" + frame[array_end:]  # compact: 0 elements
    shell, end = read_entity(body_type, shell_frame, offset)
    if end != len(shell_frame):  # pragma: no cover - the walk checked this
        raise EntityDecodeError("trailing bytes after the split body")
    (field_name, element_type), = _split_fields(body_type)
    items = []
    for index, start in enumerate(elements):
        item, _ = read_entity(element_type, frame, start)
        items.append(item)
        if index % YIELD_EVERY == YIELD_EVERY - 1:
            time.sleep(0)  # let a waiting thread (the event loop) take the GIL now
    return replace(shell, **{field_name: tuple(items)})


def _split_fields(body_type: type[Any]) -> list[tuple[str, type[Any]]]:
    found = []
    for entity_field in fields(body_type):
        if (body_type.__name__, entity_field.name) in SPLIT_ARRAYS:
            found.append((entity_field.name, get_args(entity_field.type)[0]))
    return found


def _check_body(
    classes: dict[tuple[int, int], type[Any]], api_key: int, api_version: int, body: object
) -> type[Any]:
    expected = classes.get((api_key, api_version))
    if expected is None:
        raise ValueError(f"API {api_key} version {api_version} is not supported")
    if type(body) is not expected:
        raise TypeError(
            f"API {api_key} v{api_version} needs {expected.__module__}.{expected.__name__}, "
            f"got {type(body).__module__}.{type(body).__name__}"
        )
    return expected


def encode_response(
    api_key: int, api_version: int, correlation_id: int, body: ResponseBody
) -> bytes:
    """Encode a response, size prefix included."""
    body_type = _check_body(RESPONSE_CLASSES, api_key, api_version, body)
    return _encode_response_as(body_type, _response_header_type(api_key, api_version),
                               correlation_id, body)


def _encode_response_as(body_type: type[Any], header_type: type[Any], correlation_id: int,
                        body: Any) -> bytes:
    header = header_type(correlation_id=i32(correlation_id))

    def write(buffer: io.BytesIO) -> None:
        write_entity(buffer, header_type, header)
        write_entity(buffer, body_type, body)

    return _framed(write)


def _api_version_entries(module: Any) -> tuple[Any, ...]:
    return tuple(
        module.ApiVersion(api_key=i16(key), min_version=i16(low), max_version=i16(high))
        for key, (low, high) in sorted(SUPPORTED_APIS.items())
    )


def _kio_error_code(code: int) -> KioErrorCode:
    try:
        return KioErrorCode(code)
    except ValueError:
        # Our own codes (1000, 1001) are not in kio's enum; ApiVersions never carries them.
        return KioErrorCode.unknown_server_error


def api_versions_response(version: int, code: int = ErrorCode.NONE) -> ApiVersionsResponse:
    """The ApiVersions response body of ``version`` (0-4) listing SUPPORTED_APIS."""
    if not 0 <= version < len(_API_VERSIONS_MODULES):
        raise ValueError(f"ApiVersions version {version} is not supported")
    module = _API_VERSIONS_RESPONSE_MODULES[version]
    arguments: dict[str, Any] = {
        "error_code": _kio_error_code(code),
        "api_keys": _api_version_entries(module),
    }
    if version >= 1:
        arguments["throttle_time"] = i32Timedelta.parse(datetime.timedelta(0))
    response: ApiVersionsResponse = module.ApiVersionsResponse(**arguments)
    return response


def _zero_value(annotation: Any, field_name: str) -> Any:
    """An "empty" value for a required field of a generated class."""
    if get_origin(annotation) is tuple:
        return ()
    if annotation is int:
        return 0
    if annotation is str:
        return ""
    if annotation is bytes:
        return b""
    if annotation is bool:
        return False
    if is_dataclass(annotation) and isinstance(annotation, type):
        return zero_entity(annotation)
    if None in (args := get_args(annotation)) or type(None) in args:
        return None
    if isinstance(annotation, type):  # kio's own primitives: i32, i32Timedelta, ErrorCode
        if issubclass(annotation, enum.IntEnum):
            return annotation(0)
        if issubclass(annotation, datetime.timedelta):
            parse: Any = getattr(annotation, "parse", None)
            return parse(datetime.timedelta(0)) if parse else datetime.timedelta(0)
        if issubclass(annotation, (int, str)):
            return annotation()
    raise TypeError(f"no empty value for {field_name}: {annotation!r}")


def zero_entity(entity_type: type[Any], **values: Any) -> Any:
    """An instance with ``values`` set and every other required field empty (0, "", ())."""
    for entity_field in fields(entity_type):
        if entity_field.name in values:
            continue
        if entity_field.default is MISSING and entity_field.default_factory is MISSING:
            values[entity_field.name] = _zero_value(entity_field.type, entity_field.name)
    return entity_type(**values)


def error_response(
    api_key: int,
    api_version: int,
    correlation_id: int,
    code: int,
    message: str,
    *,
    group_ids: Sequence[str] = (),
) -> bytes:
    """A complete, framed error response for any request, even an unsupported one.

    - Connect APIs: their v0 response with ``code`` and ``message`` and every other field
      empty (0, "", []). ConnectGroupDescribe has no top-level error, so the error goes
      into one described group per id of ``group_ids`` (one with an empty id if none given).
    - ApiVersions: with ``code`` and the supported API list, in v0 for UNSUPPORTED_VERSION
      or an unsupported version (as Kafka does), else in the requested version. It has no
      message field, so ``message`` is dropped.
    - An unknown API key: response header v0 and an int16 error code. The client's parser
      for an API we do not know is unknowable, and header v0 plus a leading error code is
      what Kafka's own "unsupported" answer (ApiVersions v0) starts with, so a client at
      least finds the correlation id and UNSUPPORTED_VERSION where it would look first.
    """
    header_bytes = INT32.pack(correlation_id)
    if api_key == API_VERSIONS:
        # UNSUPPORTED_VERSION always goes out as v0, which is what clients parse it as.
        supported = (API_VERSIONS, api_version) in RESPONSE_CLASSES
        version = api_version if supported and code != ErrorCode.UNSUPPORTED_VERSION else 0
        return encode_response(
            API_VERSIONS, version, correlation_id, api_versions_response(version, code)
        )
    if api_key not in SUPPORTED_APIS:
        body = INT16.pack(ErrorCode.UNSUPPORTED_VERSION)
        return INT32.pack(len(header_bytes) + len(body)) + header_bytes + body
    if api_key in classic.CLASSIC_APIS:
        # Kafka's APIs have no error message field. A version not served is answered in
        # its own form where its schema is known (a newer client's version), else in the
        # nearest version served.
        low, high = SUPPORTED_APIS[api_key]
        answered = classic.response_class(api_key, api_version)
        if answered is None:
            api_version = min(max(api_version, low), high)
            answered = classic.response_class(api_key, api_version)
        assert answered is not None
        header_type = (ResponseHeaderV1 if answered.__flexible__ else ResponseHeaderV0)
        return _encode_response_as(
            answered, header_type, correlation_id,
            classic.error_body(api_key, api_version, code, tuple(group_ids), message))
    # A Connect API's unsupported version is answered with v0.
    low, high = SUPPORTED_APIS[api_key]
    served = api_version if low <= api_version <= high else 0
    response_type = RESPONSE_CLASSES[api_key, served]
    error_fields: dict[str, Any] = {"error_code": int(code), "error_message": message}
    if api_key == CONNECT_GROUP_DESCRIBE:
        group_type = DescribedGroup if served else DescribedGroupV0
        groups = tuple(
            zero_entity(group_type, group_id=group_id, **error_fields)
            for group_id in (group_ids or ("",))
        )
        response = zero_entity(response_type, groups=groups)
    else:
        response = zero_entity(response_type, **error_fields)
    return encode_response(api_key, served, correlation_id, response)


# -- client side ---------------------------------------------------------------------------


def encode_request(
    api_key: int,
    api_version: int,
    correlation_id: int,
    client_id: str | None,
    body: RequestBody,
) -> bytes:
    """Encode a request, size prefix included."""
    body_type = _check_body(REQUEST_CLASSES, api_key, api_version, body)
    header_type = _request_header_type(api_key, api_version)
    header = header_type(
        request_api_key=i16(api_key),
        request_api_version=i16(api_version),
        correlation_id=i32(correlation_id),
        client_id=client_id,
    )

    def write(buffer: io.BytesIO) -> None:
        write_entity(buffer, header_type, header)
        write_entity(buffer, body_type, body)

    return _framed(write)


def decode_response(frame: bytes, api_key: int, api_version: int) -> tuple[int, ResponseBody]:
    """Parse one response frame (without its size prefix): (correlation id, body).

    An ApiVersions response carrying UNSUPPORTED_VERSION is read as v0 whatever version was
    asked for, since that is how Kafka (and this coordinator) answers unsupported versions.
    """
    body_type = RESPONSE_CLASSES.get((api_key, api_version))
    if body_type is None:
        raise ValueError(f"API {api_key} version {api_version} is not supported")
    header_type = _response_header_type(api_key, api_version)
    try:
        header, offset = read_entity(header_type, frame, 0)
    except EntityDecodeError as error:
        raise MalformedResponse(f"bad response header: {error}") from error
    if (
        api_key == API_VERSIONS
        and len(frame) >= offset + INT16.size
        and INT16.unpack_from(frame, offset)[0] == ErrorCode.UNSUPPORTED_VERSION
    ):
        body_type = RESPONSE_CLASSES[API_VERSIONS, 0]
    try:
        body, end = read_entity(body_type, frame, offset)
    except EntityDecodeError as error:
        raise MalformedResponse(f"bad {body_type.__name__} body: {error}") from error
    if end != len(frame):
        raise MalformedResponse(f"{len(frame) - end} trailing bytes after {body_type.__name__}")
    return int(header.correlation_id), body
