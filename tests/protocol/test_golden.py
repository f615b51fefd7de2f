"""Golden bytes written by hand from the message definitions (docs/protocol.md), checked
against the encoders and decoders.

Notation used in the comments (KRPC flexible encoding):
- compact string / bytes = uvarint(length + 1) then the UTF-8 bytes; a null one is 0x00;
- compact array = uvarint(count + 1) then the items; a null one is 0x00;
- nullable struct = int8 marker 1 (present) or -1 = 0xff (null), then the struct;
- every flexible struct ends with its tagged-field count, 0x00 here;
- intN are big-endian two's complement;
- request header v2 = int16 api key, int16 version, int32 correlation id, client id as a
  *legacy* nullable string (int16 length, -1 for null), tagged-field count;
- response header v1 = int32 correlation id, tagged-field count; v0 = correlation id only.
"""

from __future__ import annotations

from typing import Any

from protocol.framing import decode_request, decode_response, encode_request, encode_response
from protocol.messages import (
    ConnectGroupCurrentMemberAssignmentKey,
    ConnectGroupDescribeResponse,
    ConnectGroupDescribeResponseV0,
    ConnectGroupHeartbeatRequest,
    ConnectGroupHeartbeatResponse,
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupMetadataValue,
    ConnectGroupPrepareAssignmentResponse,
    ConnectorsAndTasks,
    ConnectorTaskId,
)
from protocol.messages.connect_group_describe_response import (
    DescribedGroup,
    DescribedGroupV0,
    DescribedMember,
    DescribedMemberV0,
)
from protocol.messages.connect_group_heartbeat_request import ClientAssignor
from protocol.messages.connect_group_heartbeat_response import Assignment
from protocol.messages.connect_group_install_assignment_request import MemberAssignment
from protocol.messages.connect_group_prepare_assignment_response import Member, MemberAssignor
from protocol.records import decode_key, decode_value, encode_key, encode_value

NOTHING = ConnectorsAndTasks(connectors=(), tasks=())


def hand(*chunks: bytes) -> bytes:
    return b"".join(chunks)


def check_request(api_key: int, golden: bytes, body: Any) -> None:
    assert encode_request(api_key, 0, 7, "wk-1", body) == golden
    decoded = decode_request(golden[4:])
    assert (decoded.api_key, decoded.api_version, decoded.correlation_id) == (api_key, 0, 7)
    assert decoded.client_id == "wk-1"
    assert decoded.body == body


def check_response(api_key: int, golden: bytes, body: Any, version: int = 0) -> None:
    assert encode_response(api_key, version, 7, body) == golden
    assert decode_response(golden[4:], api_key, version) == (7, body)


REQUEST_HEADER_1000 = hand(
    b"\x03\xe8",  # api key 1000 (ConnectGroupHeartbeat)
    b"\x00\x00",  # api version 0
    b"\x00\x00\x00\x07",  # correlation id 7
    b"\x00\x04wk-1",  # client id "wk-1": legacy string, int16 length 4
    b"\x00",  # header tagged fields
)
RESPONSE_HEADER = hand(
    b"\x00\x00\x00\x07",  # correlation id 7
    b"\x00",  # header tagged fields (response header v1)
)


def test_heartbeat_request() -> None:
    golden = hand(
        b"\x00\x00\x00\x3b",  # size: 15 header + 44 body = 59
        REQUEST_HEADER_1000,
        b"\x03g1",  # GroupId "g1": uvarint(2 + 1) = 3
        b"\x03m1",  # MemberId "m1"
        b"\x00\x00\x00\x05",  # MemberEpoch 5
        b"\x00",  # InstanceId null
        b"\x00",  # WorkerUrl null
        b"\xff\xff\xff\xff",  # RebalanceTimeoutMs -1
        b"\x00",  # ServerAssignor null
        b"\x02",  # ClientAssignors: 1 item, uvarint(1 + 1)
        b"\x02a",  # . Name "a"
        b"\x00\x01",  # . MinimumVersion 1
        b"\x00\x02",  # . MaximumVersion 2
        b"\x00",  # . Reason 0
        b"\x00\x01",  # . Version 1
        b"\x02\x07",  # . Metadata: 1 byte, 0x07
        b"\x00",  # . ClientAssignor tagged fields
        b"\x01",  # OwnedConnectorsAndTasks: present
        b"\x02\x02c",  # . Connectors: 1 item, "c"
        b"\x02",  # . Tasks: 1 item
        b"\x02c",  # . . Connector "c"
        b"\x00\x00\x00\x00",  # . . Task 0
        b"\x00",  # . . ConnectorTaskId tagged fields
        b"\x00",  # . ConnectorsAndTasks tagged fields
        b"\x00",  # request tagged fields
    )
    body = ConnectGroupHeartbeatRequest(
        group_id="g1",
        member_id="m1",
        member_epoch=5,
        client_assignors=(
            ClientAssignor(
                name="a", minimum_version=1, maximum_version=2, reason=0, version=1,
                metadata=b"\x07",
            ),
        ),
        owned_connectors_and_tasks=ConnectorsAndTasks(
            connectors=("c",), tasks=(ConnectorTaskId(connector="c", task=0),)
        ),
    )
    check_request(1000, golden, body)


def test_heartbeat_response_with_compute_assignment() -> None:
    golden = hand(
        b"\x00\x00\x00\x20",  # size: 5 header + 27 body = 32
        RESPONSE_HEADER,
        b"\x00\x00\x00\x00",  # ThrottleTimeMs 0
        b"\x03\xe8",  # ErrorCode 1000 COMPUTE_ASSIGNMENT
        b"\x00",  # ErrorMessage null
        b"\x00\x00\x00\x03",  # MemberEpoch 3
        b"\x00\x00\x0b\xb8",  # HeartbeatIntervalMs 3000
        b"\x01",  # Assignment: present
        b"\x00",  # . Error 0
        b"\x02\x02c",  # . Assigned.Connectors: ["c"]
        b"\x01",  # . Assigned.Tasks: empty, uvarint(0 + 1)
        b"\x00",  # . Assigned tagged fields
        b"\x00\x00",  # . Version 0
        b"\x01",  # . Metadata: empty bytes
        b"\x00",  # . Assignment tagged fields
        b"\x00",  # response tagged fields
    )
    body = ConnectGroupHeartbeatResponse(
        throttle_time_ms=0,
        error_code=1000,
        member_epoch=3,
        heartbeat_interval_ms=3000,
        assignment=Assignment(
            error=0, assigned=ConnectorsAndTasks(connectors=("c",), tasks=()), version=0,
            metadata=b"",
        ),
    )
    check_response(1000, golden, body)


def test_prepare_assignment_response() -> None:
    golden = hand(
        b"\x00\x00\x00\x34",  # size: 5 header + 47 body = 52
        RESPONSE_HEADER,
        b"\x00\x00\x00\x00",  # ThrottleTimeMs 0
        b"\x00\x00",  # ErrorCode 0
        b"\x00",  # ErrorMessage null
        b"\x00\x00\x00\x0a",  # GroupEpoch 10
        b"\x03rr",  # AssignorName "rr"
        b"\x02\x02c",  # ConnectorsAndTasks.Connectors: ["c"]  (not nullable: no marker)
        b"\x02",  # ConnectorsAndTasks.Tasks: 1 item
        b"\x02c\x00\x00\x00\x01\x00",  # . "c", Task 1, tagged fields
        b"\x00",  # ConnectorsAndTasks tagged fields
        b"\x02",  # Members: 1 item
        b"\x03m1",  # . MemberId "m1"
        b"\x00\x00\x00\x09",  # . MemberEpoch 9
        b"\x00",  # . InstanceId null
        b"\x02u",  # . WorkerUrl "u"
        b"\x00\x01",  # . Assignor.Version 1
        b"\x00",  # . Assignor.Reason 0
        b"\x01",  # . Assignor.Metadata: empty
        b"\x00",  # . Assignor tagged fields
        b"\x01\x01\x00",  # . Target: no connectors, no tasks, tagged fields
        b"\x00",  # . Member tagged fields
        b"\x00",  # response tagged fields
    )
    body = ConnectGroupPrepareAssignmentResponse(
        throttle_time_ms=0,
        error_code=0,
        group_epoch=10,
        assignor_name="rr",
        connectors_and_tasks=ConnectorsAndTasks(
            connectors=("c",), tasks=(ConnectorTaskId(connector="c", task=1),)
        ),
        members=(
            Member(
                member_id="m1",
                member_epoch=9,
                worker_url="u",
                assignor=MemberAssignor(version=1, reason=0, metadata=b""),
                target=NOTHING,
            ),
        ),
    )
    check_response(1001, golden, body)


def test_install_assignment_request() -> None:
    golden = hand(
        b"\x00\x00\x00\x33",  # size: 15 header + 36 body = 51
        b"\x03\xea",  # api key 1002 (ConnectGroupInstallAssignment)
        b"\x00\x00",  # api version 0
        b"\x00\x00\x00\x07",  # correlation id 7
        b"\x00\x04wk-1",  # client id "wk-1"
        b"\x00",  # header tagged fields
        b"\x03g1",  # GroupId "g1"
        b"\x03m1",  # MemberId "m1"
        b"\x00\x00\x00\x09",  # MemberEpoch 9
        b"\x00\x00\x00\x0a",  # GroupEpoch 10
        b"\xff",  # Error -1
        b"\x02",  # Members: 1 item
        b"\x03m2",  # . MemberId "m2"
        b"\x01",  # . Assigned.Connectors: empty
        b"\x02\x02c\x00\x00\x00\x01\x00",  # . Assigned.Tasks: [c-1]
        b"\x00",  # . Assigned tagged fields
        b"\x00\x02",  # . Version 2
        b"\x03\x01\x02",  # . Metadata: 2 bytes 01 02
        b"\x00",  # . MemberAssignment tagged fields
        b"\x00",  # request tagged fields
    )
    body = ConnectGroupInstallAssignmentRequest(
        group_id="g1",
        member_id="m1",
        member_epoch=9,
        group_epoch=10,
        error=-1,
        members=(
            MemberAssignment(
                member_id="m2",
                assigned=ConnectorsAndTasks(
                    connectors=(), tasks=(ConnectorTaskId(connector="c", task=1),)
                ),
                version=2,
                metadata=b"\x01\x02",
            ),
        ),
    )
    check_request(1002, golden, body)


def test_describe_response() -> None:
    golden = hand(
        b"\x00\x00\x00\x4b",  # size: 5 header + 70 body = 75
        RESPONSE_HEADER,
        b"\x00\x00\x00\x00",  # ThrottleTimeMs 0
        b"\x02",  # Groups: 1 item
        b"\x00\x00",  # . ErrorCode 0
        b"\x00",  # . ErrorMessage null
        b"\x03g1",  # . GroupId "g1"
        b"\x07STABLE",  # . GroupState "STABLE": uvarint(6 + 1)
        b"\x00\x00\x00\x03",  # . GroupEpoch 3
        b"\x00\x00\x00\x03",  # . AssignmentEpoch 3
        b"\x03rr",  # . AssignorName "rr"
        b"\x02\x02c\x01\x00",  # . ConnectorsAndTasks: ["c"], no tasks, tagged fields
        b"\x02",  # . Members: 1 item
        b"\x03m1",  # . . MemberId "m1"
        b"\x03i1",  # . . InstanceId "i1"
        b"\x02u",  # . . WorkerUrl "u"
        b"\x00\x00\x00\x03",  # . . MemberEpoch 3
        b"\x07STABLE",  # . . MemberState "STABLE"
        b"\x02\x02c\x01\x00",  # . . Assigned: ["c"], no tasks
        b"\x01\x01\x00",  # . . PendingRevocation: nothing
        b"\x02\x02c\x01\x00",  # . . Target: ["c"], no tasks
        b"\x00",  # . . DescribedMember tagged fields
        b"\x00",  # . DescribedGroup tagged fields
        b"\x00",  # response tagged fields
    )
    only_c = ConnectorsAndTasks(connectors=("c",), tasks=())
    body = ConnectGroupDescribeResponseV0(
        throttle_time_ms=0,
        groups=(
            DescribedGroupV0(
                error_code=0,
                group_id="g1",
                group_state="STABLE",
                group_epoch=3,
                assignment_epoch=3,
                assignor_name="rr",
                connectors_and_tasks=only_c,
                members=(
                    DescribedMemberV0(
                        member_id="m1",
                        instance_id="i1",
                        worker_url="u",
                        member_epoch=3,
                        member_state="STABLE",
                        assigned=only_c,
                        pending_revocation=NOTHING,
                        target=only_c,
                    ),
                ),
            ),
        ),
    )
    check_response(1003, golden, body)


def test_describe_response_v1_adds_group_type_units_source_and_member_protocols() -> None:
    golden = hand(
        b"\x00\x00\x00\x6e",  # size: 5 header + 105 body = 110
        RESPONSE_HEADER,
        b"\x00\x00\x00\x00",  # ThrottleTimeMs 0
        b"\x02",  # Groups: 1 item
        b"\x00\x00",  # . ErrorCode 0
        b"\x00",  # . ErrorMessage null
        b"\x03g1",  # . GroupId "g1"
        b"\x07STABLE",  # . GroupState "STABLE"
        b"\x08connect",  # . GroupType "connect" (v1)
        b"\x09installs",  # . UnitsSource "installs" (v1)
        b"\x00\x00\x00\x03",  # . GroupEpoch 3
        b"\x00\x00\x00\x03",  # . AssignmentEpoch 3
        b"\x03rr",  # . AssignorName "rr"
        b"\x02\x02c\x01\x00",  # . ConnectorsAndTasks: ["c"], no tasks, tagged fields
        b"\x02",  # . Members: 1 item
        b"\x03m1",  # . . MemberId "m1"
        b"\x03i1",  # . . InstanceId "i1"
        b"\x02u",  # . . WorkerUrl "u"
        b"\x08classic",  # . . Protocol "classic" (v1)
        b"\x0asessioned",  # . . ClassicProtocol "sessioned" (v1)
        b"\x00\x00\x00\x03",  # . . MemberEpoch 3
        b"\x07STABLE",  # . . MemberState "STABLE"
        b"\x02\x02c\x01\x00",  # . . Assigned: ["c"], no tasks
        b"\x01\x01\x00",  # . . PendingRevocation: nothing
        b"\x02\x02c\x01\x00",  # . . Target: ["c"], no tasks
        b"\x00",  # . . DescribedMember tagged fields
        b"\x00",  # . DescribedGroup tagged fields
        b"\x00",  # response tagged fields
    )
    only_c = ConnectorsAndTasks(connectors=("c",), tasks=())
    body = ConnectGroupDescribeResponse(
        throttle_time_ms=0,
        groups=(
            DescribedGroup(
                error_code=0,
                group_id="g1",
                group_state="STABLE",
                group_type="connect",
                units_source="installs",
                group_epoch=3,
                assignment_epoch=3,
                assignor_name="rr",
                connectors_and_tasks=only_c,
                members=(
                    DescribedMember(
                        member_id="m1",
                        instance_id="i1",
                        worker_url="u",
                        protocol="classic",
                        classic_protocol="sessioned",
                        member_epoch=3,
                        member_state="STABLE",
                        assigned=only_c,
                        pending_revocation=NOTHING,
                        target=only_c,
                    ),
                ),
            ),
        ),
    )
    check_response(1003, golden, body, version=1)


def test_record_key_and_value() -> None:
    key = ConnectGroupCurrentMemberAssignmentKey(group_id="g1", member_id="m1")
    key_golden = hand(
        b"\x00\x08",  # record type id 8
        b"\x00\x02g1",  # GroupId: legacy string (keys are not flexible), int16 length
        b"\x00\x02m1",  # MemberId
    )
    assert encode_key(key) == key_golden
    assert decode_key(key_golden) == key

    value = ConnectGroupMetadataValue(epoch=258)
    value_golden = hand(
        b"\x00\x00",  # value version 0
        b"\x00\x00\x01\x02",  # Epoch 258
        b"\x00",  # tagged fields (values are flexible)
    )
    assert encode_value(value) == value_golden
    assert decode_value(3, value_golden) == value
