"""The generated classes match schemas/*.json, and follow the agreed conventions."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest
from kio.schema.request_header.v2.header import RequestHeader
from kio.schema.response_header.v1.header import ResponseHeader
from kio.static.constants import EntityType

import protocol.messages as messages
from protocol import generate
from protocol.messages.connect_group_heartbeat_request import ClientAssignor

ROOT = Path(__file__).resolve().parents[2]


def copy_schemas(tmp_path: Path) -> Path:
    schemas = tmp_path / "schemas"
    shutil.copytree(generate.SCHEMA_DIR, schemas)
    return schemas


def rewrite(path: Path, edit: str, replacement: str) -> None:
    text = path.read_text()
    assert edit in text
    path.write_text(text.replace(edit, replacement, 1))


def test_generated_code_on_disk_is_up_to_date(tmp_path: Path) -> None:
    out = tmp_path / "messages"
    assert generate.main(["--out", str(out)]) == 0
    fresh = {path.name: path.read_text() for path in out.glob("*.py")}
    on_disk = {path.name: path.read_text() for path in generate.OUTPUT_DIR.glob("*.py")}
    assert sorted(fresh) == sorted(on_disk)
    stale = [name for name in fresh if fresh[name] != on_disk[name]]
    assert not stale, f"run python -m protocol.generate: {stale} differ"


def test_check_command_passes_on_the_repository() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "protocol.generate", "--check"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stderr


def test_check_fails_and_names_the_file_when_a_field_is_renamed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schemas = copy_schemas(tmp_path)
    rewrite(schemas / "ConnectGroupHeartbeatRequest.json", '"WorkerUrl"', '"WorkerAddress"')
    code = generate.main(["--check", "--schemas", str(schemas)])
    assert code == 1
    error = capsys.readouterr().err
    assert "connect_group_heartbeat_request.py" in error
    assert "connect_group_heartbeat_response.py" not in error


def test_check_fails_on_a_missing_or_extra_file(tmp_path: Path) -> None:
    out = tmp_path / "messages"
    shutil.copytree(generate.OUTPUT_DIR, out, ignore=shutil.ignore_patterns("__pycache__"))
    (out / "common.py").unlink()
    (out / "leftover.py").write_text("")
    assert generate.out_of_date(generate.generate(), out) == ["common.py", "leftover.py"]
    assert generate.main(["--out", str(out)]) == 0
    assert generate.main(["--check", "--out", str(out)]) == 0
    assert not (out / "leftover.py").exists()


def test_common_structs_in_a_non_flexible_message_are_refused(tmp_path: Path) -> None:
    schemas = copy_schemas(tmp_path)
    path = schemas / "ConnectGroupMetadataKey.json"
    schema = generate.load_schema(path)
    common = generate.load_schema(schemas / "ConnectGroupHeartbeatRequest.json")["commonStructs"]
    schema["fields"].append({"name": "Owned", "type": "ConnectorsAndTasks", "versions": "0+"})
    schema["commonStructs"] = common
    path.write_text(json.dumps(schema))
    with pytest.raises(generate.SchemaError, match="not flexible"):
        generate.generate(schemas)
    assert generate.main(["--check", "--schemas", str(schemas)]) == 2


@pytest.mark.parametrize(
    ("edit", "replacement", "complaint"),
    [
        ('"type": "int32"', '"type": "int33"', "unknown type"),
        ('"versions": "0+"', '"versions": "1+"', "version 0"),
        ('"validVersions": "0"', '"validVersions": "1"', "validVersions must be"),
        ('"versions": "0+"', '"versions": "0-1"', "versions must be"),
    ],
)
def test_schema_errors_are_reported(
    tmp_path: Path, edit: str, replacement: str, complaint: str
) -> None:
    schemas = copy_schemas(tmp_path)
    rewrite(schemas / "ConnectGroupPrepareAssignmentRequest.json", edit, replacement)
    with pytest.raises(generate.SchemaError, match=complaint):
        generate.generate(schemas)


@pytest.mark.parametrize(
    ("json_name", "python_name"),
    [
        ("GroupId", "group_id"),
        ("OwnedConnectorsAndTasks", "owned_connectors_and_tasks"),
        ("ThrottleTimeMs", "throttle_time_ms"),
        ("LastAssignmentMs", "last_assignment_ms"),
        ("GroupIds", "group_ids"),
        ("ConnectGroupTargetAssignmentMemberKey", "connect_group_target_assignment_member_key"),
    ],
)
def test_snake_case(json_name: str, python_name: str) -> None:
    assert generate.snake_case(json_name) == python_name


def test_every_schema_has_its_module_and_export() -> None:
    for path in generate.SCHEMA_DIR.glob("*.json"):
        name = path.stem
        assert (generate.OUTPUT_DIR / f"{generate.snake_case(name)}.py").is_file()
        assert name in messages.__all__
    assert {"ConnectorTaskId", "ConnectorsAndTasks"} <= set(messages.__all__)


def test_common_structs_are_defined_once() -> None:
    for name in messages.__all__:
        module = sys.modules[getattr(messages, name).__module__]
        if module.__name__ != "protocol.messages.common":
            assert "class ConnectorsAndTasks" not in Path(str(module.__file__)).read_text()


def test_class_conventions() -> None:
    request = messages.ConnectGroupHeartbeatRequest
    assert request.__type__ is EntityType.request
    assert request.__header_schema__ is RequestHeader
    assert (request.__version__, request.__api_key__, request.__flexible__) == (0, 1000, True)
    assert ClientAssignor.__type__ is EntityType.nested
    assert ClientAssignor.__header_schema__ is RequestHeader
    response = messages.ConnectGroupDescribeResponse
    assert response.__type__ is EntityType.response
    assert response.__header_schema__ is ResponseHeader
    key, value = messages.ConnectGroupMetadataKey, messages.ConnectGroupMetadataValue
    assert key.__type__ is value.__type__ is EntityType.data
    assert (key.__flexible__, value.__flexible__) == (False, True)
    assert key.__api_key__ == value.__api_key__ == 3


def test_field_conventions() -> None:
    request_fields = dataclasses.fields(messages.ConnectGroupHeartbeatRequest)
    fields = {field.name: field for field in request_fields}
    assert list(fields) == [
        "group_id", "member_id", "member_epoch", "instance_id", "worker_url",
        "rebalance_timeout_ms", "server_assignor", "client_assignors",
        "owned_connectors_and_tasks",
    ]
    assert fields["member_epoch"].type is int
    assert fields["member_epoch"].metadata["kafka_type"] == "int32"
    assert fields["member_epoch"].default is dataclasses.MISSING
    assert fields["rebalance_timeout_ms"].default == -1
    assert fields["instance_id"].type == str | None
    assert fields["instance_id"].default is None
    assert fields["client_assignors"].type == tuple[ClientAssignor, ...] | None
    assert "kafka_type" not in fields["client_assignors"].metadata
    assert fields["owned_connectors_and_tasks"].type == messages.ConnectorsAndTasks | None
    describe = {f.name: f for f in dataclasses.fields(messages.ConnectGroupDescribeRequest)}
    assert describe["group_ids"].type == tuple[str, ...]
    assert describe["group_ids"].metadata["kafka_type"] == "string"
    heartbeat_response = messages.ConnectGroupHeartbeatResponse
    error_code = {f.name: f for f in dataclasses.fields(heartbeat_response)}["error_code"]
    assert error_code.type is int and error_code.metadata["kafka_type"] == "int16"


def test_generated_files_say_where_they_come_from() -> None:
    source = (generate.OUTPUT_DIR / "connect_group_heartbeat_request.py").read_text()
    assert "schemas/ConnectGroupHeartbeatRequest.json" in source.splitlines()[0]
    assert "Do not edit" in source


def test_an_older_version_gets_classes_without_the_newer_fields() -> None:
    """ConnectGroupDescribe v1 adds fields: v0 keeps classes of its own without them, so a
    v0 client is answered in exactly the bytes it knows; the request, the same in both
    versions, has one class."""
    def names(cls: type) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    response_v1, response_v0 = messages.ConnectGroupDescribeResponse, \
        messages.ConnectGroupDescribeResponseV0
    assert (response_v1.__version__, response_v0.__version__) == (1, 0)
    group_v1 = get_args(dataclasses.fields(response_v1)[1].type)[0]
    group_v0 = get_args(dataclasses.fields(response_v0)[1].type)[0]
    assert {"group_type", "units_source"} <= set(names(group_v1))
    assert set(names(group_v1)) - set(names(group_v0)) == {"group_type", "units_source"}
    member_v1 = get_args(dataclasses.fields(group_v1)[-1].type)[0]
    member_v0 = get_args(dataclasses.fields(group_v0)[-1].type)[0]
    assert set(names(member_v1)) - set(names(member_v0)) == {"protocol", "classic_protocol"}
    assert not hasattr(messages, "ConnectGroupDescribeRequestV0")
