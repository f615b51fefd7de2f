"""Logging: structlog, JSON lines in production, readable output in a terminal.

Everything goes to stderr. Standard-library loggers (hypercorn, trio-parallel) are routed
through the same renderer so a JSON log stays one JSON object per line.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
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
