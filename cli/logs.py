"""Logging for `toolwire serve`: text for people, JSON lines for log pipelines.

A JSON line is one object: `time` (UTC, ISO 8601 with milliseconds), `level`, `event` (what
happened, a fixed phrase such as "call ended" or "connection opened"), `logger`, then the
record's fields: `chat_id`, `call_id`, `tool`, `outcome`, `wall_ms`, `rid`, `code`, `peer`,
`subprotocol`, ... where they apply. Records that concern a call carry `chat_id` and `call_id`
(passed as `extra=`), so one call's story is one filter away.

What is logged is chosen where it is logged (`actors/observe.py`, `transport/access_log.py`):
never a token, never args, file contents or command output.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        extras = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        line = f"{stamp} {record.levelname.lower():7} {record.name}: {record.getMessage()}"
        if extras:
            line += f" [{extras}]"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def iso_time(created: float) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{seconds}.{int(created % 1 * 1000):03d}Z"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": iso_time(record.created),
            "level": record.levelname.lower(),
            "event": record.getMessage(),
            "logger": record.name,
        }
        for key, value in _extras(record).items():
            entry.setdefault(key, value)  # a field never overwrites time, level or event
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        # One line per record, whatever the values hold (json escapes newlines).
        return json.dumps(entry, default=str, ensure_ascii=False)


def default_log_format(stream: TextIO) -> str:
    """Text for a person at a terminal; JSON for systemd's journal, a container runtime or a
    file, which feed log pipelines."""
    try:
        return "text" if stream.isatty() else "json"
    except (AttributeError, ValueError):
        return "json"


def setup_logging(fmt: str, level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # trio-websocket logs every frame at debug; keep it out of ours unless asked.
    logging.getLogger("trio-websocket").setLevel(max(level, logging.INFO))
