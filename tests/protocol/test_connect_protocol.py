"""Connect's metadata and assignment layouts against vectors written out by hand."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.connect_protocol import (
    CONFIG_MISMATCH,
    PROTOCOL_NAMES,
    PROTOCOL_VERSIONS,
    ConnectAssignment,
    ConnectProtocolError,
    WorkerMetadata,
    decode_assignment,
    decode_worker_metadata,
    encode_assignment,
    encode_worker_metadata,
)
from coordinator.units import CONNECTOR, Unit


def hexbytes(text: str) -> bytes:
    """Hex with comments: everything after '#' on a line is ignored."""
    return bytes.fromhex("".join(line.split("#")[0] for line in text.splitlines()))


EAGER_METADATA = hexbytes("""
    0000                  # version 0
    0002 7731             # url: length 2, "w1"
    0000000000000005      # config offset 5
""")

EAGER_ASSIGNMENT = hexbytes("""
    0000                  # version 0
    0000                  # error 0
    0001 4c               # leader: "L"
    0001 75               # leader url: "u"
    0000000000000007      # config offset 7
    00000002              # 2 connector assignments
    0001 41               #   connector "A"
    00000002              #   2 task ids
    ffffffff              #     -1: the connector instance
    00000000              #     task 0
    0001 42               #   connector "B"
    00000001              #   1 task id
    00000001              #     task 1
""")

COMPATIBLE_ASSIGNMENT = hexbytes("""
    0001                  # version 1
    0000                  # error 0
    0001 4c               # leader "L"
    0001 75               # leader url "u"
    0000000000000001      # config offset 1
    00000001              # assignment: 1 connector
    0001 41 00000001 ffffffff       # "A": [-1]
    00000001              # revoked: 1 connector
    0001 42 00000001 00000000       # "B": [0]
    000003e8              # scheduled delay 1000 ms
""")

SESSIONED_METADATA = hexbytes("""
    0002                  # version 2
    0001 77               # url "w"
    0000000000000003      # config offset 3
    00000029              # allocation: 41 bytes follow, a complete v2 assignment:
    0002 0000             #   version 2, error 0
    0001 4c 0001 75       #   leader "L", leader url "u"
    0000000000000003      #   config offset 3
    00000001 0001 41 00000001 ffffffff   # assignment: "A": [-1]
    00000000              #   revoked: none
    00000000              #   delay 0
""")

COMPATIBLE_METADATA_NO_ALLOCATION = hexbytes("""
    0001                  # version 1
    0001 77               # url "w"
    0000000000000000      # config offset 0
    ffffffff              # allocation: null (nothing assigned)
""")


SESSIONED_ASSIGNMENT = hexbytes("""
    0002                  # version 2
    0001                  # error 1: CONFIG_MISMATCH
    0002 6c31             # leader "l1"
    0000                  # leader url: "" (strings are never null)
    7fffffffffffffff      # config offset: the largest int64
    00000000              # assignment: nothing new
    00000002              # revoked: 2 connectors, in name order
    0001 7a 00000001 00000000              # "z": [0]
    0002 c3a9 00000002 ffffffff 00000003   # "\u00e9" (2 UTF-8 bytes): [-1, 3]
    000493e0              # delay 300000 ms (Connect's scheduled.rebalance.max.delay.ms)
""")


def test_sessioned_assignment_vector() -> None:
    assignment = ConnectAssignment(version=2, error=CONFIG_MISMATCH, leader="l1",
                                   config_offset=2**63 - 1,
                                   revoked=frozenset({("\u00e9", CONNECTOR), ("\u00e9", 3),
                                                      ("z", 0)}), delay_ms=300_000)
    assert encode_assignment(assignment) == SESSIONED_ASSIGNMENT
    assert decode_assignment(SESSIONED_ASSIGNMENT) == assignment


def test_protocol_names_carry_their_versions() -> None:
    assert PROTOCOL_VERSIONS == {"sessioned": 2, "compatible": 1, "default": 0}
    assert PROTOCOL_NAMES[2] == "sessioned" and PROTOCOL_NAMES[0] == "default"


def test_eager_metadata_vector() -> None:
    metadata = WorkerMetadata(version=0, url="w1", config_offset=5)
    assert encode_worker_metadata(metadata) == EAGER_METADATA
    assert decode_worker_metadata(EAGER_METADATA) == metadata


def test_eager_assignment_vector() -> None:
    assignment = ConnectAssignment(version=0, leader="L", leader_url="u", config_offset=7,
                                   assigned=frozenset({("A", CONNECTOR), ("A", 0), ("B", 1)}))
    assert encode_assignment(assignment) == EAGER_ASSIGNMENT
    assert decode_assignment(EAGER_ASSIGNMENT) == assignment


def test_compatible_assignment_vector() -> None:
    assignment = ConnectAssignment(version=1, leader="L", leader_url="u", config_offset=1,
                                   assigned=frozenset({("A", CONNECTOR)}),
                                   revoked=frozenset({("B", 0)}), delay_ms=1000)
    assert encode_assignment(assignment) == COMPATIBLE_ASSIGNMENT
    assert decode_assignment(COMPATIBLE_ASSIGNMENT) == assignment


def test_sessioned_metadata_vector_nests_the_allocation() -> None:
    allocation = ConnectAssignment(version=2, leader="L", leader_url="u", config_offset=3,
                                   assigned=frozenset({("A", CONNECTOR)}))
    metadata = WorkerMetadata(version=2, url="w", config_offset=3, allocation=allocation)
    assert encode_worker_metadata(metadata) == SESSIONED_METADATA
    assert decode_worker_metadata(SESSIONED_METADATA) == metadata


def test_empty_allocation_is_null() -> None:
    empty = ConnectAssignment(version=1)
    for allocation in (None, empty):
        encoded = encode_worker_metadata(WorkerMetadata(1, "w", 0, allocation))
        assert encoded == COMPATIBLE_METADATA_NO_ALLOCATION
    assert decode_worker_metadata(COMPATIBLE_METADATA_NO_ALLOCATION) == WorkerMetadata(1, "w", 0)


def test_missing_trailing_fields_take_defaults_from_v1() -> None:
    truncated = hexbytes("""
        0001 0000 0001 4c 0001 75 0000000000000009   # header, error, leader, url, offset
        ffffffff                                      # assignment: null
    """)  # no revoked, no delay
    assert decode_assignment(truncated) == ConnectAssignment(
        version=1, leader="L", leader_url="u", config_offset=9)
    # A v1 metadata blob without the allocation field (an older writer) still reads.
    assert decode_worker_metadata(hexbytes("0001 0001 77 0000000000000000")) == \
        WorkerMetadata(1, "w", 0)


def test_trailing_bytes_of_a_newer_version_are_ignored() -> None:
    newer = bytearray(COMPATIBLE_ASSIGNMENT + b"\x00\x01")
    newer[1] = 3  # a hypothetical version 3 with an extra field
    decoded = decode_assignment(bytes(newer))
    assert decoded.version == 3 and decoded.delay_ms == 1000


@pytest.mark.parametrize("decode, blob, message", [
    (decode_worker_metadata, hexbytes("00"), "truncated"),
    (decode_worker_metadata, hexbytes("ffff 0001 77 0000000000000000"), "unsupported"),
    (decode_worker_metadata, hexbytes("0000 ffff"), "negative length"),
    (decode_assignment, EAGER_ASSIGNMENT[:-1], "truncated"),
    (decode_assignment, hexbytes("0000 0000 0000 0000 0000000000000000 ffffffff"),
     "negative count"),  # v0 arrays are not nullable
    (decode_assignment,
     hexbytes("0000 0000 0000 0000 0000000000000000 00000001 0001 41 00000001 fffffffe"),
     "below -1"),
    (decode_assignment, hexbytes("0000 0000 0001 ff 0000 0000000000000000 00000000"),
     "UTF-8"),
])
def test_malformed_blobs_are_rejected(decode: Callable[[bytes], object], blob: bytes,
                                      message: str) -> None:
    with pytest.raises(ConnectProtocolError, match=message):
        decode(blob)


def test_version_0_cannot_carry_incremental_fields() -> None:
    with pytest.raises(ConnectProtocolError):
        encode_assignment(ConnectAssignment(version=0, delay_ms=5))
    with pytest.raises(ConnectProtocolError):
        encode_worker_metadata(WorkerMetadata(0, "w", 0, ConnectAssignment(version=0)))


# ------------------------------------------------------------------------- round trips

names = st.text(min_size=0, max_size=12)
unit_sets = st.frozensets(st.tuples(names, st.integers(min_value=-1, max_value=2**31 - 1)),
                          max_size=20)
offsets = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@st.composite
def assignments(draw: st.DrawFn, version: int | None = None) -> ConnectAssignment:
    version = draw(st.integers(0, 2)) if version is None else version
    incremental = version >= 1
    return ConnectAssignment(
        version=version,
        error=draw(st.integers(-(2**15), 2**15 - 1)),
        leader=draw(names),
        leader_url=draw(names),
        config_offset=draw(offsets),
        assigned=draw(unit_sets),
        revoked=draw(unit_sets) if incremental else frozenset(),
        delay_ms=draw(st.integers(-(2**31), 2**31 - 1)) if incremental else 0,
    )


@given(assignments())
def test_assignment_round_trip(assignment: ConnectAssignment) -> None:
    assert decode_assignment(encode_assignment(assignment)) == assignment


@given(st.integers(0, 2), names, offsets, st.data())
def test_metadata_round_trip(version: int, url: str, offset: int, data: st.DataObject) -> None:
    allocation = None
    if version >= 1:
        allocation = data.draw(st.none() | assignments(version))
    metadata = WorkerMetadata(version, url, offset, allocation)
    decoded = decode_worker_metadata(encode_worker_metadata(metadata))
    if allocation is not None and not allocation.assigned and not allocation.revoked:
        metadata = WorkerMetadata(version, url, offset, None)  # empty travels as null
    assert decoded == metadata


@given(unit_sets)
def test_unit_order_does_not_change_the_bytes(units: frozenset[Unit]) -> None:
    forward = ConnectAssignment(version=1, assigned=units)
    shuffled = ConnectAssignment(version=1, assigned=frozenset(sorted(units, reverse=True)))
    assert encode_assignment(forward) == encode_assignment(shuffled)
