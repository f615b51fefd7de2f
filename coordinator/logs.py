"""Logging: structlog, JSON lines in production, readable output in a terminal.

Everything goes to stderr. Standard-library loggers (hypercorn, trio-parallel) are routed
through the same renderer so a JSON log stays one JSON object per line. Lines that an
outage repeats for every connection or request go through a :class:`RateLimitedLog`.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, MutableMapping
from typing import Any, TextIO

import structlog

LEVELS = ("debug", "info", "warning", "error", "critical")


def _shared_processors() -> list[Any]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]


def configure_logging(
    level: str = "info", json: bool | None = None, stream: TextIO | None = None
) -> None:
    """Configure structlog and stdlib logging once per process.

    `json=None` picks JSON when the stream is not a terminal. `stream` defaults to stderr.
    """
    level_name = level.lower()
    if level_name not in LEVELS:
        raise ValueError(f"unknown log level {level!r} (choose from {', '.join(LEVELS)})")
    numeric = logging.getLevelName(level_name.upper())
    output = stream if stream is not None else sys.stderr
    if json is None:
        json = not (hasattr(output, "isatty") and output.isatty())
    renderer: Any
    if json:
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer()
    shared = _shared_processors()
    exceptions: Any = structlog.processors.format_exc_info if json else _keep_exc_info
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            exceptions,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(output),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(output)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                exceptions,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # Library chatter (hypercorn's "Running on ...") only at warning and above.
    root.setLevel(max(numeric, logging.WARNING))


def _keep_exc_info(
    _logger: Any, _name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    # The console renderer prints tracebacks itself.
    return event


def get_logger(name: str, **context: Any) -> Any:
    return structlog.get_logger(name).bind(**context) if context else structlog.get_logger(name)


# What a repeated line may cost: this many lines per event (and key) and interval, then
# one line, once the interval is over, that tells how many were left out.
RATE_LIMIT_LINES = 5
RATE_LIMIT_INTERVAL_S = 10.0
# Keys remembered per limiter; past it the oldest windows are forgotten (their count of
# lines left out with them): a key per client address must not grow without bound.
RATE_LIMIT_KEYS = 1_024


class _Window:
    __slots__ = ("started", "lines", "suppressed")

    def __init__(self, started: float) -> None:
        self.started = started
        self.lines = 0
        self.suppressed = 0


class RateLimitedLog:
    """Structured log lines limited per event name (and key): at most `lines` in an
    `interval_s`; the ones after that are counted, not written, and the first line of a
    later interval carries that count as `suppressed`. A line that is to carry a
    traceback (`traceback=True`) carries it only when it is the first of its interval.

    An outage seen by every connection (an upstream broker down, a disk that refuses
    writes) then writes a few lines every interval, not one per connection or request.
    """

    def __init__(self, logger: Any, lines: int = RATE_LIMIT_LINES,
                 interval_s: float = RATE_LIMIT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.lines = lines
        self.interval_s = interval_s
        self.clock = clock
        self._windows: OrderedDict[tuple[str, object], _Window] = OrderedDict()

    def _admit(self, event: str, key: object) -> tuple[int, bool] | None:
        """(lines left out before this one, first of its interval), or None: leave out."""
        now = self.clock()
        windows = self._windows
        window = windows.get((event, key))
        if window is None:
            window = windows[(event, key)] = _Window(now)
            if len(windows) > RATE_LIMIT_KEYS:
                windows.popitem(last=False)
        elif now - window.started >= self.interval_s:
            window.started, window.lines = now, 0
        if window.lines >= self.lines:
            window.suppressed += 1
            return None
        window.lines += 1
        suppressed, window.suppressed = window.suppressed, 0
        return suppressed, window.lines == 1

    def log(self, level: str, event: str, key: object = None, traceback: bool = False,
            **fields: Any) -> bool:
        """Write the line unless its event (and key) is over its rate; whether written."""
        admitted = self._admit(event, key)
        if admitted is None:
            return False
        suppressed, first = admitted
        if suppressed:
            fields["suppressed"] = suppressed
        if traceback and first:
            fields["exc_info"] = True
        getattr(self.logger, level)(event, **fields)
        return True

    def info(self, event: str, key: object = None, **fields: Any) -> bool:
        return self.log("info", event, key, **fields)

    def warning(self, event: str, key: object = None, **fields: Any) -> bool:
        return self.log("warning", event, key, **fields)

    def error(self, event: str, key: object = None, traceback: bool = False,
              **fields: Any) -> bool:
        return self.log("error", event, key, traceback, **fields)
