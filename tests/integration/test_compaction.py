"""Compaction of a real coordinator log: the compacted log replays to the same state as
the full one, expired tombstones are dropped, and deleted groups stay deleted. Also the
server's periodic compaction, off the request path."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.config import ServerConfig
from coordinator.log import compact, read_all
from coordinator.server.app import run_server
from coordinator.snapshot import ReadOnlyFileLayer, load_core
from coordinator.storage import snapshot_rows
from tests.core.context import Context

from .test_replay_stateful import LoggedContext, assert_same_state, load_from_disk

GROUPS = ["g1", "g2"]
WORKERS = ["w1", "w2", "w3"]
HOUR = 3_600_000

operation = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(GROUPS), st.sampled_from("ABC"),
              st.integers(0, 4)),
    st.tuples(st.just("delete_connector"), st.sampled_from(GROUPS), st.sampled_from("ABC")),
    st.tuples(st.just("join"), st.sampled_from(GROUPS), st.sampled_from(WORKERS)),
    st.tuples(st.just("heartbeat"), st.sampled_from(GROUPS), st.sampled_from(WORKERS)),
    st.tuples(st.just("leave"), st.sampled_from(GROUPS), st.sampled_from(WORKERS)),
    st.tuples(st.just("delete_group"), st.sampled_from(GROUPS)),
    st.tuples(st.just("advance"), st.sampled_from([1_000, 15_000, HOUR])),
)


def run_operations(ctx: Context, operations: list[tuple[object, ...]]) -> None:
    """Apply core operations through the test harness; errors are part of the game."""
    epochs: dict[tuple[str, str], int] = {}
    for op in operations:
        kind = op[0]
        if kind == "advance":
            ctx.advance(int(op[1]))  # type: ignore[call-overload]
            continue
        group = str(op[1])
        exists = group in ctx.core.store.groups
        if kind == "put":
            ctx.put_connector(group, str(op[2]), int(op[3]))  # type: ignore[call-overload]
        elif kind == "delete_connector" and exists \
                and str(op[2]) in ctx.core.store.groups[group].connectors:
            ctx.apply(ctx.core.delete_connector(group, str(op[2]), ctx.now))
        elif kind == "join":
            response = ctx.join(group, str(op[2]), server_assignor="balanced")
            if response.error_code == 0:
                epochs[(group, str(op[2]))] = response.member_epoch
        elif kind == "heartbeat" and (group, str(op[2])) in epochs:
            response = ctx.heartbeat(group, str(op[2]), epochs[(group, str(op[2]))])
            if response.error_code == 0:
                epochs[(group, str(op[2]))] = response.member_epoch
            else:
                del epochs[(group, str(op[2]))]
        elif kind == "leave" and (group, str(op[2])) in epochs:
            ctx.heartbeat(group, str(op[2]), -1)
            del epochs[(group, str(op[2]))]
        elif kind == "delete_group" and exists and not ctx.core.store.groups[group].members:
            ctx.apply(ctx.core.delete_group(group, ctx.now))


@settings(max_examples=25, deadline=None)
@given(operations=st.lists(operation, min_size=5, max_size=60),
       retention_ms=st.sampled_from([0, HOUR, 24 * HOUR]))
def test_a_compacted_log_replays_to_the_same_state(
    operations: list[tuple[object, ...]], retention_ms: int
) -> None:
    directory = Path(tempfile.mkdtemp(prefix="compaction-"))
    try:
        ctx = LoggedContext(directory)
        run_operations(ctx, operations)
        ctx.writer.close()
        before = len(list(read_all(directory)))
        report = compact(directory, ctx.now, retention_ms)
        after = len(list(read_all(directory)))
        assert report.records_before - report.records_after == before - after
        assert_same_state(ctx.core, load_from_disk(directory, ctx.config))
        # ... and the same as replaying every record ever written, in order.
        assert_same_state(ctx.replayed(), load_from_disk(directory, ctx.config))
        # Compacting again changes nothing more.
        again = compact(directory, ctx.now, retention_ms)
        assert again.segments_rewritten == 0
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def fill_segments(ctx: Context, group: str, changes: int) -> None:
    """Enough changes to a busy group to close the segments written so far."""
    for index in range(changes):
        ctx.put_connector(group, "filler", index % 5)


def test_tombstones_expire_and_a_deleted_group_stays_deleted(tmp_path: Path) -> None:
    ctx = LoggedContext(tmp_path)
    ctx.put_connector("old", "A", 2)
    ctx.join("old", "w1", server_assignor="balanced")
    ctx.heartbeat("old", "w1", -1)
    ctx.apply(ctx.core.delete_group("old", ctx.now))
    assert "old" not in ctx.core.store.groups
    fill_segments(ctx, "busy", 60)
    ctx.advance(2 * HOUR)
    ctx.put_connector("young", "B", 1)
    ctx.apply(ctx.core.delete_group("young", ctx.now))  # a tombstone younger than 1 h
    fill_segments(ctx, "busy", 60)
    ctx.writer.close()
    tombstones_before = sum(entry.value is None for entry in read_all(tmp_path))

    report = compact(tmp_path, ctx.now, HOUR)

    assert report.tombstones_dropped > 0
    entries = list(read_all(tmp_path))
    assert 0 < sum(entry.value is None for entry in entries) < tombstones_before
    # Nothing of "old" is left; "young"'s tombstones are still there (within retention).
    loaded = load_from_disk(tmp_path, ctx.config)
    assert "old" not in loaded.group_ids() and "young" not in loaded.group_ids()
    assert_same_state(ctx.core, loaded)
    # Dropping every tombstone (retention 0) still cannot resurrect a group.
    compact(tmp_path, ctx.now, 0)
    assert_same_state(ctx.core, load_from_disk(tmp_path, ctx.config))


def records_on_disk(data_dir: Path) -> tuple[int, int]:
    """(segments, records), read without repairing anything: the server is running."""
    return (len(list(data_dir.glob("*.log"))),
            sum(1 for _ in read_all(data_dir, ReadOnlyFileLayer())))


async def test_the_server_compacts_in_the_background(tmp_path: Path) -> None:
    config = ServerConfig(assignment_interval_ms=0, assignor_offload_enable=False,
                          log_segment_bytes=4_096, log_compaction_interval_ms=1_000,
                          shutdown_timeout_ms=2_000)
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(run_server, config, ("127.0.0.1", 0),
                                     ("127.0.0.1", 0), tmp_path)
        runtime = handle.runtime
        for index in range(400):  # the same key over and over: most records are superseded
            await runtime.put_connector("g", "c", index % 7)
        segments, written = records_on_disk(tmp_path)
        assert segments > 2
        for _ in range(50):
            if records_on_disk(tmp_path)[1] < written / 2:
                break
            await trio.sleep(0.2)
        else:
            raise AssertionError("no compaction within 10 s")
        # Requests are served afterwards, and the state is what the full log said.
        await runtime.put_connector("g", "c", 3)
        live = snapshot_rows(runtime.core, 0)
        handle.stop()
    assert snapshot_rows(load_core(tmp_path, config), 0) == live
