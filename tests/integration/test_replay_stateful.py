"""The core's state machine with a real log underneath: every change's records are appended
through `LogWriter` (one batch per change, fsynced, small segments) and compacted now and
then; a coordinator loaded from the files with `LogReplayer` must describe every group
exactly as the live one."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import trio
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from coordinator.assignors import load_assignors
from coordinator.config import ServerConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.result import Result
from coordinator.log import LogWriter, compact
from coordinator.storage import LogReplayer, encode_records
from tests.core.context import Context
from tests.core.test_stateful import BalancedMachine, CoordinatorMachine

SEGMENT_BYTES = 1_024  # several segments per example, so compaction has work


class LoggedContext(Context):
    """The core harness, writing each change's records as the server's sink does."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__()
        self.data_dir = data_dir
        self.writer = LogWriter.open(data_dir, segment_bytes=SEGMENT_BYTES)

    def apply(self, result: Result[Any]) -> Any:
        # Written before the jobs run: an assignor run's records come after this change's.
        if result.records:
            self.writer.append(encode_records(result.records), self.now)
            self.writer.sync()
        return super().apply(result)


def load_from_disk(data_dir: Path, config: ServerConfig) -> GroupCoordinator:
    fresh = GroupCoordinator(config, load_assignors(config.server_assignors))
    replayer = LogReplayer(data_dir, config)
    trio.run(replayer.load, fresh)
    assert replayer.writer is not None
    replayer.writer.close()
    return fresh


def assert_same_state(live: GroupCoordinator, loaded: GroupCoordinator) -> None:
    assert loaded.group_ids() == live.group_ids()
    for group_id in live.group_ids():
        assert loaded.describe_group(group_id) == live.describe_group(group_id)
        assert loaded.group_config(group_id) == live.group_config(group_id)
        assert loaded.unassigned_units(group_id) == live.unassigned_units(group_id)
    assert loaded.member_count() == live.member_count()


class LoggedMixin(CoordinatorMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="replay-"))
        self.ctx = LoggedContext(self.directory)
        self.steps = 0

    @rule(retention_ms=st.sampled_from([0, 60_000, 24 * 3_600_000]))
    def compact_closed_segments(self, retention_ms: int) -> None:
        writer = self.ctx.writer
        compact(self.directory, self.ctx.now, retention_ms,
                durable_end_offset=writer.durable_end_offset)

    @invariant()
    def the_log_on_disk_replays_to_the_live_state(self) -> None:
        self.steps += 1
        if self.steps % 3 == 0:  # every few steps keeps the examples quick
            assert_same_state(self.ctx.core, load_from_disk(self.directory, self.ctx.config))

    def teardown(self) -> None:
        try:
            super().teardown()
            assert_same_state(self.ctx.core, load_from_disk(self.directory, self.ctx.config))
        finally:
            self.ctx.writer.close()
            shutil.rmtree(self.directory, ignore_errors=True)


BOUNDED = settings(max_examples=15, stateful_step_count=25, deadline=None)


@BOUNDED
class LoggedClientAssigned(LoggedMixin):
    pass


@BOUNDED
class LoggedBalanced(LoggedMixin, BalancedMachine):
    pass


TestLoggedClientAssigned = LoggedClientAssigned.TestCase
TestLoggedBalanced = LoggedBalanced.TestCase
