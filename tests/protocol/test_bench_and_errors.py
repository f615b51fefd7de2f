"""Smoke test of the codec benchmark, and the error code table."""

from __future__ import annotations

import json

import pytest

from bench import codec as codec_bench
from protocol.errors import ApiError, ErrorCode


def test_bench_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert codec_bench.main(["--iterations", "1", "--rounds", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = report["results"]
    assert len(rows) == 8
    assert all(row["encode_us"] > 0 and row["decode_us"] > 0 for row in rows)


def test_bench_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert codec_bench.main(["--iterations", "1", "--rounds", "1"]) == 0
    assert "ConnectGroupDescribeResponse (100 members)" in capsys.readouterr().out


def test_error_codes_match_the_contract() -> None:
    assert {code.name: int(code) for code in ErrorCode} == {
        "UNKNOWN_SERVER_ERROR": -1, "NONE": 0, "COORDINATOR_LOAD_IN_PROGRESS": 14,
        "COORDINATOR_NOT_AVAILABLE": 15, "NOT_COORDINATOR": 16, "INVALID_GROUP_ID": 24,
        "UNKNOWN_MEMBER_ID": 25, "GROUP_AUTHORIZATION_FAILED": 30, "UNSUPPORTED_VERSION": 35,
        "INVALID_REQUEST": 42, "NON_EMPTY_GROUP": 68, "GROUP_ID_NOT_FOUND": 69,
        "GROUP_MAX_SIZE_REACHED": 81, "FENCED_INSTANCE_ID": 82, "FENCED_MEMBER_EPOCH": 110,
        "UNRELEASED_INSTANCE_ID": 111, "UNSUPPORTED_ASSIGNOR": 112,
        "COMPUTE_ASSIGNMENT": 1000, "INVALID_ASSIGNMENT": 1001,
        # Kafka's, for the classic group APIs (§7).
        "UNKNOWN_TOPIC_OR_PARTITION": 3, "ILLEGAL_GENERATION": 22,
        "INCONSISTENT_GROUP_PROTOCOL": 23, "INVALID_SESSION_TIMEOUT": 26,
        "REBALANCE_IN_PROGRESS": 27, "MEMBER_ID_REQUIRED": 79,
        # Kafka's, for a SASL handshake refused until the listeners authenticate.
        "UNSUPPORTED_SASL_MECHANISM": 33,
    }


def test_api_error_carries_code_and_message() -> None:
    error = ApiError(ErrorCode.INVALID_REQUEST, "RebalanceTimeoutMs must be positive")
    assert error.code is ErrorCode.INVALID_REQUEST
    assert error.message == "RebalanceTimeoutMs must be positive"
    assert "INVALID_REQUEST" in str(error)
