"""Running a handler in a child process (``@app.job(isolation="process")``).

The child is a fresh interpreter (the ``spawn`` start method: forking a process that
runs threads and an event loop is unsafe). It imports the handler's module, runs the
handler with a context whose progress, checkpoints and cancellation travel over a pipe,
and sends back the result or the error. The parent can therefore terminate a handler
that is hung, or that ignores cancellation, and survives one that crashes: a segfault,
``os._exit`` or running out of memory only ends the attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from conveyor.app import blocking
from conveyor.app.registry import importable_name
from conveyor.core.model import JSON, Job, Progress
from conveyor.errors import ConfigurationError, ConveyorError
from conveyor.worker.context import Cancel, JobContext, JobPort, Retry

if TYPE_CHECKING:
    import multiprocessing.process
    from multiprocessing.connection import Connection

    from conveyor.app.handles import JobHandle, Submission
    from conveyor.app.registry import JobType

_PROGRESS_INTERVAL = 0.2  # the child sends progress to the parent at most this often


class ChildFailed(ConveyorError):
    """The handler raised in the child process, or the child died."""

    def __init__(self, message: str, tb: str | None = None, *, final: bool = False) -> None:
        super().__init__(message)
        self.traceback = tb
        self.final = final


async def run_in_child(
    job_type: JobType,
    job: Job,
    port: JobPort,
    *,
    cancel_grace: float,
    on_started: Callable[[], None] | None = None,
) -> JSON:
    """Run the handler of ``job`` in a child process; raise what it raised.

    ``on_started`` is called when the child has imported the handler and is about to
    call it: the worker starts the job's time limit then, so that a slow start of the
    interpreter on a busy machine is not charged to the handler.

    Cancelling the calling task sends a cancel request to the child, waits up to
    ``cancel_grace`` seconds for it to stop, then terminates it (SIGTERM) and, after a
    further grace, kills it (SIGKILL).
    """
    process, parent_end, child_end = _child_process(job_type, job)
    loop = asyncio.get_running_loop()
    outcome: asyncio.Future[tuple[str, Any]] = loop.create_future()
    pending: set[asyncio.Task[None]] = set()

    async def checkpoint(seq: int, state: JSON) -> None:
        try:
            ok = await port.save_state(state)
        except Exception:
            ok = False
        with contextlib.suppress(OSError):
            parent_end.send(("checkpoint_done", seq, ok))

    def readable() -> None:
        while True:
            try:
                if not parent_end.poll():
                    return
                message = parent_end.recv()
            except (EOFError, OSError):
                loop.remove_reader(parent_end.fileno())
                if not outcome.done():
                    outcome.set_result(("died", None))
                return
            kind = message[0]
            if kind == "started":
                if on_started is not None:
                    on_started()
            elif kind == "progress":
                port.report_progress(message[1])
            elif kind == "checkpoint":
                task = loop.create_task(checkpoint(message[1], message[2]))
                pending.add(task)
                task.add_done_callback(pending.discard)
            elif not outcome.done():
                outcome.set_result((kind, message[1:]))

    await loop.run_in_executor(None, process.start)
    child_end.close()
    loop.add_reader(parent_end.fileno(), readable)
    try:
        kind, detail = await asyncio.shield(outcome)
    except asyncio.CancelledError:
        with contextlib.suppress(OSError):
            parent_end.send(("cancel",))
        await _stop(process, outcome, cancel_grace)
        raise
    finally:
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(parent_end.fileno())
        if process.is_alive():
            await _stop(process, outcome, 0.0)
        await loop.run_in_executor(None, process.join, 5)
        parent_end.close()
    return _outcome(kind, detail, process.exitcode)


def _child_process(
    job_type: JobType, job: Job
) -> tuple[multiprocessing.process.BaseProcess, Connection, Connection]:
    """A child process (not started yet) to run ``job``, and the two ends of its pipe."""
    import multiprocessing  # here: only process-isolated job types need it

    module, qualname = importable_name(job_type.fn, job_type.name)
    mp = multiprocessing.get_context("spawn")
    parent_end, child_end = mp.Pipe()
    process = mp.Process(
        target=_child_main,
        args=(module, qualname, job, child_end),
        name=f"conveyor-job-{job.id}",
        daemon=True,
    )
    return process, parent_end, child_end


def _outcome(kind: str, detail: Any, exitcode: int | None) -> JSON:
    """The handler's result as the child reported it, or what it raised, raised again."""
    if kind == "result":
        result: JSON = detail[0]
        return result
    if kind == "retry":
        raise Retry(after=detail[0], reason=detail[1])
    if kind == "cancel":
        raise Cancel(detail[0])
    if kind == "error":
        raise ChildFailed(detail[0], detail[1], final=detail[2])
    raise ChildFailed(f"the job's child process died ({_describe_exit(exitcode)})")


async def _stop(
    process: multiprocessing.process.BaseProcess,
    outcome: asyncio.Future[tuple[str, Any]],
    grace: float,
) -> None:
    """Let the child end within ``grace``, then SIGTERM it, then SIGKILL it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    while process.is_alive() and loop.time() < deadline and not outcome.done():
        await asyncio.sleep(0.02)
    for stop, wait in ((process.terminate, 1.0), (process.kill, 5.0)):
        if not process.is_alive():
            return
        stop()
        await loop.run_in_executor(None, process.join, wait)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


# -- the child side ------------------------------------------------------------------------


class _ChildPort:
    """The child's end of the pipe, as a JobPort."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self.replies: queue.Queue[tuple[int, bool]] = queue.Queue()
        self.sequence = 0
        self.last_progress = 0.0
        self.unsent: Progress | None = None

    def send(self, message: tuple[Any, ...]) -> None:
        with self.lock:
            self.conn.send(message)

    def report_progress(self, progress: Progress) -> None:
        now = time.monotonic()
        if now - self.last_progress < _PROGRESS_INTERVAL:
            self.unsent = progress
            return
        self.last_progress = now
        self.unsent = None
        self.send(("progress", progress))

    def flush(self) -> None:
        if self.unsent is not None:
            self.send(("progress", self.unsent))
            self.unsent = None

    async def save_state(self, state: JSON) -> bool:
        self.sequence += 1
        self.send(("checkpoint", self.sequence, state))
        while True:
            seq, ok = await asyncio.get_running_loop().run_in_executor(None, self.replies.get)
            if seq == self.sequence:
                return ok

    async def spawn(
        self,
        submissions: Sequence[Submission],
        callbacks: Mapping[str, Submission] | None = None,
    ) -> list[JobHandle] | None:
        raise ConfigurationError("ctx.spawn is not available to process-isolated handlers")

    async def dependency_results(self) -> dict[str, JSON]:
        raise ConfigurationError(
            "ctx.dependency_results is not available to process-isolated handlers"
        )


def _child_main(module: str, qualname: str, job: Job, conn: Connection) -> None:
    """Entry point of the child process."""
    # The worker's terminal may send SIGINT to the whole process group; the parent decides.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    port = _ChildPort(conn)
    try:
        target: Any = importlib.import_module(module)
        for part in qualname.split("."):
            target = getattr(target, part)
        job_type = target.job_type
        kwargs = job_type.arguments(job.payload)
        loop = blocking._portal()
        ctx = JobContext(job, worker_id=f"child-{job.id}", port=port, loop=loop)
        task_box: list[asyncio.Task[Any]] = []

        def listen() -> None:
            while True:
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    return
                if message[0] == "cancel":
                    ctx._mark_cancelled("cancel requested")
                    for task in task_box:
                        task.get_loop().call_soon_threadsafe(task.cancel)
                elif message[0] == "checkpoint_done":
                    port.replies.put((message[1], message[2]))

        threading.Thread(target=listen, daemon=True).start()
        port.send(("started",))
        if job_type.is_async:

            async def main() -> Any:
                task = asyncio.ensure_future(job_type.fn(ctx, **kwargs))
                task_box.append(task)
                return await task

            result = asyncio.run(main())
        else:
            result = job_type.fn(ctx, **kwargs)
        port.flush()
        port.send(("result", result))
    except Retry as exc:
        port.flush()
        port.send(("retry", exc.after, exc.reason))
    except (Cancel, asyncio.CancelledError) as exc:
        port.flush()
        port.send(("cancel", str(exc) or "cancelled"))
    except BaseException as exc:
        final = False
        with contextlib.suppress(Exception):
            final = isinstance(exc, target.job_type.options.non_retryable)
        with contextlib.suppress(Exception):
            port.flush()
            port.send(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc(), final))
    finally:
        conn.close()
