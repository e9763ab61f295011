"""The worker's log lines: one per attempt outcome, each carrying the job's fields."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from conveyor import Conveyor, JobContext, Retry, Status
from conveyor.observe.logs import JsonFormatter, TextFormatter, configure, direct_handler
from tests.helpers import running_worker, settled

FIELDS = ("job_id", "job_type", "queue", "attempt", "worker")


@pytest.fixture
def root_logger() -> Iterator[None]:
    """Put the root logger's handlers and level back after a test that configures it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def lines_of(caplog: pytest.LogCaptureFixture, job_id: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "job_id", None) == job_id]


async def test_success_is_one_info_line_with_the_duration(
    app: Conveyor, caplog: pytest.LogCaptureFixture
) -> None:
    @app.job()
    async def add(ctx: JobContext, a: int) -> int:
        return a + 1

    caplog.set_level(logging.DEBUG, logger="conveyor")
    job = await add.submit(a=1)
    async with running_worker(app) as worker:
        await settled(job, Status.SUCCEEDED)
    records = lines_of(caplog, job.id)
    assert [(r.levelname, r.getMessage().split(" in ")[0]) for r in records] == [
        ("DEBUG", "job started (attempt 1/3)"),
        ("INFO", "job succeeded"),
    ]
    done = records[1]
    assert done.getMessage().endswith("s") and done.duration >= 0  # type: ignore[attr-defined]
    for record in records:
        assert (record.job_type, record.queue, record.attempt, record.worker) == (  # type: ignore[attr-defined]
            "add",
            "default",
            1,
            worker.id,
        )


async def test_a_retried_failure_says_attempt_n_of_max_and_when_it_retries(
    app: Conveyor, caplog: pytest.LogCaptureFixture
) -> None:
    @app.job(max_attempts=2, backoff=("10ms", "10ms"))
    async def flaky(ctx: JobContext) -> None:
        raise ValueError(f"boom {ctx.attempt}")

    caplog.set_level(logging.INFO, logger="conveyor")
    job = await flaky.submit()
    async with running_worker(app):
        await settled(job, Status.FAILED)
    first, last = lines_of(caplog, job.id)
    assert first.levelname == "INFO"
    assert first.getMessage().startswith("job failed (attempt 1/2) after ")
    assert "ValueError: boom 1; retry at 20" in first.getMessage()
    assert first.retry_at and first.attempt == 1  # type: ignore[attr-defined]
    assert last.levelname == "ERROR"
    assert "(attempt 2/2, no retry left)" in last.getMessage()
    assert "ValueError: boom 2" in last.getMessage()
    assert "Traceback" in last.traceback and 'raise ValueError(f"boom' in last.traceback  # type: ignore[attr-defined]
    text = TextFormatter().format(last)
    assert text.splitlines()[0].endswith(f"worker={last.worker}")  # type: ignore[attr-defined]
    assert "Traceback (most recent call last)" in text


async def test_retry_cancel_and_timeout_lines(
    app: Conveyor, caplog: pytest.LogCaptureFixture
) -> None:
    @app.job(max_attempts=2)
    async def later(ctx: JobContext) -> str:
        if ctx.attempt == 1:
            raise Retry(after=0.01, reason="not yet")
        return "ok"

    @app.job()
    async def stopper(ctx: JobContext) -> None:
        from conveyor import Cancel

        raise Cancel("no longer needed")

    @app.job(max_attempts=1, timeout="50ms")
    async def slow(ctx: JobContext) -> None:
        import asyncio

        await asyncio.sleep(10)

    caplog.set_level(logging.INFO, logger="conveyor")
    a, b, c = await later.submit(), await stopper.submit(), await slow.submit()
    async with running_worker(app):
        await settled(a, Status.SUCCEEDED)
        await settled(b, Status.CANCELLED)
        await settled(c, Status.FAILED)
    retried, succeeded = (r.getMessage() for r in lines_of(caplog, a.id))
    assert "failed (attempt 1/2)" in retried and "retry requested: not yet" in retried
    assert succeeded.startswith("job succeeded")
    (cancelled,) = lines_of(caplog, b.id)
    assert cancelled.getMessage().startswith("job cancelled after ")
    assert cancelled.getMessage().endswith("no longer needed")
    (timed_out,) = lines_of(caplog, c.id)
    assert timed_out.getMessage().startswith("job timed out (attempt 1/1, no retry left)")


async def test_a_lost_lease_is_one_warning(app: Conveyor, caplog: pytest.LogCaptureFixture) -> None:
    import asyncio

    started = asyncio.Event()

    @app.job(max_attempts=1)
    async def long(ctx: JobContext) -> None:
        started.set()
        await asyncio.sleep(30)

    caplog.set_level(logging.INFO, logger="conveyor")
    job = await long.submit()
    async with running_worker(app) as worker:
        await started.wait()
        (run,) = worker.held()
        worker._on_lost([run])  # what the heartbeat does when the lease is gone
    (lost,) = lines_of(caplog, job.id)
    assert lost.levelname == "WARNING"
    assert lost.getMessage().startswith("job lease lost; its result is dropped")


async def test_ctx_log_lines_carry_the_job_fields(
    app: Conveyor, caplog: pytest.LogCaptureFixture
) -> None:
    @app.job()
    def report(ctx: JobContext) -> None:
        ctx.log.info("hello from %s", "the handler")

    caplog.set_level(logging.INFO, logger="conveyor")
    job = await report.submit()
    async with running_worker(app) as worker:
        await settled(job, Status.SUCCEEDED)
    (line,) = [r for r in lines_of(caplog, job.id) if r.name == "conveyor.job.report"]
    assert line.getMessage() == "hello from the handler"
    assert (line.job_type, line.attempt, line.worker) == ("report", 1, worker.id)  # type: ignore[attr-defined]


@pytest.mark.usefixtures("root_logger")
def test_json_lines_are_one_object_each_with_the_fields() -> None:
    stream = io.StringIO()
    configure("INFO", "json", stream=stream)
    logger = logging.getLogger("conveyor.worker")
    logger.info(
        "job succeeded in %.3fs",
        0.5,
        extra={"job_id": "j1", "job_type": "t", "queue": "q", "attempt": 2, "worker": "w"},
    )
    logger.error("boom\nsecond line", extra={"job_id": "j2", "traceback": "Traceback\n  x"})
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert {k: first[k] for k in FIELDS} == {
        "job_id": "j1",
        "job_type": "t",
        "queue": "q",
        "attempt": 2,
        "worker": "w",
    }
    assert first["message"] == "job succeeded in 0.500s" and first["level"] == "INFO"
    assert second["traceback"] == "Traceback\n  x" and second["message"] == "boom\nsecond line"


@pytest.mark.usefixtures("root_logger")
def test_text_off_a_terminal_is_plain_single_lines() -> None:
    stream = io.StringIO()
    configure("INFO", "text", stream=stream)
    long_message = "x" * 300
    logging.getLogger("conveyor.worker").info(long_message, extra={"job_id": "j1"})
    (line,) = stream.getvalue().splitlines()
    assert line.endswith(f"INFO conveyor.worker: {long_message} job_id=j1")
    assert isinstance(logging.getLogger().handlers[0].formatter, TextFormatter)
    assert not isinstance(JsonFormatter(), TextFormatter)


# --- the worker's direct way to the log (logs.direct_handler) ---------------------------


def _without_time(line: str) -> str:
    """A text line from its level on, or a JSON line without its time."""
    if line.startswith("{"):
        return json.dumps({k: v for k, v in json.loads(line).items() if k != "time"})
    return line.split(" ", 1)[1]


@pytest.mark.usefixtures("root_logger")
@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_line_written_directly_is_the_line_logging_writes(log_format: str) -> None:
    stream = io.StringIO()
    configure("INFO", log_format, stream=stream)
    logger = logging.getLogger("conveyor.worker")
    fields = {
        "job_id": "j1",
        "job_type": "t",
        "queue": "q",
        "attempt": 2,
        "worker": "w",
        "outcome": "succeeded",
        "duration": 0.25,
    }
    direct = direct_handler(logger, logging.INFO)
    assert direct is not None
    logger.info("job succeeded in 0.250s", extra=fields)
    # A line missing some fields takes the formatter's general way: the same there too.
    partial = {"job_id": "j2", "attempt": 1}
    logger.info("partial", extra=partial)
    direct.write_lines(
        logger.name, logging.INFO, [("job succeeded in 0.250s", fields), ("partial", partial)]
    )
    logged, logged_partial, written, written_partial = stream.getvalue().splitlines()
    assert _without_time(logged) == _without_time(written)
    assert _without_time(logged_partial) == _without_time(written_partial)
    assert "job_id=j1 job_type=t queue=q attempt=2 worker=w" in logged or '"job_id": "j1"' in logged


@pytest.mark.usefixtures("root_logger")
@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_job_line_written_directly_is_the_line_logging_writes(log_format: str) -> None:
    from datetime import UTC, datetime

    from conveyor.core.model import Job, Outcome

    stream = io.StringIO()
    configure("INFO", log_format, stream=stream)
    logger = logging.getLogger("conveyor.worker")
    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    job = Job(
        id="01JD", type="t", queue="q", payload={}, status=Status.RUNNING, priority=0,
        attempt=2, max_attempts=3, run_at=now, created_at=now,
    )  # fmt: skip
    fields = {"job_id": "01JD", "job_type": "t", "queue": "q", "attempt": 2, "worker": "w"}
    retry = {"outcome": Outcome.FAILED, "duration": 0.1235, "retry_at": now.isoformat()}
    succeeded = {"outcome": Outcome.SUCCEEDED, "duration": 0.25}
    logger.info("job succeeded in 0.250s", extra={**fields, **succeeded})
    logger.info("job failed; retry", extra={**fields, **retry})
    direct = direct_handler(logger, logging.INFO)
    assert direct is not None
    lines = direct.job_lines(logger.name, logging.INFO, "w")
    lines.add("job succeeded in 0.250s", job, Outcome.SUCCEEDED, 0.25)
    lines.add("job failed; retry", job, Outcome.FAILED, 0.12350004, now)
    assert len(lines) == 2
    lines.write()
    lines.write()  # nothing more: written once
    logged, logged_retry, written, written_retry = stream.getvalue().splitlines()
    assert _without_time(logged) == _without_time(written)
    assert _without_time(logged_retry) == _without_time(written_retry)
    assert written.endswith("job_id=01JD job_type=t queue=q attempt=2 worker=w") or (
        json.loads(written_retry)["retry_at"] == now.isoformat()
    )


@pytest.mark.usefixtures("root_logger")
def test_lines_go_through_logging_when_anything_else_would_see_them() -> None:
    configure("INFO", "text", stream=io.StringIO())
    logger = logging.getLogger("conveyor.worker")
    root = logging.getLogger()
    assert direct_handler(logger, logging.INFO) is root.handlers[0]
    # A second handler (pytest's caplog, an application's file handler)...
    extra = logging.StreamHandler(io.StringIO())
    root.addHandler(extra)
    assert direct_handler(logger, logging.INFO) is None
    root.removeHandler(extra)
    # ...a filter on a logger on the way or on the handler, or another formatter...
    only_errors = logging.Filter("nothing")
    logger.addFilter(only_errors)
    assert direct_handler(logger, logging.INFO) is None
    logger.removeFilter(only_errors)
    root.handlers[0].addFilter(only_errors)
    assert direct_handler(logger, logging.INFO) is None
    root.handlers[0].removeFilter(only_errors)
    formatter = root.handlers[0].formatter
    root.handlers[0].setFormatter(logging.Formatter("%(message)s"))
    assert direct_handler(logger, logging.INFO) is None
    root.handlers[0].setFormatter(formatter)
    # ...or an application's record factory: each means a real record.
    factory = logging.getLogRecordFactory()
    logging.setLogRecordFactory(lambda *a, **k: factory(*a, **k))
    try:
        assert direct_handler(logger, logging.INFO) is None
    finally:
        logging.setLogRecordFactory(factory)
    assert direct_handler(logger, logging.INFO) is root.handlers[0]


@pytest.mark.usefixtures("root_logger")
async def test_the_worker_writes_its_outcome_lines_to_the_configured_stream(
    app: Conveyor,
) -> None:
    @app.job()
    async def quick(ctx: JobContext) -> None:
        pass

    stream = io.StringIO()
    configure("INFO", "text", stream=stream)
    job = await quick.submit()
    async with running_worker(app):
        await settled(job, Status.SUCCEEDED)
    (line,) = (x for x in stream.getvalue().splitlines() if f"job_id={job.id}" in x)
    assert " INFO conveyor.worker: job succeeded in " in line
    assert f"job_type={job.type} queue=default attempt=1 worker=" in line


@pytest.mark.parametrize("ending", ["return", "raise"])
def test_buffered_lines_all_reach_a_pipe_when_the_process_ends(ending: str) -> None:
    import subprocess
    import sys

    script = (
        "import logging\n"
        "from conveyor.logs import configure\n"
        "configure('INFO', 'text')\n"
        "for n in range(2000):\n"
        "    logging.getLogger('conveyor.worker').info('line %d', n)\n"
        + ("raise SystemExit(0)\n" if ending == "return" else "raise RuntimeError('crash')\n")
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    lines = [x for x in done.stderr.splitlines() if "conveyor.worker: line " in x]
    assert len(lines) == 2000 and lines[-1].endswith("line 1999")
    if ending == "raise":
        assert "RuntimeError: crash" in done.stderr
