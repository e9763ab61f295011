"""The one thin adapter for code that is not async: run conveyor's coroutines on a portal.

A portal is an event loop on a daemon thread of its own. ``Blocking(obj).method(...)``
runs ``obj.method(...)`` there and waits for its result, so scripts, Django views and
the CLI use the same async code paths as everything else.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _portal() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="conveyor-portal", daemon=True)
            thread.start()
            _loop = loop
        return _loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on the portal loop and return its result (blocking the caller)."""
    loop = _portal()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise RuntimeError("blocking conveyor calls cannot be made from the portal loop itself")
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


class Blocking:
    """A view of an object whose coroutine methods block until done."""

    def __init__(self, target: object) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        @functools.wraps(attr)
        def call(*args: Any, **kwargs: Any) -> Any:
            return run(attr(*args, **kwargs))

        return call
