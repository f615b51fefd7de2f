"""Fuzzing a real `serve` over TCP: a fixed corpus of hostile frames, then a few thousand
mutations of valid requests (seeded, so a failure replays), and Hypothesis-built requests
with unknown tagged fields.

After every case the process must still run and the attacker's connection must have been
answered or closed (never left hanging); every SAMPLE_EVERY cases a healthy member of
another group heartbeats on its own connection, and must be answered without error (so
it was never evicted) and, at the median, within 50 ms. Timings are only sampled, and only
the median is held to 50 ms, so that a loaded machine does not make the test flaky; the
benchmark `bench hostile` measures latency properly.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol._codec import INT32, uvarint
from protocol.framing import REQUEST_CLASSES, decode_response, encode_request
from protocol.messages import (
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupPrepareAssignmentRequest,
)
from protocol.messages.common import ConnectorTaskId
from protocol.messages.connect_group_install_assignment_request import MemberAssignment
from tests.integration.helpers import ServerProcess
from tests.protocol.strategies import entities
from tests.server import hostile
from tests.server.hostile import (
    DESCRIBE,
    HEARTBEAT,
    RawConnection,
    describe,
    framed,
    heartbeat,
    owned,
    request_frame,
    running_server,
)

MUTATIONS = 2_500
SAMPLE_EVERY = 25
HEALTHY_LATENCY_S = 0.050
ANSWER_TIMEOUT_S = 10.0


class Healthy:
    """A member of group "healthy" that heartbeats on its own connection."""

    def __init__(self, process: ServerProcess) -> None:
        self.connection = RawConnection(process.kafka_port)
        self.epoch = 0
        self.latencies: list[float] = []
        self.beat()

    def beat(self) -> None:
        request = heartbeat("healthy", "healthy-member", epoch=self.epoch)
        started = time.perf_counter()
        response = self.connection.ask(request_frame(HEARTBEAT, request), HEARTBEAT)
        self.latencies.append(time.perf_counter() - started)
        assert response is not None, "the healthy member's connection was closed"
        assert response.error_code == 0, response.error_message  # never evicted or fenced
        self.epoch = response.member_epoch


class Attacker:
    """One connection, reopened whenever the server closes it."""

    def __init__(self, process: ServerProcess) -> None:
        self.process = process
        self.connection = RawConnection(process.kafka_port, timeout_s=ANSWER_TIMEOUT_S)
        self.cases = 0

    def __enter__(self) -> Attacker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.connection.close()

    def send(self, frame: bytes) -> bytes | None:
        """Send one frame; its answer, or None when the server closed the connection."""
        self.cases += 1
        try:
            self.connection.send(frame)
            answer = self.connection.answer()
        except (BrokenPipeError, ConnectionResetError):
            answer = None
        except TimeoutError:
            raise AssertionError(f"case {self.cases}: neither answered nor closed: "
                                 f"{frame[:64].hex()}") from None
        if answer is None:
            self.connection.close()
            self.connection = RawConnection(self.process.kafka_port,
                                            timeout_s=ANSWER_TIMEOUT_S)
        assert self.process.process is not None
        assert self.process.process.poll() is None, f"the server died on {frame[:64].hex()}"
        return answer


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Healthy]]:
    settings = ["server.max.frame.bytes=1048576", "group.connect.max.owned.units=2000",
                "group.connect.max.describe.groups=100"]
    with running_server(tmp_path_factory.mktemp("fuzz"), settings) as process:
        healthy = Healthy(process)
        yield process, healthy
        healthy.connection.close()
        assert "Traceback" not in process.output()


def seeds() -> list[bytes]:
    """Valid requests of every API, framed, to mutate."""
    tasks = tuple(ConnectorTaskId(connector=f"c{i % 3}", task=i) for i in range(20))
    members = tuple(MemberAssignment(member_id=f"m{i}", assigned=owned(("c0",), tasks[:5]),
                                     version=1, metadata=b"x") for i in range(3))
    from tests.server.test_krpc import api_versions_request
    bodies: list[tuple[int, int, Any]] = [
        (HEARTBEAT, 0, heartbeat("fz", "m1")),
        (HEARTBEAT, 0, heartbeat("fz", "m1", epoch=3, instance_id="i1",
                                 owned_connectors_and_tasks=owned(("c0", "c1"), tasks))),
        (DESCRIBE, 0, describe("fz", "healthy", "")),
        (1001, 0, ConnectGroupPrepareAssignmentRequest(group_id="fz", member_id="m1",
                                                       member_epoch=1)),
        (1002, 0, ConnectGroupInstallAssignmentRequest(group_id="fz", member_id="m1",
                                                       member_epoch=1, group_epoch=1,
                                                       error=0, members=members)),
    ] + [(18, version, api_versions_request(version)) for version in range(5)]
    return [encode_request(key, version, 11, "fuzz", body) for key, version, body in bodies]


def corpus() -> list[bytes]:
    """Hand-made hostile frames (each framed correctly unless it is about the prefix)."""
    header = hostile.header_bytes
    too_many = describe(*[f"g{i}" for i in range(101)])
    many_owned = heartbeat("fz", "m1", epoch=2, owned_connectors_and_tasks=owned(
        tasks=tuple(ConnectorTaskId(connector="c", task=i) for i in range(2_001))))
    return [
        hostile.with_body_tag(request_frame(HEARTBEAT, heartbeat("fz-tag", "m1"))),
        hostile.with_header_tag(request_frame(DESCRIBE, describe("fz"))),
        hostile.huge_describe(),
        hostile.huge_owned_tasks(),
        hostile.null_group_ids(),
        request_frame(DESCRIBE, too_many),
        request_frame(HEARTBEAT, many_owned),
        request_frame(HEARTBEAT, heartbeat("x" * 40_000)),
        request_frame(HEARTBEAT, heartbeat("fz", "m1", worker_url="u" * 100_000)),
        framed(header(DESCRIBE) + uvarint(2) + b"\xff\xff\xff\xff\x0f" + b"\x00"),
        framed(header(DESCRIBE) + uvarint(2) + b"\x03\xc3\x28" + b"\x00"),  # not UTF-8
        framed(header(DESCRIBE) + uvarint(1) + b"\x05" + uvarint(2**31) + b"\x00"),
        framed(header(HEARTBEAT)[:9]),  # header cut short
        framed(b""),
        framed(header(4242)),  # unknown API
        framed((18).to_bytes(2, "big") + (99).to_bytes(2, "big") + INT32.pack(1)),
        INT32.pack(-1),  # a negative size: closed
        INT32.pack(64 * 1024 * 1024),  # over the frame limit: closed
    ]


def mutate(frame: bytes, rng: random.Random) -> bytes:
    """A mutation of a framed request's payload, framed again with its true size."""
    payload = bytearray(frame[4:])
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(payload)) if payload else 0
        how = rng.random()
        if how < 0.4 and payload:
            payload[at] ^= 1 << rng.randrange(8)
        elif how < 0.6 and payload:
            payload[at] = rng.choice([0x00, 0x01, 0x7F, 0x80, 0xFF])
        elif how < 0.75:
            payload[at:at] = uvarint(rng.choice([2**7, 2**14, 2**21, 2**28, 2**32 - 1, 2**35]))
        elif how < 0.85:
            del payload[at:at + rng.randint(1, 8)]
        else:
            payload[at:at] = rng.randbytes(rng.randint(1, 8))
    return framed(bytes(payload))


def test_the_corpus(fuzzed: tuple[ServerProcess, Healthy]) -> None:
    process, healthy = fuzzed
    with Attacker(process) as attacker:
        for frame in corpus():
            attacker.send(frame)
            healthy.beat()
    assert hostile.alive(process)


def test_mutated_requests(fuzzed: tuple[ServerProcess, Healthy]) -> None:
    process, healthy = fuzzed
    rng = random.Random(20261124)
    frames = seeds()
    answered = closed = 0
    with Attacker(process) as attacker:
        for case in range(MUTATIONS):
            if attacker.send(mutate(rng.choice(frames), rng)) is None:
                closed += 1
            else:
                answered += 1
            if case % SAMPLE_EVERY == 0:
                healthy.beat()
    assert answered and closed  # both outcomes were reached
    assert statistics.median(healthy.latencies) < HEALTHY_LATENCY_S, healthy.latencies
    assert max(healthy.latencies) < 2.0  # nothing stalled the loop near a session timeout


def _tagged(fields: list[tuple[int, bytes]]) -> bytes:
    return uvarint(len(fields)) + b"".join(
        uvarint(tag) + uvarint(len(data)) + data for tag, data in fields)


REQUESTS = sorted((key, body) for key, body in REQUEST_CLASSES.items() if key[0] != 18)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.sampled_from(REQUESTS).flatmap(
           lambda item: entities(item[1]).map(lambda body: (item[0][0], body))),
       st.lists(st.tuples(st.integers(0, 2**31), st.binary(max_size=4)), max_size=2))
def test_generated_requests_with_unknown_tags(fuzzed: tuple[ServerProcess, Healthy],
                                              request: tuple[int, Any],
                                              fields: list[tuple[int, bytes]]) -> None:
    process, healthy = fuzzed
    api_key, body = request
    frame = encode_request(api_key, 0, 5, "fuzz", body)
    if fields:
        frame = framed(frame[4:-1] + _tagged(fields))
    with Attacker(process) as attacker:
        answer = attacker.send(frame)
        assert answer is not None  # a well-formed request is always answered
        correlation, _ = decode_response(answer, api_key, 0)
        assert correlation == 5
    healthy.beat()
