"""SASL's two APIs, refused with a clear answer until the coordinator speaks SASL.

A client configured for SASL opens every connection with SaslHandshake. Answered
UNSUPPORTED_SASL_MECHANISM with an empty list of mechanisms, it fails at once with an
error naming the mechanism it asked for and the (empty) list the server enables, rather
than waiting for a handshake that never completes. SaslAuthenticate (sent only after a
handshake) gets the same error and a message that says why.
"""

from __future__ import annotations

import io
from dataclasses import fields
from typing import Any

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.static.primitive import i32

from protocol._codec import INT32, write_entity
from protocol.errors import ErrorCode
from protocol.framing import zero_entity

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
SASL_APIS: dict[int, tuple[int, int]] = {SASL_HANDSHAKE: (0, 1), SASL_AUTHENTICATE: (0, 2)}
"""API key -> (lowest, highest) version refused with an answer (others: the connection
is closed, as for any request that cannot be read)."""

REFUSAL = ("SASL is not supported by this coordinator yet: connect without SASL "
           "(security.protocol=PLAINTEXT)")


def sasl_refusal(api_key: int, api_version: int, correlation_id: int) -> bytes | None:
    """The framed answer refusing a SASL request, or None for a version not known here."""
    versions = SASL_APIS.get(api_key)
    if versions is None or not versions[0] <= api_version <= versions[1]:
        return None
    response_type: Any = load_response_schema(api_key, api_version)
    values: dict[str, Any] = {
        "error_code": KioErrorCode(int(ErrorCode.UNSUPPORTED_SASL_MECHANISM))}
    if "error_message" in {field.name for field in fields(response_type)}:
        values["error_message"] = REFUSAL
    header_type: Any = ResponseHeaderV1 if response_type.__flexible__ else ResponseHeaderV0
    with io.BytesIO() as buffer:
        write_entity(buffer, header_type, header_type(correlation_id=i32(correlation_id)))
        write_entity(buffer, response_type, zero_entity(response_type, **values))
        payload = buffer.getvalue()
    return INT32.pack(len(payload)) + payload
