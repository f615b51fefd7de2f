"""The rate limit of repeated log lines, on a fake clock."""

from __future__ import annotations

from typing import Any

from coordinator.logs import RateLimitedLog


class Recorder:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        def write(event: str, **fields: Any) -> None:
            self.lines.append((level, event, fields))
        return write


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limited(lines: int = 3, interval_s: float = 10.0) -> tuple[RateLimitedLog, Recorder, Clock]:
    recorder, clock = Recorder(), Clock()
    return RateLimitedLog(recorder, lines, interval_s, clock), recorder, clock


def test_lines_past_the_rate_are_counted_and_the_count_told_in_the_next_interval() -> None:
    log, recorder, clock = limited(lines=3)
    written = [log.warning("upstream_down", node=1) for _ in range(100)]
    assert written.count(True) == 3 and written[:3] == [True] * 3
    assert [fields for _, _, fields in recorder.lines] == [{"node": 1}] * 3
    clock.now += 9.9  # still the same interval
    assert not log.warning("upstream_down", node=1)
    clock.now += 0.1
    assert log.warning("upstream_down", node=1)
    assert recorder.lines[-1] == ("warning", "upstream_down", {"node": 1, "suppressed": 98})
    # The count was told once: the next line of the interval carries none.
    assert log.warning("upstream_down", node=1)
    assert "suppressed" not in recorder.lines[-1][2]


def test_events_and_keys_have_their_own_rate() -> None:
    log, recorder, _ = limited(lines=1)
    assert log.info("closed", key="a")
    assert log.info("closed", key="b")
    assert log.info("other")
    assert not log.info("closed", key="a")
    assert [event for _, event, _ in recorder.lines] == ["closed", "closed", "other"]


def test_a_traceback_only_on_the_first_line_of_an_interval() -> None:
    log, recorder, clock = limited(lines=3)
    for _ in range(3):
        log.error("record_write_failed", traceback=True, records=2)
    assert [("exc_info" in fields) for _, _, fields in recorder.lines] == [True, False, False]
    clock.now += 10
    log.error("record_write_failed", traceback=True, records=2)
    assert recorder.lines[-1][2].get("exc_info") is True


def test_many_keys_are_forgotten_oldest_first_not_kept_forever() -> None:
    from coordinator import logs

    log, recorder, _ = limited(lines=1)
    for key in range(logs.RATE_LIMIT_KEYS + 10):
        log.warning("refused", key=key)
    assert len(recorder.lines) == logs.RATE_LIMIT_KEYS + 10
    assert len(log._windows) == logs.RATE_LIMIT_KEYS
    assert log.warning("refused", key=0)  # forgotten: a fresh window
