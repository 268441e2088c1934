"""How vaecast's log lines look: `--log-level`, and `--log-format text|json`.

JSON is one object per line (`time`, `level`, `logger`, `message`, and `job_id` when
the line is about a job), the shape log collectors (Loki, Elasticsearch, CloudWatch)
parse without a pattern. A line is about a job when the logger was given
`extra={"job_id": ...}`, or when its message names one (`id=video_...`, `video
video_...`): most of vaecast's job lines name their job in the text already.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_JOB_ID = re.compile(r"\b(video_[0-9a-f]{24})\b")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
        }
        job_id = getattr(record, "job_id", None)
        if job_id is None:
            found = _JOB_ID.search(message)
            job_id = found.group(1) if found else None
        if job_id is not None:
            entry["job_id"] = job_id
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(level: str = "info", style: str = "text") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if style == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
