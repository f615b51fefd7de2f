"""`dump`: batches and records in the manner of kafka-dump-log."""

from __future__ import annotations

from pathlib import Path

from coordinator.log import dump
from coordinator.log.chain import HEADER_SIZE
from coordinator.log.segments import segment_file_name

from .helpers import write_log

T0 = 1_700_000_000_000


def test_dump_lists_batches_and_records_in_hex(tmp_path: Path) -> None:
    write_log(tmp_path, [[(b"alpha", b"one"), (b"beta", None)], [(b"gamma", b"three")]])
    lines = list(dump(tmp_path))
    assert lines[0].startswith(f"Dumping {tmp_path / segment_file_name(0)}")
    batch_lines = [line for line in lines if line.startswith("baseOffset:")]
    assert batch_lines[0].startswith("baseOffset: 0 lastOffset: 1 count: 2")
    assert f"position: {HEADER_SIZE} " in batch_lines[0] and "crc: " in batch_lines[0]
    assert batch_lines[1].startswith("baseOffset: 2 lastOffset: 2 count: 1")
    record_lines = [line for line in lines if line.startswith("| offset:")]
    assert len(record_lines) == 3
    assert record_lines[0].startswith(f"| offset: 0 CreateTime: {T0} ")
    assert f"key: {b'alpha'.hex()} payload: {b'one'.hex()}" in record_lines[0]
    assert "valueSize: -1" in record_lines[1] and "<tombstone>" in record_lines[1]
    assert record_lines[2].startswith("| offset: 2 ")


def test_dump_uses_the_record_formatter(tmp_path: Path) -> None:
    write_log(tmp_path, [[(b"alpha", b"one"), (b"beta", None)]])

    def show(key: bytes, value: bytes | None) -> str:
        return f"{key.decode()}={value.decode() if value is not None else 'DELETE'}"

    record_lines = [line for line in dump(tmp_path, show) if line.startswith("| offset:")]
    assert record_lines[0].endswith(" alpha=one")
    assert record_lines[1].endswith(" beta=DELETE")


def test_dump_shows_damage_instead_of_raising(tmp_path: Path) -> None:
    write_log(tmp_path, [[(b"alpha", b"one")], [(b"beta", b"two")]])
    path = tmp_path / segment_file_name(0)
    size = path.stat().st_size
    with open(path, "r+b") as file:
        file.truncate(size - 4)
    lines = list(dump(tmp_path))
    assert any(line.startswith("| offset: 0 ") for line in lines)
    assert lines[-1].startswith(f"Damage: {path} at byte ")
    assert "partial batch" in lines[-1]
