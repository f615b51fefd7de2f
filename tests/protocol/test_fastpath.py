"""The hand-packed encoders write exactly the generic encoder's bytes."""

from hypothesis import given
from hypothesis import strategies as st

from protocol._codec import entity_bytes
from protocol.fastpath import connectors_and_tasks_bytes, encode_heartbeat_response
from protocol.framing import encode_response
from protocol.messages import ConnectGroupHeartbeatResponse, ConnectorsAndTasks, ConnectorTaskId
from protocol.messages.connect_group_heartbeat_response import Assignment
from tests.protocol.strategies import entities

int8 = st.integers(-(2**7), 2**7 - 1)
int16 = st.integers(-(2**15), 2**15 - 1)
int32 = st.integers(-(2**31), 2**31 - 1)
# Longer names and lists than the generic strategies draw: lengths past one varint byte.
names = st.text(st.characters(exclude_categories=["Cs"]), max_size=200)
many_units = st.builds(
    ConnectorsAndTasks,
    connectors=st.lists(names, max_size=150).map(tuple),
    tasks=st.lists(st.builds(ConnectorTaskId, connector=names, task=int32),
                   max_size=150).map(tuple),
)
assignments = st.none() | st.builds(Assignment, error=int8,
                                    assigned=many_units | entities(ConnectorsAndTasks),
                                    version=int16, metadata=st.binary(max_size=300))


@given(correlation=int32, throttle=int32, error=int16,
       message=st.none() | st.text(max_size=300), epoch=int32, interval=int32,
       assignment=assignments)
def test_heartbeat_response_is_the_generic_encoders(correlation: int, throttle: int,
                                                    error: int, message: str | None,
                                                    epoch: int, interval: int,
                                                    assignment: Assignment | None) -> None:
    response = ConnectGroupHeartbeatResponse(
        throttle_time_ms=throttle, error_code=error, error_message=message,
        member_epoch=epoch, heartbeat_interval_ms=interval, assignment=assignment)
    assert encode_heartbeat_response(correlation, response) == \
        encode_response(1000, 0, correlation, response)


@given(correlation=int32, response=entities(ConnectGroupHeartbeatResponse))
def test_any_generated_heartbeat_response(correlation: int,
                                          response: ConnectGroupHeartbeatResponse) -> None:
    assert encode_heartbeat_response(correlation, response) == \
        encode_response(1000, 0, correlation, response)


@given(units=many_units | entities(ConnectorsAndTasks))
def test_units_are_the_generic_writers(units: ConnectorsAndTasks) -> None:
    assert connectors_and_tasks_bytes(units) == entity_bytes(ConnectorsAndTasks, units)


@given(correlation=st.integers(-(2**31), 2**31 - 1),
       code=st.sampled_from([0, 16, 22, 25, 27, 82]))
def test_classic_heartbeat_response_is_the_generic_encoders(correlation: int, code: int
                                                            ) -> None:
    from coordinator.server.classic import heartbeat_response
    from protocol.classic import HEARTBEAT
    from protocol.fastpath import CLASSIC_HEARTBEAT_VERSIONS, encode_classic_heartbeat_response

    for version in CLASSIC_HEARTBEAT_VERSIONS:
        generic = encode_response(HEARTBEAT, version, correlation,
                                  heartbeat_response(version, code))
        assert encode_classic_heartbeat_response(version, correlation, code) == generic
