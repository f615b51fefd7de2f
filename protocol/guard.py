"""A request frame's shape checked before kio decodes it.

kio's native reader trusts the lengths it reads: a compact array that declares 2^32 elements
makes it reserve room for all of them first (the process aborts), and a tagged field it does
not know raises KeyError. So every request frame is walked here first, by the same schema
kio will read it with, touching no more than the bytes it holds:

- every declared string, bytes and array length is checked against the bytes left before
  anything is read (an element takes at least one byte, so an array can never declare more
  elements than there are bytes left);
- null where the schema does not allow it (an array, a string, a struct) is refused;
- tagged fields are skipped, as Kafka's rules say: no request the coordinator serves has a
  tagged field it knows, so every tagged-field section is cut down to "none" in the copy
  handed to kio (the common frame has none and is handed over as it is); a section of
  more than MAX_TAGGED_FIELDS is refused;
- arrays may carry limits (:class:`ArrayLimit`): an array whose declared count would take a
  counter over its limit is refused when its count is read, before its elements are walked;
- strings and bytes may carry limits (:class:`LengthLimit`): one whose declared length is
  over its limit is refused when its length is read (ids too long to store in a record,
  urls and metadata too large to hand out to every member).

The walk costs about as much as the frame has elements; the limits bound that.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

from protocol._codec import INT16, INT32


class WalkError(Exception):
    """The frame does not have the shape its schema says; the message says where."""


@dataclass(frozen=True, slots=True)
class ArrayLimit:
    """At most `maximum` elements over the arrays that share `counter` in one request;
    `key` is the configuration key that sets it (named in the refusal)."""

    counter: str
    maximum: int
    key: str


@dataclass(frozen=True, slots=True)
class LengthLimit:
    """At most `maximum` bytes in one string or bytes field; `key` is the configuration
    key that sets it (named in the refusal)."""

    maximum: int
    key: str


class LimitExceeded(Exception):
    """An array would take its counter over its limit, or a string or bytes field is
    longer than its limit; the message names the field and the configuration key."""

    def __init__(self, message: str, limit: ArrayLimit | LengthLimit) -> None:
        super().__init__(message)
        self.limit = limit


SPLIT_ARRAYS = frozenset({("ConnectGroupInstallAssignmentRequest", "members")})
"""Top-level arrays whose elements' offsets the walk notes (`check_request`), so that a
large one can be decoded an element at a time: kio's native reader holds the GIL for a
whole entity (about 100 ms for an Install of 100,000 units, even in a thread)."""

# No request the coordinator serves has a tagged field it knows; a client that adds a few
# is skipped over, one that sends millions (a frame full of empty ones took 1.7 s to walk)
# is refused.
MAX_TAGGED_FIELDS = 64

_FIXED_SIZES = {"int8": 1, "int16": 2, "int32": 4, "int64": 8, "uint8": 1, "uint16": 2,
                "uint32": 4, "uint64": 8, "float64": 8, "bool": 1, "uuid": 16,
                "error_code": 2, "timedelta_i32": 4, "timedelta_i64": 8,
                "datetime_i64": 8}

Limit = ArrayLimit | LengthLimit


class Limits(Mapping[tuple[str, str], Limit]):
    """(entity class name, field name) -> the limit of that array, string or bytes field;
    (entity class name, field name + "[]") -> the length limit of each string in an array
    of strings. Immutable; it keeps the walks generated for it (`walker`)."""

    __slots__ = ("_limits", "walkers")

    def __init__(self, limits: Mapping[tuple[str, str], Limit] | None = None) -> None:
        self._limits = dict(limits or {})
        # entity type -> its walk with these limits (the code depends on nothing else)
        self.walkers: dict[type[Any], Callable[[_Walk, int], int]] = {}

    def __getitem__(self, key: tuple[str, str]) -> Limit:
        return self._limits[key]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._limits)

    def __len__(self) -> int:
        return len(self._limits)

    def walker(self, entity_type: type[Any]) -> Callable[[_Walk, int], int]:
        """The walk function of `entity_type` with these limits, generated once."""
        walker = self.walkers.get(entity_type)
        if walker is None:
            walker = self.walkers[entity_type] = _generate_walker(entity_type, self)
        return walker


NO_LIMITS = Limits()


class _Walk:
    __slots__ = ("data", "end", "tagged", "counts", "marks")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.end = len(data)
        self.tagged: list[tuple[int, int]] = []  # (start, end) of non-empty tagged sections
        self.counts: dict[str, int] = {}
        self.marks: list[int] = []  # offsets of a split array: its start, elements, end

    def need(self, offset: int, size: int, what: str) -> int:
        if size > self.end - offset:
            raise WalkError(f"{what}: {size} bytes declared, {max(0, self.end - offset)} left")
        return offset + size

    def uvarint(self, offset: int, what: str) -> tuple[int, int]:
        data, value, shift = self.data, 0, 0
        while True:
            if offset >= self.end:
                raise WalkError(f"{what}: truncated varint")
            byte = data[offset]
            offset += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value, offset
            shift += 7
            if shift > 28:
                raise WalkError(f"{what}: varint longer than 5 bytes")

    def tagged_fields(self, offset: int, what: str) -> int:
        start = offset
        count, offset = self.uvarint(offset, what + " tagged fields")
        if count == 0:
            return offset
        if count > MAX_TAGGED_FIELDS:
            raise WalkError(f"{what}: {count} tagged fields, more than the "
                            f"{MAX_TAGGED_FIELDS} a section may hold here")
        if count > self.end - offset:
            raise WalkError(f"{what}: {count} tagged fields declared, {self.end - offset} "
                            "bytes left")
        for _ in range(count):
            _tag, offset = self.uvarint(offset, what + " tag")
            size, offset = self.uvarint(offset, what + " tagged field size")
            offset = self.need(offset, size, what + " tagged field")
        self.tagged.append((start, offset))
        return offset

    @staticmethod
    def null(what: str) -> None:
        raise WalkError(f"{what}: null is not allowed")

    @staticmethod
    def bad_length(length: int, what: str) -> None:
        raise WalkError(f"{what}: null is not allowed" if length == -1
                        else f"{what}: length {length}")

    @staticmethod
    def bad_marker(marker: int, what: str) -> None:
        raise WalkError(f"{what}: struct marker {marker}, expected -1 or 1")

    def check_count(self, declared: int, offset: int, limit: ArrayLimit | None,
                    what: str) -> None:
        if declared > self.end - offset:  # every element takes at least one byte
            raise WalkError(f"{what}: {declared} elements declared, "
                            f"{max(0, self.end - offset)} bytes left")
        if limit is None:
            return
        total = self.counts.get(limit.counter, 0) + declared
        if total > limit.maximum:
            raise LimitExceeded(f"{what}: {declared} elements take the request over its "
                                f"limit of {limit.maximum} ({limit.key})", limit)
        self.counts[limit.counter] = total

    @staticmethod
    def too_long(size: int, limit: LengthLimit, what: str) -> None:
        raise LimitExceeded(f"{what} is {size} bytes, above the limit of {limit.maximum} "
                            f"({limit.key})", limit)


class _Source:
    """Python source of one walk function, every nested field inlined.

    Generated rather than composed of closures: a heartbeat's owned tasks are walked on
    every heartbeat that carries them, and inlined code with the one-byte varint case
    first walks them in a fraction of the time. Bounds: reading `data[o]` past the end
    raises IndexError (caught as "truncated"); skipped lengths are checked once, at the
    end, and before every array count (an array may not declare more elements than bytes
    left).
    """

    def __init__(self, limits: Limits) -> None:
        self.lines: list[str] = []
        self.constants: dict[str, Any] = {}
        self.limits = limits
        self.serial = 0

    def name(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}{self.serial}"

    def constant(self, value: Any) -> str:
        name = self.name("k")
        self.constants[name] = value
        return name

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def uvarint(self, depth: int, target: str, what: str) -> None:
        self.emit(depth, f"{target} = data[o]")
        self.emit(depth, f"if {target} < 128: o += 1")
        self.emit(depth, f"else: {target}, o = walk.uvarint(o, {self.constant(what)})")

    def length(self, depth: int, kafka_type: str, flexible: bool, nullable: bool,
               what: str, limit: Limit | None) -> None:
        if flexible:  # compact: the length plus one, 0 for null
            self.uvarint(depth, "n", what)
            self.emit(depth, "if n: o += n - 1")
            if not nullable:
                self.emit(depth, f"else: walk.null({self.constant(what)})")
            size = "n - 1"
        else:
            prefix = "h" if kafka_type == "string" else "i"
            width = 2 if prefix == "h" else 4
            self.emit(depth, f"n = unpack_{prefix}(data, o)[0]; o += {width}")
            self.emit(depth, "if n >= 0: o += n")
            allowed = "n == -1" if nullable else "False"
            self.emit(depth, f"elif not ({allowed}): walk.bad_length(n, {self.constant(what)})")
            size = "n"
        if isinstance(limit, LengthLimit):
            self.emit(depth, f"if {size} > {limit.maximum}: "
                             f"walk.too_long({size}, {self.constant(limit)}, "
                             f"{self.constant(what)})")

    def primitive(self, depth: int, kafka_type: str, flexible: bool, nullable: bool,
                  what: str, limit: Limit | None = None) -> None:
        if kafka_type in ("string", "bytes", "records"):
            self.length(depth, kafka_type, flexible, nullable, what, limit)
            return
        size = _FIXED_SIZES.get(kafka_type)
        if size is None:
            raise TypeError(f"{what}: no check for kafka type {kafka_type!r}")
        self.emit(depth, f"o += {size}")

    def array(self, depth: int, flexible: bool, nullable: bool, what: str,
              limit: ArrayLimit | None, element: Callable[[int], None],
              split: bool = False) -> None:
        count = self.name("c")
        label = self.constant(what)
        if split:
            self.emit(depth, "walk.marks.append(o)")
        if flexible:
            self.uvarint(depth, count, what)
            self.emit(depth, f"{count} -= 1")
        else:
            self.emit(depth, f"{count} = unpack_i(data, o)[0]; o += 4")
        self.emit(depth, f"if {count} < 0:")
        allowed = f"{count} == -1" if nullable else "False"
        self.emit(depth + 1, f"if not ({allowed}): walk.bad_length({count}, {label})")
        self.emit(depth, "else:")
        self.emit(depth + 1, f"walk.check_count({count}, o, {self.constant(limit)}, {label})")
        self.emit(depth + 1, f"for _ in range({count}):")
        if split:
            self.emit(depth + 2, "walk.marks.append(o)")
        element(depth + 2)
        if split:
            self.emit(depth, "walk.marks.append(o)")

    def entity(self, depth: int, entity_type: type[Any]) -> None:
        flexible: bool = entity_type.__flexible__
        name = entity_type.__name__
        for field in fields(entity_type):
            if get_field_tag(field) is not None:
                continue  # tagged: read (and dropped) with the tagged-field section
            what = f"{name}.{field.name}"
            nullable = is_optional(field)
            field_class = classify_field(field)
            limit = self.limits.get((name, field.name))
            if isinstance(field_class, PrimitiveField):
                self.primitive(depth, get_schema_field_type(field), flexible, nullable, what,
                               limit)
            elif isinstance(field_class, PrimitiveTupleField):
                kafka_type = get_schema_field_type(field)
                element_limit = self.limits.get((name, field.name + "[]"))
                self.array(depth, flexible, nullable, what,
                           limit if isinstance(limit, ArrayLimit) else None,
                           lambda d, t=kafka_type, w=what + "[]",  # type: ignore[misc]
                           el=element_limit: self.primitive(d, t, flexible, False, w, el))
            elif isinstance(field_class, EntityField):
                if nullable:
                    self.emit(depth, "m = data[o]; o += 1")
                    self.emit(depth, "if m == 1:")
                    self.entity(depth + 1, field_class.type_)
                    self.emit(depth, f"elif m != 255: walk.bad_marker(m, {self.constant(what)})")
                else:
                    self.entity(depth, field_class.type_)
            elif isinstance(field_class, EntityTupleField):
                inner = field_class.type_
                self.array(depth, flexible, nullable, what,
                           limit if isinstance(limit, ArrayLimit) else None,
                           lambda d, t=inner: self.entity(d, t),  # type: ignore[misc]
                           split=depth == 1 and (name, field.name) in SPLIT_ARRAYS)
            else:  # pragma: no cover - kio knows no other kind
                raise TypeError(f"{what}: unknown field kind {field_class!r}")
        if flexible:
            self.emit(depth, "if data[o]: o = walk.tagged_fields(o, " f"{self.constant(name)})")
            self.emit(depth, "else: o += 1")


def _generate_walker(entity_type: type[Any], limits: Limits) -> Callable[[_Walk, int], int]:
    source = _Source(limits)
    source.entity(1, entity_type)
    text = "\n".join(["def walk_entity(walk, o):", "    data = walk.data",
                      *source.lines, "    return o"])
    namespace: dict[str, Any] = {"unpack_h": INT16.unpack_from,
                                 "unpack_i": INT32.unpack_from, **source.constants}
    exec(compile(text, f"<walk {entity_type.__name__}>", "exec"), namespace)
    walker: Callable[[_Walk, int], int] = namespace["walk_entity"]
    return walker


def compact_string_at(frame: bytes, offset: int, what: str) -> tuple[str | None, int]:
    """The compact (nullable) string at `offset` and the offset after it, its length
    checked against the bytes there (WalkError, or UnicodeDecodeError for bad UTF-8)."""
    walk = _Walk(frame)
    length, offset = walk.uvarint(offset, what)
    if length == 0:
        return None, offset
    end = walk.need(offset, length - 1, what)
    return frame[offset:end].decode(), end


def request_header_end(frame: bytes, flexible: bool) -> tuple[int, list[tuple[int, int]]]:
    """Walk a request header (v1, or v2 when `flexible`); the offset after it and its
    non-empty tagged-field section, if any. The client id is a legacy string in both."""
    if len(frame) < 10:
        raise WalkError("RequestHeader: truncated")
    size: int = INT16.unpack_from(frame, 8)[0]
    if size < -1:
        raise WalkError(f"RequestHeader.client_id: length {size}")
    offset = 10 + max(size, 0)
    if offset > len(frame):
        raise WalkError(f"RequestHeader.client_id: {size} bytes declared, "
                        f"{len(frame) - 10} left")
    if not flexible:
        return offset, []
    if offset < len(frame) and frame[offset] == 0:  # the common header: no tagged fields
        return offset + 1, []
    walk = _Walk(frame)
    offset = walk.tagged_fields(offset, "RequestHeader")
    return offset, walk.tagged


def check_request(frame: bytes, body_type: type[Any], body_offset: int,
                  header_tagged: list[tuple[int, int]],
                  limits: Mapping[tuple[str, str], Limit]) -> tuple[bytes, list[int]]:
    """Walk a request's body (at `body_offset`, after `request_header_end`); return the
    frame for kio: `frame` itself, or a copy whose tagged-field sections (the header's
    included) are emptied; and, in that frame, the offsets of a SPLIT_ARRAYS array (where
    its count starts, where each element starts, where it ends), or [].

    Raises WalkError for a body that does not have its schema's shape, LimitExceeded for
    an array over its limit.
    """
    if not isinstance(limits, Limits):  # a plain mapping (tests, tools)
        limits = Limits(limits)
    walker = limits.walkers.get(body_type) or limits.walker(body_type)
    walk = _Walk(frame)
    if header_tagged:
        walk.tagged = list(header_tagged)
    try:
        end = walker(walk, body_offset)
    except (IndexError, struct.error):
        raise WalkError(f"{body_type.__name__}: truncated") from None
    if end > len(frame):
        raise WalkError(f"{body_type.__name__}: truncated")
    if end != len(frame):
        raise WalkError(f"{len(frame) - end} trailing bytes after the {body_type.__name__} body")
    if not walk.tagged:
        return frame, walk.marks
    cleaned = bytearray()
    start = 0
    for section_start, section_end in walk.tagged:
        cleaned += frame[start:section_start]
        cleaned.append(0)  # no tagged fields
        start = section_end
    cleaned += frame[start:]
    return bytes(cleaned), [_shifted(mark, walk.tagged) for mark in walk.marks]


def _shifted(offset: int, removed: list[tuple[int, int]]) -> int:
    """Where `offset` is once the tagged sections in `removed` are cut to one byte."""
    return offset - sum(end - start - 1 for start, end in removed if end <= offset)
