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

from crc32c import crc32c

from coordinator.log.batch import (
    _CRC_COVERAGE_START,
    _HEADER,
    _UNSUPPORTED_ATTRIBUTES,
    HEADER_SIZE,
    LENGTH_PREFIX_SIZE,
    MAGIC,
    MIN_BATCH_LENGTH,
    BatchFormatError,
    BatchHeader,
    FrameProblem,
    LogEntry,
    collect_newest,
    collect_newest_records,
    decode_records,
    read_batch_header,
)
from coordinator.log.errors import LogCorruptError
from coordinator.log.segments import Segment

_MAGIC_POSITION = 16  # of the magic byte within a batch
_NO_LIMIT = 2**63  # above every int64 offset
# `collect_newest` yields after this many batches, so that start-up can keep answering.
COLLECT_CHUNK_BATCHES = 2048


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
        start: int = 0,
        end: int | None = None,
    ) -> None:
        """`start` and `end` bound the batches within `data` (a segment's header and
        trailer lie outside them)."""
        self.data = data
        self.size = len(data) if end is None else end
        self.view = memoryview(data)
        self.segment = segment
        self._next_segment_base = next_segment_base
        self._consecutive = consecutive
        self.last_offset = previous_offset
        self.valid_end = start
        self.batch_count = 0
        self.record_count = 0
        self.frame_problem: FrameProblem | None = None

    def headers(self) -> Iterator[BatchHeader]:
        """The valid batches' headers, offsets checked, records not decoded."""
        position = self.valid_end
        while position < self.size:
            step = self._next_batch(position, None)
            if step is None:
                return
            header, _ = step
            yield header
            position = header.end

    def collect_newest(self, newest: dict[bytes, bytes | None],
                       chunk_batches: int = COLLECT_CHUNK_BATCHES) -> Iterator[int]:
        """`batch.collect_newest` for every valid batch (start-up's fast path), yielding
        the number of records collected every `chunk_batches` batches."""
        # Start-up walks every batch of the log through this loop, and most batches hold a
        # few records, so the per-batch work is what counts: the usual batch (whole, right
        # magic and CRC, supported attributes, offsets where they belong) is checked on
        # plain ints, without building a header. Any other goes through `_next_batch`,
        # the careful step, which records a frame problem or raises with the reason.
        data, view, size = self.data, self.view, self.size
        unpack_header = _HEADER.unpack_from
        consecutive = self._consecutive
        segment_base = self.segment.base_offset
        offset_limit = _NO_LIMIT if self._next_segment_base is None else self._next_segment_base
        careful = partial(collect_newest, newest)
        position = self.valid_end
        while position < size:
            counted_before = self.record_count
            last_offset, batch_count, record_count = (
                self.last_offset, self.batch_count, self.record_count)
            chunk_end = batch_count + chunk_batches
            while position < size and batch_count < chunk_end:
                if size - position >= HEADER_SIZE:
                    (base, length, _epoch, magic, crc, attributes, delta, _first_timestamp,
                     _max_timestamp, _producer, _producer_epoch, _sequence, count
                     ) = unpack_header(data, position)
                    end = position + LENGTH_PREFIX_SIZE + length
                    if (
                        length >= MIN_BATCH_LENGTH
                        and end <= size
                        and magic == MAGIC
                        and not attributes & _UNSUPPORTED_ATTRIBUTES
                        and 0 <= delta
                        and base + delta < offset_limit
                        and (
                            base == (last_offset + 1 if batch_count else segment_base)
                            and count == delta + 1
                            if consecutive
                            else count >= 0 and base > last_offset and base >= segment_base
                        )
                        and crc32c(view[position + _CRC_COVERAGE_START : end]) == crc
                        and collect_newest_records(newest, view, position, end, base,
                                                   base + delta)
                    ):
                        last_offset = base + delta
                        batch_count += 1
                        record_count += count
                        position = end
                        continue
                self.last_offset, self.batch_count = last_offset, batch_count
                self.record_count, self.valid_end = record_count, position
                if self._next_batch(position, careful) is None:
                    yield self.record_count - counted_before
                    return  # a frame problem: the caller decides what it means
                # Only reached if the careful step accepts what the quick checks did not.
                last_offset, batch_count = self.last_offset, self.batch_count
                record_count, position = self.record_count, self.valid_end
            self.last_offset, self.batch_count = last_offset, batch_count
            self.record_count, self.valid_end = record_count, position
            yield record_count - counted_before

    def batches(self) -> Iterator[tuple[BatchHeader, list[LogEntry]]]:
        """The valid batches with their decoded records."""
        for header in self.headers():
            yield header, self.decode(header)

    def decode(self, header: BatchHeader) -> list[LogEntry]:
        try:
            return decode_records(self.data, header)
        except BatchFormatError as error:
            raise self._malformed(header, error) from None

    def _next_batch(self, position: int,
                    read_records: Callable[[bytes, BatchHeader, memoryview], Any] | None
                    ) -> tuple[BatchHeader, Any] | None:
        """The batch at `position` with its offsets checked and (unless `read_records` is
        None) its records read; None after recording a frame problem there. Raises
        `LogCorruptError` for a batch whose CRC matches but that breaks a rule."""
        header = read_batch_header(self.data, position, self.view)
        if not isinstance(header, FrameProblem) and header.end > self.size:
            header = FrameProblem(position, "a batch runs into the segment's end mark", False)
        if isinstance(header, FrameProblem):
            self.frame_problem = header
            return None
        self._check_offsets(header)
        records = None
        if read_records is not None:
            try:
                records = read_records(self.data, header, self.view)
            except BatchFormatError as error:
                raise self._malformed(header, error) from None
        self.last_offset = header.base_offset + header.last_offset_delta
        self.batch_count += 1
        self.record_count += header.record_count
        self.valid_end = header.end
        return header, records

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
        highest_plausible_base = self.last_offset + 1 + self.size
        search_from = problem.position + 1 + _MAGIC_POSITION
        while True:
            found = data.find(MAGIC.to_bytes(1, "big"), search_from)
            if found < 0:
                return None
            search_from = found + 1
            candidate = found - _MAGIC_POSITION
            if self.size - candidate < HEADER_SIZE:
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
