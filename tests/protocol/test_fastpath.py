"""The hand-packed heartbeat response equals the generic encoder's bytes."""

from hypothesis import given
from hypothesis import strategies as st

from protocol.fastpath import encode_plain_heartbeat_response
from protocol.framing import encode_response
from protocol.messages import ConnectGroupHeartbeatResponse

int32 = st.integers(-(2**31), 2**31 - 1)


@given(correlation=int32, throttle=int32, error=st.integers(-(2**15), 2**15 - 1),
       message=st.none() | st.text(max_size=300), epoch=int32, interval=int32)
def test_same_bytes_as_the_generic_encoder(correlation: int, throttle: int, error: int,
                                           message: str | None, epoch: int,
                                           interval: int) -> None:
    response = ConnectGroupHeartbeatResponse(
        throttle_time_ms=throttle, error_code=error, error_message=message,
        member_epoch=epoch, heartbeat_interval_ms=interval, assignment=None)
    assert encode_plain_heartbeat_response(correlation, response) == \
        encode_response(1000, 0, correlation, response)


def test_assignment_takes_the_generic_path() -> None:
    from protocol.messages import ConnectorsAndTasks
    from protocol.messages.connect_group_heartbeat_response import Assignment

    response = ConnectGroupHeartbeatResponse(
        throttle_time_ms=0, error_code=0, error_message=None, member_epoch=1,
        heartbeat_interval_ms=3000,
        assignment=Assignment(error=0, assigned=ConnectorsAndTasks(connectors=(), tasks=()),
                              version=0, metadata=b""))
    assert encode_plain_heartbeat_response(1, response) is None
