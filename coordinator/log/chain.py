"""How the segments of a data directory fit together (sans-IO).

Every segment starts with a header naming its base offset (and whether it is the first
segment of the log); every closed segment ends with a trailer naming its end offset, the
base offset of the segment that follows it. So the files check one another: a segment
that is missing, emptied, cut short, renamed or out of place breaks the chain, and the
break names the file. A data directory written before segments had headers ("legacy"
segments, bare batches) still loads; the writer converts it when it opens it.

How a crash at any point leaves a chain that loads (the writer and compaction keep to
these orders):

- A new segment is written whole under a temporary name (header, fsync) and renamed into
  place, so a segment never exists without its header. Rolling creates the new segment
  first and only then writes the old one's trailer: a crash in between leaves an old
  segment without a trailer followed by a segment with nothing but its header, an
  *unfinished roll*, which start-up undoes by removing the empty segment (nothing in it
  was ever written, let alone acknowledged). The other order would leave a trailer naming
  a missing segment, which is what a deleted newest segment looks like.
- Compaction writes the merge of several adjacent closed segments under the first one's
  name (temp file, fsync, rename), then removes the others. A crash in between leaves
  segments whose whole range lies inside the merged one's: *merge leftovers*, whose
  records the merged segment already holds, removed at the next start-up or compaction.
- A legacy directory is converted newest segment first, so a crash mid-way leaves legacy
  segments followed by converted ones, never the other way round.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from crc32c import crc32c

from coordinator.log.errors import LogCorruptError
from coordinator.log.segments import Segment, segment_file_name

# The magics start with 0xff: read as a batch, that is a negative base offset, so a
# segment with a header is never taken for a legacy one, nor a trailer for a batch.
HEADER_MAGIC = b"\xffCCSEG\r\n"
TRAILER_MAGIC = b"\xffCCEND\r\n"
_HEADER = struct.Struct(">8sqB3xI")  # magic, base offset, flags, CRC-32C of what precedes
_TRAILER = struct.Struct(">8sqI")  # magic, end offset, CRC-32C of what precedes
HEADER_SIZE = _HEADER.size
TRAILER_SIZE = _TRAILER.size
_FIRST = 0x01  # flag: the first segment of the log


def encode_header(base_offset: int, *, first: bool) -> bytes:
    body = _HEADER.pack(HEADER_MAGIC, base_offset, _FIRST if first else 0, 0)[:-4]
    return body + struct.pack(">I", crc32c(body))


def encode_trailer(end_offset: int) -> bytes:
    body = _TRAILER.pack(TRAILER_MAGIC, end_offset, 0)[:-4]
    return body + struct.pack(">I", crc32c(body))


@dataclass(frozen=True)
class SegmentEnds:
    """What a segment's first and last bytes say about it."""

    segment: Segment
    size: int
    kind: str  # "chained" (has a header), "legacy" (bare batches), "empty", "bad header"
    header_base: int | None = None
    first: bool = False
    end_offset: int | None = None  # from the trailer; None without one

    @property
    def batches_start(self) -> int:
        return HEADER_SIZE if self.kind == "chained" else 0

    @property
    def batches_end(self) -> int:
        return self.size - TRAILER_SIZE if self.end_offset is not None else self.size

    @property
    def has_batches(self) -> bool:
        return self.batches_end > self.batches_start


def read_ends(segment: Segment, data: bytes) -> SegmentEnds:
    """Classify `data`, the bytes of `segment` (only its ends are read)."""
    size = len(data)
    if size == 0:
        return SegmentEnds(segment, 0, "empty")
    if bytes(data[: len(HEADER_MAGIC)]) != HEADER_MAGIC[: min(size, len(HEADER_MAGIC))]:
        return SegmentEnds(segment, size, "legacy")
    if size < HEADER_SIZE:
        return SegmentEnds(segment, size, "bad header")
    magic, base, flags, crc = _HEADER.unpack_from(data, 0)
    if crc32c(bytes(data[: HEADER_SIZE - 4])) != crc:
        return SegmentEnds(segment, size, "bad header")
    end_offset = None
    if size >= HEADER_SIZE + TRAILER_SIZE:
        tail = bytes(data[size - TRAILER_SIZE :])
        trailer_magic, end, trailer_crc = _TRAILER.unpack(tail)
        if trailer_magic == TRAILER_MAGIC and crc32c(tail[:-4]) == trailer_crc:
            end_offset = end
    return SegmentEnds(segment, size, "chained", base, bool(flags & _FIRST), end_offset)


@dataclass(frozen=True)
class ChainLink:
    """A segment of the chain and where its batches are."""

    ends: SegmentEnds
    # Every offset in the segment is below this: its trailer's end offset, or the next
    # segment's base offset for a legacy one; None for the newest segment.
    offset_limit: int | None

    @property
    def segment(self) -> Segment:
        return self.ends.segment


@dataclass
class Chain:
    links: list[ChainLink] = field(default_factory=list)
    # Segments whose records a merged segment holds (an interrupted compaction).
    merge_leftovers: list[Segment] = field(default_factory=list)
    # A newest segment with nothing but its header whose predecessor has no trailer.
    unfinished_roll: Segment | None = None
    problems: list[LogCorruptError] = field(default_factory=list)

    @property
    def legacy(self) -> list[ChainLink]:
        return [link for link in self.links if link.ends.kind != "chained"]

    def raise_first_problem(self) -> None:
        if self.problems:
            raise self.problems[0]


def _problem(segment: Segment | None, path: str, reason: str) -> LogCorruptError:
    file = str(segment.path) if segment is not None else path
    return LogCorruptError(f"{file}: {reason}", file=file, position=None)


def link_segments(all_ends: Sequence[SegmentEnds], *, live: bool = False) -> Chain:
    """Check that the segments (sorted by base offset) form one unbroken log.

    `live`: a writer is running, and the newest segment given may be one it is rolling
    away from (its trailer written, the next segment not among those given)."""
    chain = Chain()
    accepted: list[SegmentEnds] = []
    for ends in all_ends:
        segment = ends.segment
        if ends.kind == "bad header":
            chain.problems.append(_problem(segment, "", "the segment header is damaged"))
            continue
        if ends.kind == "chained" and ends.header_base != segment.base_offset:
            chain.problems.append(_problem(
                segment, "", f"holds the segment that starts at offset {ends.header_base}, "
                f"not {segment.base_offset} (renamed or moved?)"))
            continue
        previous = accepted[-1] if accepted else None
        if (ends.kind == "chained" and previous is not None and previous.kind == "chained"
                and previous.end_offset is not None
                and segment.base_offset < previous.end_offset):
            if (ends.end_offset is not None and ends.end_offset <= previous.end_offset
                    and not ends.first):
                chain.merge_leftovers.append(segment)
            else:
                chain.problems.append(_problem(
                    segment, "", f"overlaps {previous.segment.name}, which ends at offset "
                    f"{previous.end_offset}"))
            continue
        accepted.append(ends)

    # A newest segment with only its header after a segment without a trailer: a roll
    # that a crash (or a failed write) stopped half-way.
    if (not live and len(accepted) >= 2 and accepted[-1].kind == "chained"
            and not accepted[-1].has_batches and accepted[-1].end_offset is None
            and accepted[-2].kind == "chained" and accepted[-2].end_offset is None):
        chain.unfinished_roll = accepted.pop().segment

    seen_chained = False
    for index, ends in enumerate(accepted):
        segment = ends.segment
        newest = index == len(accepted) - 1
        following = accepted[index + 1] if not newest else None
        if ends.kind == "chained":
            if index == 0 and not ends.first:
                chain.problems.append(_problem(
                    segment, "", "is not the log's first segment, and none comes before "
                    "it: the older segments are missing"))
            elif index > 0 and ends.first:
                chain.problems.append(_problem(
                    segment, "", "is the log's first segment, yet older segments come "
                    "before it (out of place?)"))
            if ends.end_offset is None and following is not None:
                chain.problems.append(_problem(
                    segment, "", f"has no end mark although {following.segment.name} "
                    "follows it (cut short or emptied?)"))
            elif ends.end_offset is not None and following is None and not live:
                chain.problems.append(_problem(
                    None, str(segment.path.parent / segment_file_name(ends.end_offset)),
                    f"is missing: {segment.name} ends at offset {ends.end_offset} and no "
                    "segment follows it"))
            elif (ends.end_offset is not None and following is not None
                  and following.segment.base_offset != ends.end_offset):
                chain.problems.append(_problem(
                    None, str(segment.path.parent / segment_file_name(ends.end_offset)),
                    f"is missing: {segment.name} ends at offset {ends.end_offset}, the next "
                    f"segment is {following.segment.name}"))
            seen_chained = True
            limit = ends.end_offset if following is not None else None
        else:
            if seen_chained:
                # Conversion goes newest first, so a bare segment never follows a chained one.
                reason = ("is empty: its header is gone (emptied?)" if ends.kind == "empty"
                          else "has no segment header, yet older segments have one")
                chain.problems.append(_problem(segment, "", reason))
            elif ends.kind == "empty" and not newest:
                chain.problems.append(_problem(
                    segment, "", "is empty, yet newer segments follow it (emptied?)"))
            limit = following.segment.base_offset if following is not None else None
        chain.links.append(ChainLink(ends, limit))
    return chain
