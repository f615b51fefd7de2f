"""A segment lost from a real coordinator's log (deleted, emptied, renamed) stops start-up
and fails `log check`, naming the file; a log written before segments had headers still
loads; and the server's compaction keeps the number of segment files bounded."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import trio

from coordinator.log.chain import TRAILER_SIZE, read_ends
from coordinator.log.files import OsFileLayer
from coordinator.log.segments import Segment, list_segments

from .helpers import ServerProcess, connector_tasks
from .test_startup_and_tools import failed_start, tool

GROUPS = 120
SETTINGS = ["group.connect.session.timeout.ms=600000", "log.segment.bytes=4096",
            "log.compaction.interval.ms=86400000"]


def segments(data_dir: Path) -> list[Segment]:
    return list_segments(OsFileLayer(), data_dir).segments


async def write_groups(server: ServerProcess, groups: range) -> None:
    """One acknowledged change per group: a connector with a task count of its own."""
    for index in groups:
        status, reply = await server.http("PUT", f"/groups/g{index}/connectors/c",
                                          {"tasks": index % 5 + 1})
        assert status == 200, reply


@pytest.fixture(scope="module")
def written_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir a real `serve` wrote: GROUPS acknowledged changes over several segments."""
    root = tmp_path_factory.mktemp("written")
    server = ServerProcess(root / "data", root, SETTINGS)

    async def write() -> None:
        await server.start()
        try:
            await write_groups(server, range(GROUPS))
        finally:
            server.kill()

    trio.run(write)
    assert len(segments(root / "data")) >= 4
    return root / "data"


@pytest.fixture
def data_dir(written_log: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "data"
    shutil.copytree(written_log, copy)
    return copy


async def all_groups_are_back(data_dir: Path, tmp_path: Path) -> list[dict[str, Any]]:
    """Start `serve`: every group is there as written. The server's log events."""
    server = ServerProcess(data_dir, tmp_path, SETTINGS)
    await server.start()
    try:
        status, listing = await server.http("GET", "/groups")
        assert status == 200, listing
        assert {group["group_id"] for group in listing["groups"]} == {
            f"g{index}" for index in range(GROUPS)}
        for index in range(GROUPS):
            view = await server.group(f"g{index}")
            assert connector_tasks(view) == {"c": index % 5 + 1}, view
    finally:
        server.kill()
    return server.events()


async def refused(data_dir: Path, tmp_path: Path, file: str) -> None:
    """Start-up stops with one line naming `file`; `log check` fails naming it too."""
    failed, output = await failed_start(data_dir, tmp_path)
    assert file in failed["error"], failed
    assert file in output.splitlines()[-1]
    checked = tool("check", str(data_dir))
    assert checked.returncode == 1, checked.stdout
    assert file in checked.stdout and "NOT repairable" in checked.stdout


async def test_an_intact_log_loads_every_acknowledged_group(data_dir: Path,
                                                            tmp_path: Path) -> None:
    assert tool("check", str(data_dir)).returncode == 0
    await all_groups_are_back(data_dir, tmp_path)


async def test_a_deleted_older_segment_is_refused(data_dir: Path, tmp_path: Path) -> None:
    lost = segments(data_dir)[1].path
    lost.unlink()
    await refused(data_dir, tmp_path, lost.name)


async def test_a_deleted_first_segment_is_refused(data_dir: Path, tmp_path: Path) -> None:
    first, second = segments(data_dir)[:2]
    first.path.unlink()
    await refused(data_dir, tmp_path, second.name)


async def test_an_emptied_older_segment_is_refused(data_dir: Path, tmp_path: Path) -> None:
    emptied = segments(data_dir)[1].path
    emptied.write_bytes(b"")
    await refused(data_dir, tmp_path, emptied.name)


async def test_an_older_segment_cut_at_a_batch_boundary_is_refused(
    data_dir: Path, tmp_path: Path
) -> None:
    # Cut just before its end mark: every batch left is whole, only the last ones are gone.
    cut = segments(data_dir)[1].path
    data = cut.read_bytes()
    cut.write_bytes(data[: len(data) - TRAILER_SIZE])
    await refused(data_dir, tmp_path, cut.name)


async def test_a_deleted_newest_segment_is_refused(data_dir: Path, tmp_path: Path) -> None:
    newest = segments(data_dir)[-1].path
    newest.unlink()
    await refused(data_dir, tmp_path, newest.name)


async def test_an_emptied_newest_segment_is_refused(data_dir: Path, tmp_path: Path) -> None:
    newest = segments(data_dir)[-1].path
    newest.write_bytes(b"")
    await refused(data_dir, tmp_path, newest.name)


async def test_swapped_segment_names_are_refused(data_dir: Path, tmp_path: Path) -> None:
    one, two = (segment.path for segment in segments(data_dir)[1:3])
    parked = one.with_name("parked")
    one.rename(parked)
    two.rename(one)
    parked.rename(two)
    await refused(data_dir, tmp_path, one.name)


def strip_headers(data_dir: Path) -> None:
    """Make the directory what a coordinator wrote before segments had headers."""
    for segment in segments(data_dir):
        data = segment.path.read_bytes()
        ends = read_ends(segment, data)
        segment.path.write_bytes(data[ends.batches_start : ends.batches_end])


async def test_a_log_written_before_segments_had_headers_loads_and_is_converted(
    data_dir: Path, tmp_path: Path
) -> None:
    strip_headers(data_dir)
    assert all(read_ends(s, s.path.read_bytes()).kind == "legacy" for s in segments(data_dir))
    assert tool("check", str(data_dir)).returncode == 0
    events = await all_groups_are_back(data_dir, tmp_path)
    converted = [e for e in events if e.get("event") == "log_segments_converted"]
    assert converted and converted[0]["segments"] == len(segments(data_dir))
    assert all(read_ends(s, s.path.read_bytes()).kind == "chained" for s in segments(data_dir))
    assert tool("check", str(data_dir)).returncode == 0
    # Converted, the log knows its segments: losing one is refused from now on.
    lost = segments(data_dir)[2].path
    lost.unlink()
    await refused(data_dir, tmp_path, lost.name)


async def test_compaction_keeps_the_number_of_segments_bounded(tmp_path: Path) -> None:
    # Most changes rewrite one connector; every tenth makes a group that stays. Each
    # closed segment keeps a few records after compaction: without merging, every roll
    # would leave one more small file behind.
    data_dir = tmp_path / "data"
    segment_bytes = 4096
    server = ServerProcess(data_dir, tmp_path, [
        "group.connect.session.timeout.ms=600000", f"log.segment.bytes={segment_bytes}",
        "log.compaction.interval.ms=1000"])
    await server.start()
    try:
        for index in range(600):
            if index % 10 == 0:
                await write_groups(server, range(index, index + 1))
            else:
                status, reply = await server.http("PUT", "/groups/hot/connectors/c",
                                                  {"tasks": index % 7 + 1})
                assert status == 200, reply
        bound = 0
        with trio.move_on_after(60):
            while True:
                files = segments(data_dir)
                total = sum(segment.path.stat().st_size for segment in files)
                bound = total // segment_bytes + 3
                if len(files) <= bound:
                    break
                await trio.sleep(0.2)
        files = segments(data_dir)
        assert len(files) <= bound, (len(files), bound)
        merged = sum(event.get("segments_removed", 0) for event in server.events()
                     if event.get("event") == "log_compacted")
        assert merged >= 5, merged
    finally:
        server.kill()
    # The merged log holds every group and passes the check.
    checked = tool("check", str(data_dir))
    assert checked.returncode == 0, checked.stdout
    server = ServerProcess(data_dir, tmp_path, SETTINGS)
    await server.start()
    try:
        status, listing = await server.http("GET", "/groups")
        assert status == 200, listing
        assert len(listing["groups"]) == 61  # g0, g10, ... g590 and hot
        assert connector_tasks(await server.group("g590")) == {"c": 590 % 5 + 1}
        assert connector_tasks(await server.group("hot")) == {"c": 599 % 7 + 1}
    finally:
        server.kill()
