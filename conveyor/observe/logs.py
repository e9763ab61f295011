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
from collections.abc import Mapping, MutableMapping, Sequence
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conveyor.core.model import Job

# The record attributes a job's lines carry, in the order text lines print them.
FIELDS = ("job_id", "job_type", "queue", "attempt", "worker")


class TextFormatter(logging.Formatter):
    """``time level logger: message job_id=... job_type=... attempt=... worker=...``.

    One line per record; a traceback, when the record has one, follows on its own lines.
    """

    def format(self, record: logging.LogRecord) -> str:
        line = self.line(
            record.created, record.levelname, record.name, record.getMessage(), record.__dict__
        )
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line

    @staticmethod
    def line(created: float, level: str, name: str, message: str, attrs: Mapping[str, Any]) -> str:
        """The line of a record with these attributes (``attrs``: the job's fields)."""
        # Written out rather than through a format string: a worker formats a line per
        # job, and this is a fraction of the cost of logging.Formatter's way.
        get = attrs.get
        job, type, queue = get("job_id"), get("job_type"), get("queue")
        attempt, worker = get("attempt"), get("worker")
        if job and type and queue and attempt and worker:  # a job's line, all fields set
            line = (
                f"{_utc(created)} {level} {name}: {message} job_id={job} job_type={type} "
                f"queue={queue} attempt={attempt} worker={worker}"
            )
        else:
            line = " ".join(
                [
                    f"{_utc(created)} {level} {name}: {message}",
                    *(f"{field}={value}" for field in FIELDS if (value := get(field)) is not None),
                ]
            )
        tb = get("traceback")
        return f"{line}\n{tb.rstrip()}" if tb else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the job's fields."""

    def format(self, record: logging.LogRecord) -> str:
        traceback = self.formatException(record.exc_info) if record.exc_info else None
        return self.line(
            record.created,
            record.levelname,
            record.name,
            record.getMessage(),
            record.__dict__,
            traceback,
        )

    @staticmethod
    def line(
        created: float,
        level: str,
        name: str,
        message: str,
        attrs: Mapping[str, Any],
        traceback: str | None = None,
    ) -> str:
        """The line of a record with these attributes (``attrs``: the job's fields)."""
        out: dict[str, Any] = {
            "time": _utc(created),
            "level": level,
            "logger": name,
            "message": message,
        }
        for field in _JSON_FIELDS:
            value = attrs.get(field)
            if value is not None:
                out[field] = value
        if traceback is not None:
            out["traceback"] = traceback
        return json.dumps(out, default=str)


# The attributes JSON lines carry, when set: the job's fields, then the outcome's.
_JSON_FIELDS = (*FIELDS, "outcome", "duration", "retry_at", "error", "traceback")


_last: tuple[int, str] = (0, "")  # the last millisecond formatted, and its text


def _utc(created: float) -> str:
    """``2026-11-23T18:46:48.628Z``: UTC to the millisecond (a batch of lines shares one)."""
    global _last
    ms, text = _last  # one tuple: threads never see a millisecond with another's text
    if ms != int(created * 1000):
        ms = int(created * 1000)
        whole, part = divmod(ms, 1000)
        text = f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(whole))}.{part:03d}Z"
        _last = (ms, text)
    return text


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
        # StreamHandler.emit, less its flush after every record.
        try:
            self.stream.write(self.format(record) + "\n")
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)
            return
        if record.levelno >= logging.WARNING:
            self._flush_now()
        else:
            self._dirty = True

    def flush(self) -> None:
        # Called by logging.shutdown and by anyone who wants the lines out now.
        self._flush_now()

    def write_lines(
        self, name: str, level: int, lines: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> None:
        """Write the lines ``getLogger(name).log(level, message, extra=fields)`` would.

        ``lines``: (message, fields) pairs, written at once with one time. For a caller
        that :func:`direct_handler` sent here: no record is made, and nothing but this
        handler would have seen one.
        """
        formatter = self.formatter
        try:
            if not isinstance(formatter, TextFormatter | JsonFormatter):
                raise TypeError(f"no direct lines with {formatter!r}")
            created, level_name = time.time(), logging.getLevelName(level)
            text = "".join(
                [f"{formatter.line(created, level_name, name, m, f)}\n" for m, f in lines]
            )
            self._write_text(text, level)
        except Exception:  # what logging would do with the records: report, carry on
            for message, _ in lines:
                self.handleError(
                    logging.makeLogRecord({"name": name, "levelno": level, "msg": message})
                )

    def job_lines(self, name: str, level: int, worker: str) -> JobLines:
        """Lines about jobs to write at once, as ``getLogger(name).log(level, ...)`` would.

        For a caller that :func:`direct_handler` sent here: see :class:`JobLines`.
        """
        return JobLines(self, name, level, worker)

    def _write_text(self, text: str, level: int) -> None:
        with self.lock:  # type: ignore[union-attr]
            self.stream.write(text)
        if level >= logging.WARNING:
            self._flush_now()
        else:
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


class JobLines:
    """A batch of one worker's lines about jobs, one logger and level, written at once.

    What a worker logs per attempt outcome, made as cheaply as it can be: no record, no
    dict of fields, one time for the whole batch; in text, each line is one format
    string from the job's fields. The lines are exactly those that
    ``logger.log(level, message, extra=fields)`` would write through the handler (the
    job's fields, ``outcome``, ``duration`` and ``retry_at``, which JSON lines carry).
    """

    __slots__ = (
        "_created",
        "_handler",
        "_head",
        "_level",
        "_name",
        "_parts",
        "_tail",
        "_text",
        "_worker",
    )

    def __init__(self, handler: BufferedHandler, name: str, level: int, worker: str) -> None:
        formatter = handler.formatter
        if type(formatter) not in (TextFormatter, JsonFormatter):
            raise TypeError(f"no direct lines with {formatter!r}")
        self._handler, self._name, self._level, self._worker = handler, name, level, worker
        self._created = time.time()
        self._text = type(formatter) is TextFormatter
        # A text line is head, message, the job's fields, tail: all but the middle are
        # the same for every line of the batch.
        self._head = f"{_utc(self._created)} {logging.getLevelName(level)} {name}: "
        self._tail = f" worker={worker}\n"
        self._parts: list[str] = []

    def add(
        self,
        message: str,
        job: Job,
        outcome: str | None = None,
        duration: float | None = None,
        retry_at: datetime | None = None,
    ) -> None:
        """Add the line of ``message`` about ``job`` (its attempt's outcome, run time...)."""
        if self._text:
            # TextFormatter.line's, for a job's line with every field set.
            self._parts.append(
                f"{self._head}{message} job_id={job.id} job_type={job.type} "
                f"queue={job.queue} attempt={job.attempt}{self._tail}"
            )
            return
        fields: dict[str, Any] = {
            "job_id": job.id,
            "job_type": job.type,
            "queue": job.queue,
            "attempt": job.attempt,
            "worker": self._worker,
            "outcome": outcome,
            "duration": None if duration is None else round(duration, 6),
            "retry_at": None if retry_at is None else retry_at.isoformat(),
        }
        level = logging.getLevelName(self._level)
        line = JsonFormatter.line(self._created, level, self._name, message, fields)
        self._parts.append(f"{line}\n")

    def __len__(self) -> int:
        return len(self._parts)

    def write(self) -> None:
        """Write the lines added since the last write (in one call to the stream)."""
        if not self._parts:
            return
        text, self._parts = "".join(self._parts), []
        try:
            self._handler._write_text(text, self._level)
        except Exception:  # what logging would do with the records: report, carry on
            self._handler.handleError(
                logging.makeLogRecord({"name": self._name, "levelno": self._level, "msg": text})
            )


def direct_handler(logger: logging.Logger, level: int) -> BufferedHandler | None:
    """The handler to write ``logger``'s lines at ``level`` to directly, when that is the same.

    A worker logs a line per job; a log record and its way through the loggers cost
    several times what formatting the line does. When the one handler such a record
    would reach is conveyor's own (:func:`configure`'s, with its formatter), no logger
    on the way nor the handler has a filter, and records come from logging's own
    factory, writing the line to it (:meth:`BufferedHandler.write_lines`) is the same
    as logging it. Otherwise (an application's handlers, pytest's caplog): None.
    The caller checks ``logger.isEnabledFor(level)``, and asks again now and then
    (the worker: once per batch of results) so that a change of configuration counts.
    """
    if logging.getLogRecordFactory() is not logging.LogRecord:
        return None
    found: logging.Handler | None = None
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters or current.disabled:
            return None
        for handler in current.handlers:
            if level >= handler.level:
                if found is not None:
                    return None
                found = handler
        current = current.parent if current.propagate else None
    if (
        type(found) is BufferedHandler
        and not found.filters
        and type(found.formatter) in (TextFormatter, JsonFormatter)
    ):
        return found
    return None


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
    "JobLines",
    "JobLogger",
    "JsonFormatter",
    "TextFormatter",
    "configure",
    "direct_handler",
    "job_fields",
]
