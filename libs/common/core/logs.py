"""Logging: one JSON object per line (``LOG_JSON=true``) or one readable line of text, each carrying the ids
passed in ``extra``.

Text reads ``12:46:31.372 INFO    followups.runner: services started services=ai_steps,release``: the time,
the level, the logger, the message, then ``key=value`` for every ``extra`` field (a value with a space is
quoted). ``followups dev`` logs text unless ``LOG_JSON`` says otherwise; the other commands log JSON.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import msgspec

from libs.common.core.settings import LogSettings

#: The attributes of every log record (not ``extra`` fields), and uvicorn's ``color_message`` (the message
#: again, with ANSI colours).
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "color_message",
}


def _extras(record: logging.LogRecord) -> Iterator[tuple[str, Any]]:
    for key, value in record.__dict__.items():
        if key not in _STANDARD and not key.startswith("_"):
            yield key, value


class JsonFormatter(logging.Formatter):
    """Formats a record as JSON: time, level, logger, message, then every ``extra`` field."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(_extras(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return _JSON.encode(entry).decode()


#: A log line's JSON, by msgspec: a line costs about a fifth less than with json.dumps (a release step
#: logs one at INFO); a value it cannot encode is written as its str().
_JSON = msgspec.json.Encoder(enc_hook=str)


def _text(value: Any) -> str:
    """A field's value as ``key=value`` shows it: lists joined by commas, quoted when it holds a space."""
    if isinstance(value, list | tuple | set | frozenset):
        shown = ",".join(str(item) for item in value)
    elif isinstance(value, dict):
        shown = json.dumps(value, default=str)
    else:
        shown = str(value)
    return json.dumps(shown) if not shown or any(c.isspace() or c in '"=' for c in shown) else shown


class TextFormatter(logging.Formatter):
    """One line for a terminal: local time, level, logger and message, then ``key=value`` per ``extra``."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created).strftime("%H:%M:%S.%f")[:-3]
        line = f"{when} {record.levelname:<7} {record.name}: {record.getMessage()}"
        extras = " ".join(f"{key}={_text(value)}" for key, value in _extras(record))
        if extras:
            line = f"{line} {extras}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(settings: LogSettings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if settings.json else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.level.upper())
    for noisy in ("pika", "httpx", "uvicorn.access", "pgserver"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
