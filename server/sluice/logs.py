"""Logging to stderr as text, or as JSON lines shaped like envoyproxy/ratelimit's
``LOG_FORMAT=json`` (``@timestamp``, ``level``, ``@message``), so log pipelines built for
upstream keep parsing."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

__all__ = ["JsonFormatter", "configure"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Python's level names -> logrus's, which upstream writes.
_LEVELS = {"WARNING": "warning", "CRITICAL": "fatal"}


class JsonFormatter(logging.Formatter):
    def __init__(self, worker: int | None = None) -> None:
        super().__init__()
        self.worker = worker

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        line: dict[str, object] = {
            "@message": message,
            "@timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": _LEVELS.get(record.levelname, record.levelname.lower()),
            "logger": record.name,
        }
        if self.worker is not None:
            line["worker"] = self.worker
        return json.dumps(line, ensure_ascii=False)


def configure(*, level: str, log_format: str, worker: int | None = None) -> None:
    """Log to stderr at ``level`` (a Python level name) as ``text`` or ``json``; the lines of
    worker ``worker`` of ``--workers N`` say which worker wrote them. Every process of a
    server logs through here (the command, a worker, the app inside Envoy), so one setting
    shapes every line."""
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter(worker))
    elif worker is None:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    else:
        handler.setFormatter(
            logging.Formatter(TEXT_FORMAT.replace("%(name)s", f"worker {worker} %(name)s"))
        )
    logging.getLogger("alembic").setLevel(logging.WARNING)
    logging.basicConfig(level=level.upper(), handlers=[handler])
