"""Hand-packed encoding of the most frequent shapes: heartbeat responses (a new-protocol
member's and a classic member's) and unit lists.

A stable member's heartbeat answer is fixed-shape; packing it with struct is several times
cheaper than the generic entity writer. A member's units (`ConnectorsAndTasks`) go out in
every heartbeat answer that carries an assignment and in every assignment record; kio's
generic writer takes about 2 us per task, 110 us per answer and as much per record for a
member of 50 tasks (`bench core --epoch-bump`), and after each new target epoch every
member of the group answers and writes one. Each task's bytes are remembered instead.

Every function here must produce exactly the generic encoder's bytes
(tests/protocol/test_fastpath.py and tests/protocol/test_records.py check that with
generated values).
"""

from __future__ import annotations

import functools
import struct

from protocol._codec import INT16, INT32, uvarint
from protocol.messages import ConnectGroupHeartbeatResponse, ConnectorsAndTasks

# size, correlation id, header tagged fields (0); throttle, error code
_HEAD = struct.Struct(">iiBih")
# member epoch, heartbeat interval, null Assignment marker (-1), body tagged fields (0)
_TAIL = struct.Struct(">iibB")
# member epoch, heartbeat interval, present Assignment marker (1), assignment error
_ASSIGNMENT_HEAD = struct.Struct(">iibb")
NO_TAGGED_FIELDS = b"\x00"


def encode_heartbeat_response(correlation_id: int,
                              response: ConnectGroupHeartbeatResponse) -> bytes:
    """The framed response (header v1, body v0), with or without an assignment."""
    message = response.error_message
    # compact nullable string: 0 means null
    text = b"\x00" if message is None else compact_bytes(message.encode())
    assignment = response.assignment
    if assignment is None:
        body = _TAIL.pack(response.member_epoch, response.heartbeat_interval_ms, -1, 0)
    else:
        body = b"".join([
            _ASSIGNMENT_HEAD.pack(response.member_epoch, response.heartbeat_interval_ms, 1,
                                  assignment.error),
            connectors_and_tasks_bytes(assignment.assigned),
            INT16.pack(assignment.version),
            compact_bytes(assignment.metadata),
            NO_TAGGED_FIELDS,  # the assignment's
            NO_TAGGED_FIELDS,  # the body's
        ])
    size = 4 + 1 + 4 + 2 + len(text) + len(body)
    return (_HEAD.pack(size, correlation_id, 0, response.throttle_time_ms, response.error_code)
            + text + body)


# Kafka's Heartbeat response: header v0 and error code (v0); throttle first (v1-v3); header
# v1 and tagged fields (v4, flexible).
_CLASSIC_HEARTBEAT_V0 = struct.Struct(">iih")
_CLASSIC_HEARTBEAT_V1 = struct.Struct(">iiih")
_CLASSIC_HEARTBEAT_V4 = struct.Struct(">iiBihB")
CLASSIC_HEARTBEAT_VERSIONS = range(5)


def encode_classic_heartbeat_response(version: int, correlation_id: int, code: int) -> bytes:
    """The framed answer to a classic member's Heartbeat (v0-v4): no throttle, `code`."""
    if version == 0:
        return _CLASSIC_HEARTBEAT_V0.pack(6, correlation_id, code)
    if version < 4:
        return _CLASSIC_HEARTBEAT_V1.pack(10, correlation_id, 0, code)
    if version == 4:
        return _CLASSIC_HEARTBEAT_V4.pack(12, correlation_id, 0, 0, code, 0)
    raise ValueError(f"Heartbeat version {version} is not served")


def connectors_and_tasks_bytes(units: ConnectorsAndTasks) -> bytes:
    """A `ConnectorsAndTasks` struct (flexible): two compact arrays and no tagged fields."""
    string = _compact_string
    task = name_and_int32_bytes
    return b"".join([
        uvarint(len(units.connectors) + 1),
        *[string(name) for name in units.connectors],
        uvarint(len(units.tasks) + 1),
        *[task(unit.connector, unit.task) for unit in units.tasks],
        NO_TAGGED_FIELDS,
    ])


def compact_bytes(data: bytes) -> bytes:
    return uvarint(len(data) + 1) + data


# Bounded: a coordinator of many large groups keeps the most recently written entries.
@functools.lru_cache(maxsize=1 << 17)
def name_and_int32_bytes(name: str, number: int) -> bytes:
    """A struct of a string and an int32 (flexible): a task (connector, task number), or
    a connector entry of the connectors record (name, task count)."""
    return _compact_string(name) + INT32.pack(number) + NO_TAGGED_FIELDS


@functools.lru_cache(maxsize=1 << 16)
def _compact_string(text: str) -> bytes:
    encoded = text.encode()
    return uvarint(len(encoded) + 1) + encoded
