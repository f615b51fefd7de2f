"""Small helpers around kio's entity reader and writer shared by the record and wire codecs."""

from __future__ import annotations

import io
import struct
from typing import TypeVar

from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError
from kio.static.protocol import Entity

E = TypeVar("E", bound=Entity)

# What kio's native reader raises on bad input: its own errors, plus ValueError for an
# over-long varint and the like. Anything else is a bug and should propagate.
DECODE_ERRORS: tuple[type[Exception], ...] = (
    SerialError,
    ValueError,
    OverflowError,
    IndexError,
    struct.error,
)

INT16 = struct.Struct(">h")
INT32 = struct.Struct(">i")


def uvarint(value: int) -> bytes:
    """An unsigned varint (compact lengths), for the hand-packed encoders."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class EntityDecodeError(Exception):
    """kio could not parse an entity; the message says which one and why."""


def read_entity(entity_type: type[E], data: bytes | memoryview, offset: int) -> tuple[E, int]:
    """Decode one entity at ``offset``; return it and the offset just after it."""
    try:
        entity, size = entity_reader(entity_type)(data, offset)
    except DECODE_ERRORS as error:
        raise EntityDecodeError(
            f"cannot decode {entity_type.__name__}: {type(error).__name__}: {error}"
        ) from error
    return entity, offset + size


def write_entity(buffer: io.BytesIO, entity_type: type[E], entity: E) -> None:
    entity_writer(entity_type)(buffer, entity)


def entity_bytes(entity_type: type[E], entity: E) -> bytes:
    with io.BytesIO() as buffer:
        entity_writer(entity_type)(buffer, entity)
        return buffer.getvalue()
