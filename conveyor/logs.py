"""Log formats for conveyor's processes: plain text lines or one JSON object per line.

The worker logs one line per attempt outcome on the ``conveyor.worker`` logger, and a
handler's ``ctx.log`` writes to ``conveyor.job.<type>``. Those lines carry the job's
fields as attributes of the log record (``job_id``, ``job_type``, ``queue``,
``attempt``, ``worker``); the formatters here print them. An application that
configures logging itself can use :class:`TextFormatter` or :class:`JsonFormatter` on
its own handlers, or read the attributes in a formatter of its own.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import MutableMapping
from typing import IO, Any

# The record attributes a job's lines carry, in the order text lines print them.
FIELDS = ("job_id", "job_type", "queue", "attempt", "worker")


class TextFormatter(logging.Formatter):
    """``time level logger: message job_id=... job_type=... attempt=... worker=...``.

    One line per record; a traceback, when the record has one, follows on its own lines.
    """

    def format(self, record: logging.LogRecord) -> str:
        # Written out rather than through a format string: a worker formats a line per
        # job, and this is about half the cost of logging.Formatter's way.
        attrs = record.__dict__
        parts = [_utc(record.created), record.levelname, f"{record.name}:", record.getMessage()]
        for name in FIELDS:
            value = attrs.get(name)
            if value is not None:
                parts.append(f"{name}={value}")
        line = " ".join(parts)
        tb = attrs.get("traceback")
        if tb:
            line = f"{line}\n{tb.rstrip()}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the job's fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        attrs = record.__dict__
        for name in FIELDS:
            value = attrs.get(name)
            if value is not None:
                out[name] = value
        for name in ("outcome", "duration", "retry_at", "error", "traceback"):
            value = attrs.get(name)
            if value is not None:
                out[name] = value
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


_second: tuple[int, str] = (0, "")  # the last whole second formatted, and its text


def _utc(created: float) -> str:
    global _second
    whole, text = _second  # one tuple: threads never see a second with another's text
    if whole != int(created):
        whole = int(created)
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
        _second = (whole, text)
    return f"{text}.{int(created % 1 * 1000):03d}Z"


class JobLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger whose records carry one job's fields (what ``ctx.log`` returns)."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        extra = self.extra
        given = kwargs.get("extra")
        kwargs["extra"] = extra if given is None else {**(extra or {}), **given}
        return msg, kwargs


def configure(
    level: str | int = "INFO",
    format: str = "text",
    *,
    stream: IO[str] | None = None,
    rich: bool | None = None,
) -> None:
    """Send every log line to ``stream`` (stderr) in ``format``: ``text`` or ``json``.

    Text goes through rich's handler only on a terminal (``rich=None`` decides so);
    elsewhere each record is one plain, unwrapped line. Replaces the root logger's
    handlers, so call it once, at start-up, from a command (the CLI does).
    """
    if format not in ("text", "json"):
        raise ValueError(f"log format must be 'text' or 'json', not {format!r}")
    out = stream if stream is not None else sys.stderr
    handler: logging.Handler
    if format == "text" and (rich if rich is not None else _is_terminal(out)):
        from rich.console import Console
        from rich.logging import RichHandler

        handler = RichHandler(console=Console(file=out), show_path=False, rich_tracebacks=False)
        handler.setFormatter(_RichFields())
    else:
        handler = BufferedHandler(out)
        handler.setFormatter(JsonFormatter() if format == "json" else TextFormatter())
    # The formats print neither the caller's file and line nor its process: not looking
    # them up makes each record several microseconds cheaper (logging HOWTO, Optimization).
    logging._srcfile = None
    logging.logProcesses = False
    logging.logMultiprocessing = False
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        if isinstance(old, BufferedHandler):
            old.close()
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)


class BufferedHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Write records to a block-buffered copy of ``stream``, flushed within ``interval``.

    A worker logs a line per job: flushing after each (one write to the file or pipe per
    line, as a plain StreamHandler does) would cost more than a short job's run. Lines
    are flushed by a background thread at most ``interval`` seconds after they were
    written, at once for WARNING and above, and at exit.
    """

    def __init__(self, stream: IO[str], interval: float = 0.2) -> None:
        try:
            buffered: IO[str] = open(  # noqa: SIM115 - lives as long as the handler
                stream.fileno(),
                "w",
                buffering=1 << 16,
                encoding=getattr(stream, "encoding", None) or "utf-8",
                errors="backslashreplace",
                closefd=False,
            )
        except (AttributeError, OSError, ValueError):
            buffered = stream  # no file descriptor (a StringIO): write to it as it is
        else:
            stream.flush()  # what was written before keeps its place
        super().__init__(buffered)
        self._dirty = False
        self._stop = threading.Event()
        self._interval = interval
        threading.Thread(target=self._flush_every, name="conveyor-log-flush", daemon=True).start()

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)
        if record.levelno >= logging.WARNING:
            self._flush_now()

    def flush(self) -> None:
        # Called by emit after every record: only note that there is something to flush.
        self._dirty = True

    def _flush_now(self) -> None:
        self._dirty = False
        with self.lock:  # type: ignore[union-attr]
            try:
                self.stream.flush()
            except (OSError, ValueError):
                pass

    def _flush_every(self) -> None:
        while not self._stop.wait(self._interval):
            if self._dirty:
                self._flush_now()

    def close(self) -> None:
        self._stop.set()
        self._flush_now()
        super().close()


class _RichFields(logging.Formatter):
    """The message and the job's fields; rich prints the time and level itself."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        fields = " ".join(
            f"{name}={value}" for name in FIELDS if (value := record.__dict__.get(name)) is not None
        )
        tb = record.__dict__.get("traceback")
        line = f"{message} {fields}" if fields else message
        return f"{line}\n{tb.rstrip()}" if tb else line


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def job_fields(job_id: str, job_type: str, queue: str, attempt: int, worker: str) -> dict[str, Any]:
    """The record attributes of one attempt's lines (a new dict: add to it freely)."""
    return {
        "job_id": job_id,
        "job_type": job_type,
        "queue": queue,
        "attempt": attempt,
        "worker": worker,
    }


__all__ = [
    "FIELDS",
    "BufferedHandler",
    "JobLogger",
    "JsonFormatter",
    "TextFormatter",
    "configure",
    "job_fields",
]
