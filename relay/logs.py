"""Log setup: text or JSON lines, each with a stable ``action`` field. Never payloads."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

# Attributes every LogRecord has; anything else was passed in ``extra`` and is kept.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class _DefaultAction(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "action"):
            record.action = "log"
        return True


class _PoolHiccups(logging.Filter):
    """SQLAlchemy's pool logs at ERROR, with a traceback, a connection that failed as it was
    handed back (its rollback found the server gone: killed, restarted, failed over), and
    discards it. Nothing was lost and the relay's own retries report the outage once, with
    their action: such a record becomes a warning of one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("sqlalchemy.pool") and record.levelno >= logging.ERROR:
            error = record.exc_info[1] if record.exc_info else None
            record.msg = f"{record.getMessage()}: connection discarded"
            if error is not None:
                record.msg += f" ({type(error).__name__}: {error})"
            record.args = None
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.action = "database_connection_discarded"
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "action": record.action,  # type: ignore[attr-defined]
            "message": record.getMessage(),
        }
        out.update({k: v for k, v in vars(record).items() if k not in _STANDARD and k not in out})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if level != "debug":
        handler.addFilter(_PoolHiccups())
    handler.addFilter(_DefaultAction())
    if fmt == "json":
        formatter: logging.Formatter = JsonFormatter()
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(action)s] %(message)s")
    formatter.converter = time.gmtime  # logs are in UTC
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # pika logs every connection hiccup at ERROR with tracebacks; the relay logs each one
    # once, with its action, so keep pika to warnings of its own.
    logging.getLogger("pika").setLevel(logging.CRITICAL if level != "debug" else logging.DEBUG)
