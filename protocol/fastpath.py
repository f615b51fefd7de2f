"""Hand-packed encoding of the most frequent response: a heartbeat with no assignment.

A stable member's heartbeat answer is fixed-shape; packing it with struct is several times
cheaper than the generic entity writer. It must produce exactly the generic encoder's
bytes (tests/protocol/test_fastpath.py checks that across the whole value range).
"""

from __future__ import annotations

import struct

from protocol._codec import uvarint
from protocol.messages import ConnectGroupHeartbeatResponse

# size, correlation id, header tagged fields (0); throttle, error code
_HEAD = struct.Struct(">iiBih")
# member epoch, heartbeat interval, null Assignment marker (-1), body tagged fields (0)
_TAIL = struct.Struct(">iibB")


def encode_plain_heartbeat_response(correlation_id: int,
                                    response: ConnectGroupHeartbeatResponse) -> bytes | None:
    """The framed response, or None when it carries an assignment (use the generic path)."""
    if response.assignment is not None:
        return None
    message = response.error_message
    if message is None:
        text = b"\x00"  # compact nullable string: 0 means null
    else:
        encoded = message.encode()
        text = uvarint(len(encoded) + 1) + encoded
    size = 4 + 1 + 4 + 2 + len(text) + _TAIL.size
    return (
        _HEAD.pack(size, correlation_id, 0, response.throttle_time_ms, response.error_code)
        + text
        + _TAIL.pack(response.member_epoch, response.heartbeat_interval_ms, -1, 0)
    )
