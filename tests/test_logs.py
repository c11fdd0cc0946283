"""core.logs.JsonFormatter: one JSON object a line, with every ``extra`` field, whatever its type."""

from __future__ import annotations

import json
import logging
import sys
import uuid
from datetime import UTC, datetime

from libs.common.core.logs import JsonFormatter


class _Opaque:
    def __str__(self) -> str:
        return "opaque"


def test_a_record_is_one_json_line_with_its_extra_fields() -> None:
    enrollment_id = uuid.uuid4()
    record = logging.LogRecord("libs.x", logging.INFO, __file__, 1, "step %s", ("queued",), None)
    record.__dict__.update(
        {
            "enrollment_id": enrollment_id,
            "lag_seconds": 0.25,
            "ids": ["a", "b"],
            "at": datetime(2026, 12, 6, 11, 0, tzinfo=UTC),
            "thing": _Opaque(),
        }
    )
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["level"] == "info" and entry["logger"] == "libs.x" and entry["message"] == "step queued"
    assert entry["enrollment_id"] == str(enrollment_id)
    assert entry["lag_seconds"] == 0.25 and entry["ids"] == ["a", "b"]
    assert entry["at"] == "2026-12-06T11:00:00Z"
    assert entry["thing"] == "opaque"  # what JSON cannot hold is written as its str()
    assert datetime.fromisoformat(entry["time"]).tzinfo is not None


def test_an_exception_is_written_in_the_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("libs.x", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
    entry = json.loads(JsonFormatter().format(record))
    assert "ValueError: boom" in entry["exception"]
