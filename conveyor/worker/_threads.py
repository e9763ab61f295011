"""Threads for sync handlers: one per running handler, idle ones reused."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import queue
import threading
from collections.abc import Callable
from typing import Any

from conveyor.worker.context import JobContext


class HandlerThreads:
    """Threads for sync handlers: an idle one is reused, or else a new one is started.

    A thread is never shared while busy, so a handler abandoned past its cancel grace,
    whose thread cannot be stopped, delays no other job: the job that takes its slot
    gets another thread at once. At most ``keep`` idle threads are kept.
    """

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._work: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._started = 0
        self._closed = False

    def submit(self, work: Callable[[], None]) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the worker's handler threads are shut down")
            start = self._idle == 0
            if start:
                self._started += 1
                number = self._started
            else:
                self._idle -= 1  # one idle thread is now spoken for
        self._work.put(work)
        if start:
            threading.Thread(
                target=self._serve, name=f"conveyor-handler-{number}", daemon=True
            ).start()

    def _serve(self) -> None:
        while True:
            work = self._work.get()
            if work is None:
                return
            work()
            with self._lock:
                if self._closed or self._idle >= self._keep:
                    return
                self._idle += 1

    def shutdown(self) -> None:
        """Stop the idle threads; busy ones end when their handler returns."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, 0
        for _ in range(idle):
            self._work.put(None)


def in_thread(
    threads: HandlerThreads,
    loop: asyncio.AbstractEventLoop,
    fn: Callable[..., Any],
    ctx: JobContext,
    kwargs: dict[str, Any],
    traced: bool,
) -> asyncio.Future[Any]:
    """Call a sync handler on a thread of its own; the future gets its outcome."""
    future: asyncio.Future[Any] = loop.create_future()

    def deliver(result: Any, error: BaseException | None) -> None:
        if future.cancelled():
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    def call() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (fn(ctx, **kwargs), None)
        except BaseException as exc:
            outcome = (None, exc)
        try:
            loop.call_soon_threadsafe(deliver, *outcome)
        except RuntimeError:
            pass  # the loop is closed: an abandoned handler outlived its worker

    # A traced attempt's span is current in the handler's thread too.
    if traced:
        threads.submit(functools.partial(contextvars.copy_context().run, call))
    else:
        threads.submit(call)
    return future
