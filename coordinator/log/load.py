"""Start-up load (`read_all`) and the read-only `check` of a data directory.

`read_all` repairs only what a crash leaves behind, and says so in the result: a partial
or CRC-failing batch at the very end of the newest segment with nothing valid after it
(an append that was never acknowledged), truncated away; temp files of an interrupted
compaction or roll (the segments they were meant to become are intact without them);
segments an interrupted merge left behind (the merged segment holds their records); and
the empty segment of an unfinished roll (see `coordinator.log.chain`). Everything else,
a broken chain of segments included, raises `LogCorruptError` naming the file.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from coordinator.log.batch import LogEntry
from coordinator.log.chain import Chain, ChainLink, link_segments, read_ends
from coordinator.log.errors import LogCorruptError
from coordinator.log.files import FileLayer, OsFileLayer
from coordinator.log.scan import SegmentScan
from coordinator.log.segments import DirectoryListing, Segment, list_segments


@dataclass(frozen=True)
class TailTruncation:
    file: str
    position: int
    removed_bytes: int
    reason: str

    def message(self) -> str:
        return (
            f"truncated {self.removed_bytes} bytes at the end of {self.file} from byte "
            f"{self.position}: {self.reason} (an append interrupted by a crash)"
        )


@dataclass
class LoadResult:
    data_dir: Path
    segments: list[str] = field(default_factory=list)
    batches: int = 0
    records: int = 0
    # The offset the next append gets.
    next_offset: int = 0
    # The newest segment, which appends continue; None for an empty directory.
    active_segment: Segment | None = None
    active_segment_size: int = 0
    truncations: list[TailTruncation] = field(default_factory=list)
    removed_temp_files: list[str] = field(default_factory=list)
    removed_merge_leftovers: list[str] = field(default_factory=list)
    removed_unfinished_roll: str | None = None
    # The segments without a header (written before segments had one), oldest first;
    # the writer converts them when it opens the log.
    legacy_segments: list[ChainLink] = field(default_factory=list)

    @property
    def warnings(self) -> list[str]:
        """What the caller should log at warning level."""
        unfinished = self.removed_unfinished_roll
        return (
            [truncation.message() for truncation in self.truncations]
            + [f"removed {name}, left behind by an interrupted compaction or roll"
               for name in self.removed_temp_files]
            + [f"removed {name}: an interrupted compaction had merged its records into "
               "the segment before it" for name in self.removed_merge_leftovers]
            + ([f"removed {unfinished}, the empty segment of a roll a crash interrupted"]
               if unfinished is not None else [])
        )


class LogLoad:
    """Iterate once for every record in offset order (or run `collect_newest` once); then
    `result` tells what happened."""

    def __init__(self, data_dir: Path, file_layer: FileLayer) -> None:
        self._data_dir = data_dir
        self._file_layer = file_layer
        self._result: LoadResult | None = None
        self._started = False

    @property
    def result(self) -> LoadResult:
        if self._result is None:
            raise RuntimeError("the load result is known only after iterating to the end")
        return self._result

    def __iter__(self) -> Iterator[LogEntry]:
        for scan in self._scans():
            for header in scan.headers():
                yield from scan.decode(header)

    def collect_newest(self, newest: dict[bytes, bytes | None]) -> Iterator[int]:
        """Put every record into `newest` (key -> value, in the order of their last writes,
        as `batch.collect_newest`), yielding each batch's record count: start-up's fast
        path, whose caller needs only the newest value of each key."""
        for scan in self._scans():
            yield from scan.collect_newest(newest)

    def _scans(self) -> Iterator[SegmentScan]:
        """Each segment's scan, in order; the caller walks it to its end (`headers()` or
        `collect_newest()`) before asking for the next, and what the walk found is dealt
        with then."""
        if self._started:
            raise RuntimeError("a LogLoad can be iterated only once")
        self._started = True
        layer = self._file_layer
        result = LoadResult(self._data_dir)
        listing, chain = survey(layer, self._data_dir)
        listing.require_well_formed()
        chain.raise_first_problem()
        removed = [*listing.temp_files, *(leftover.path for leftover in chain.merge_leftovers)]
        if chain.unfinished_roll is not None:
            removed.append(chain.unfinished_roll.path)
            result.removed_unfinished_roll = str(chain.unfinished_roll.path)
        result.removed_temp_files = [str(path) for path in listing.temp_files]
        result.removed_merge_leftovers = [str(leftover.path) for leftover in chain.merge_leftovers]
        if removed:
            for path in removed:
                layer.remove(path)
            layer.fsync_directory(self._data_dir)

        links = chain.links
        result.legacy_segments = chain.legacy
        previous_offset = -1
        for index, link in enumerate(links):
            segment = link.segment
            newest = index == len(links) - 1
            with layer.read_mapped(segment.path) as data:
                scan = SegmentScan(
                    data,
                    segment,
                    previous_offset=previous_offset,
                    next_segment_base=link.offset_limit,
                    consecutive=newest,
                    start=link.ends.batches_start,
                    end=link.ends.batches_end,
                )
                yield scan
                if scan.frame_problem is not None:
                    if not newest:
                        raise scan.problem_error(" (in a segment that is not the newest)")
                    following = scan.find_valid_batch_after_problem()
                    if following is not None:
                        raise scan.problem_error(
                            f" (followed by a valid batch at byte {following.position}, "
                            f"offset {following.base_offset})"
                        )
                scan.release()
            if scan.frame_problem is not None:  # a torn tail: cut once the map is closed
                result.truncations.append(self._truncate_tail(scan))
            result.segments.append(segment.name)
            result.batches += scan.batch_count
            result.records += scan.record_count
            previous_offset = scan.last_offset
            if newest:
                result.active_segment = segment
                result.active_segment_size = scan.valid_end
                # An empty newest segment (just rolled) still fixes the next offset.
                result.next_offset = max(scan.last_offset + 1, segment.base_offset)
        self._result = result

    def _truncate_tail(self, scan: SegmentScan) -> TailTruncation:
        assert scan.frame_problem is not None
        file = self._file_layer.open(scan.segment.path)
        try:
            file.truncate(scan.valid_end)
            file.fsync()
        finally:
            file.close()
        return TailTruncation(
            file=str(scan.segment.path),
            position=scan.valid_end,
            removed_bytes=scan.size - scan.valid_end,
            reason=scan.frame_problem.reason,
        )


def survey(layer: FileLayer, data_dir: Path, *, below: int | None = None
           ) -> tuple[DirectoryListing, Chain]:
    """The directory's files and how its segments link up (only their ends are read).

    With `below` (a live writer's durable end), only the segments starting below it are
    linked, and the newest of those may have a trailer with no successor yet: the writer
    may be rolling right now."""
    listing = list_segments(layer, data_dir)
    all_ends = []
    for segment in listing.segments:
        if below is not None and segment.base_offset >= below:
            break
        with layer.read_mapped(segment.path) as data:
            all_ends.append(read_ends(segment, data))
    return listing, link_segments(all_ends, live=below is not None)


def read_all(data_dir: Path | str, file_layer: FileLayer | None = None) -> LogLoad:
    """Every record of the log in offset order: `for offset, key, value, ts in read_all(d)`."""
    return LogLoad(Path(data_dir), file_layer if file_layer is not None else OsFileLayer())


def find_newest(data_dir: Path | str, key: bytes, file_layer: FileLayer | None = None
                ) -> tuple[str, int, int] | None:
    """Where the newest record with `key` is: (segment file, batch position, offset).

    For error messages about a log that loaded: it reads the whole log again."""
    layer = file_layer if file_layer is not None else OsFileLayer()
    found = None
    for link in survey(layer, Path(data_dir))[1].links:
        segment = link.segment
        scan = SegmentScan(layer.read(segment.path), segment, previous_offset=-1,
                           next_segment_base=None, consecutive=False,
                           start=link.ends.batches_start, end=link.ends.batches_end)
        for header, entries in scan.batches():
            for entry in entries:
                if entry.key == key:
                    found = (str(segment.path), header.position, entry.offset)
    return found


@dataclass(frozen=True)
class Damage:
    file: str
    position: int | None
    reason: str
    # A torn tail of the newest segment: start-up would truncate it with a warning.
    repairable: bool

    def message(self) -> str:
        where = f" at byte {self.position}" if self.position is not None else ""
        verdict = "repairable at start-up" if self.repairable else "NOT repairable"
        return f"{self.file}{where}: {self.reason} [{verdict}]"


@dataclass
class CheckReport:
    data_dir: Path
    segments: int = 0
    batches: int = 0
    records: int = 0
    damage: list[Damage] = field(default_factory=list)
    temp_files: list[str] = field(default_factory=list)
    merge_leftovers: list[str] = field(default_factory=list)
    unfinished_roll: str | None = None
    legacy_segments: int = 0  # without a header: the writer converts them when it opens

    @property
    def ok(self) -> bool:
        return not self.damage

    @property
    def start_up_would_succeed(self) -> bool:
        return all(damage.repairable for damage in self.damage)

    def lines(self) -> list[str]:
        summary = (
            f"{self.data_dir}: {self.segments} segments, {self.batches} batches, "
            f"{self.records} records"
        )
        return (
            [summary]
            + [damage.message() for damage in self.damage]
            + [f"{name}: temp file of an interrupted compaction or roll"
               for name in self.temp_files]
            + [f"{name}: merged into the segment before it by an interrupted compaction"
               for name in self.merge_leftovers]
            + ([f"{self.unfinished_roll}: empty segment of an interrupted roll"]
               if self.unfinished_roll is not None else [])
            + ([f"{self.legacy_segments} segment(s) without a header (an older format): "
                "given one when a coordinator next opens the log; until then a lost "
                "segment among them cannot be told"] if self.legacy_segments else [])
            + ["OK" if self.ok else f"{len(self.damage)} problem(s) found"]
        )


def check(data_dir: Path | str, file_layer: FileLayer | None = None) -> CheckReport:
    """Find every kind of damage `read_all` would repair or refuse; change nothing."""
    layer = file_layer if file_layer is not None else OsFileLayer()
    report = CheckReport(Path(data_dir))
    listing, chain = survey(layer, report.data_dir)
    report.temp_files = [str(path) for path in listing.temp_files]
    report.merge_leftovers = [str(segment.path) for segment in chain.merge_leftovers]
    if chain.unfinished_roll is not None:
        report.unfinished_roll = str(chain.unfinished_roll.path)
    report.legacy_segments = len(chain.legacy)
    for path in listing.misnamed:
        report.damage.append(
            Damage(str(path), None, "not a segment file name (20 digits + .log)", False)
        )
    for broken in chain.problems:
        report.damage.append(Damage(broken.file, broken.position, _reason(broken), False))
    links = chain.links
    previous_offset = -1
    for index, link in enumerate(links):
        segment = link.segment
        newest = index == len(links) - 1
        scan = SegmentScan(
            layer.read(segment.path),
            segment,
            previous_offset=previous_offset,
            next_segment_base=link.offset_limit,
            consecutive=newest,
            start=link.ends.batches_start,
            end=link.ends.batches_end,
        )
        report.segments += 1
        try:
            for header in scan.headers():
                scan.decode(header)
        except LogCorruptError as error:
            report.damage.append(Damage(error.file, error.position, _reason(error), False))
        else:
            problem = scan.frame_problem
            if problem is not None:
                following = scan.find_valid_batch_after_problem() if newest else None
                reason = problem.reason
                if not newest:
                    reason += " (in a segment that is not the newest)"
                elif following is not None:
                    reason += f" (followed by a valid batch at byte {following.position})"
                repairable = newest and following is None
                report.damage.append(
                    Damage(str(segment.path), problem.position, reason, repairable)
                )
        report.batches += scan.batch_count
        report.records += scan.record_count
        # Keep checking later segments from the highest offset seen so far.
        previous_offset = max(previous_offset, scan.last_offset)
    return report


def _reason(error: LogCorruptError) -> str:
    message = str(error)
    where = f" at byte {error.position}" if error.position is not None else ""
    prefix = f"{error.file}{where}: "
    return message[len(prefix) :] if message.startswith(prefix) else message
