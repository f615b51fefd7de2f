"""Walking the batches of one segment's bytes and checking their offsets (sans-IO).

Two kinds of trouble are told apart:

- a *frame problem*: the bytes at some position are not a whole batch with a matching
  CRC (a torn write, bit rot, zeros). The scan stops there and records it; whether it is
  a repairable torn tail is the caller's decision (only at the end of the newest segment,
  and only when no valid batch follows it).
- everything else (a batch whose CRC matches but whose contents or offsets are wrong) is
  never a torn write, so it raises `LogCorruptError` at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from coordinator.log.batch import (
    HEADER_SIZE,
    MAGIC,
    BatchFormatError,
    BatchHeader,
    FrameProblem,
    LogEntry,
    collect_newest,
    decode_records,
    read_batch_header,
)
from coordinator.log.errors import LogCorruptError
from coordinator.log.segments import Segment

_MAGIC_POSITION = 16  # of the magic byte within a batch
_NO_LIMIT = 2**63  # above every int64 offset


class SegmentScan:
    """One pass over `data`, the bytes of `segment`.

    `consecutive` is for the newest segment, which compaction never rewrote: its offsets
    must run on by one from the segment's base offset. Older segments may have gaps left
    by compaction, but offsets must still increase and stay below `next_segment_base`.
    """

    def __init__(
        self,
        data: bytes,
        segment: Segment,
        *,
        previous_offset: int,
        next_segment_base: int | None,
        consecutive: bool,
    ) -> None:
        self.data = data
        self.size = len(data)
        self.view = memoryview(data)
        self.segment = segment
        self._next_segment_base = next_segment_base
        self._consecutive = consecutive
        self.last_offset = previous_offset
        self.valid_end = 0
        self.batch_count = 0
        self.record_count = 0
        self.frame_problem: FrameProblem | None = None

    def headers(self) -> Iterator[BatchHeader]:
        """The valid batches' headers, offsets checked, records not decoded."""
        return self._walk(None)

    def collect_newest(self, newest: dict[bytes, bytes | None]) -> Iterator[int]:
        """`batch.collect_newest` for every valid batch, yielding each one's record count
        (start-up's fast path)."""
        return self._walk(partial(collect_newest, newest))

    def batches(self) -> Iterator[tuple[BatchHeader, list[LogEntry]]]:
        """The valid batches with their decoded records."""
        for header in self.headers():
            yield header, self.decode(header)

    def decode(self, header: BatchHeader) -> list[LogEntry]:
        try:
            return decode_records(self.data, header)
        except BatchFormatError as error:
            raise self._malformed(header, error) from None

    def _walk(self, read_records: Callable[[bytes, BatchHeader, memoryview], Any] | None
              ) -> Iterator[Any]:
        # One loop for both: start-up walks every batch of the log through here.
        data = self.data
        view = self.view
        position = 0
        size = len(data)
        consecutive = self._consecutive
        segment_base = self.segment.base_offset
        offset_limit = _NO_LIMIT if self._next_segment_base is None else self._next_segment_base
        while position < size:
            header = read_batch_header(data, position, view)
            if isinstance(header, FrameProblem):
                self.frame_problem = header
                return
            # The usual batch passes this at a glance; any other goes through the careful
            # check, which raises with the reason.
            base, delta = header.base_offset, header.last_offset_delta
            if not (
                0 <= delta
                and base + delta < offset_limit
                and (
                    base == (self.last_offset + 1 if self.batch_count else segment_base)
                    and header.record_count == delta + 1
                    if consecutive
                    else base > self.last_offset and base >= segment_base
                )
            ):
                self._check_offsets(header)
            if read_records is None:
                yield header
            else:
                try:
                    yield read_records(data, header, view)
                except BatchFormatError as error:
                    raise self._malformed(header, error) from None
            self.last_offset = header.base_offset + header.last_offset_delta
            self.batch_count += 1
            self.record_count += header.record_count
            position = self.valid_end = header.end

    def _check_offsets(self, header: BatchHeader) -> None:
        base = header.base_offset
        if self._consecutive:
            expected = self.segment.base_offset if self.batch_count == 0 else self.last_offset + 1
            if base != expected:
                raise self._corrupt(
                    header.position,
                    f"batch base offset {base}, expected {expected} "
                    + ("(offsets going backwards)" if base < expected else "(offset gap)"),
                )
            if header.record_count != header.last_offset_delta + 1:
                raise self._corrupt(
                    header.position,
                    f"batch at offset {base} has {header.record_count} records for "
                    f"{header.last_offset_delta + 1} offsets (offset gap)",
                )
        else:
            if base <= self.last_offset:
                raise self._corrupt(
                    header.position,
                    f"batch base offset {base} is not above the previous offset "
                    f"{self.last_offset} (offsets going backwards)",
                )
            if base < self.segment.base_offset:
                raise self._corrupt(
                    header.position,
                    f"batch base offset {base} is below the segment's base offset "
                    f"{self.segment.base_offset}",
                )
        if header.last_offset_delta < 0:
            raise self._corrupt(
                header.position, f"negative last offset delta {header.last_offset_delta}"
            )
        if self._next_segment_base is not None and header.last_offset >= self._next_segment_base:
            raise self._corrupt(
                header.position,
                f"batch reaches offset {header.last_offset}, at or past the next segment's "
                f"base offset {self._next_segment_base}",
            )

    def release(self) -> None:
        """Done with `data`: its memory map (if it is one) may close."""
        self.view.release()

    def find_valid_batch_after_problem(self) -> BatchHeader | None:
        """A batch with a matching CRC somewhere after the frame problem, if any.

        Only then is the problem mid-file damage rather than a torn tail. Candidates are
        positions with the magic byte and a base offset past the last good one.
        """
        problem = self.frame_problem
        if problem is None:
            return None
        data = self.data
        # Offsets run on by one in the newest segment, so a following batch cannot start
        # further on than one offset per byte of the damaged stretch.
        highest_plausible_base = self.last_offset + 1 + len(data)
        search_from = problem.position + 1 + _MAGIC_POSITION
        while True:
            found = data.find(MAGIC.to_bytes(1, "big"), search_from)
            if found < 0:
                return None
            search_from = found + 1
            candidate = found - _MAGIC_POSITION
            if len(data) - candidate < HEADER_SIZE:
                return None
            base = int.from_bytes(data[candidate : candidate + 8], "big", signed=True)
            if not self.last_offset < base <= highest_plausible_base:
                continue
            header = read_batch_header(data, candidate)
            if isinstance(header, BatchHeader):
                return header

    def _malformed(self, header: BatchHeader, error: BatchFormatError) -> LogCorruptError:
        return self._corrupt(header.position, f"malformed batch: {error}")

    def _corrupt(self, position: int, reason: str) -> LogCorruptError:
        return LogCorruptError(
            f"{self.segment.path} at byte {position}: {reason}",
            file=str(self.segment.path),
            position=position,
        )

    def problem_error(self, extra: str = "") -> LogCorruptError:
        """The `LogCorruptError` for the recorded frame problem."""
        assert self.frame_problem is not None
        return self._corrupt(self.frame_problem.position, self.frame_problem.reason + extra)
