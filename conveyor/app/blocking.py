"""The one thin adapter for code that is not async: run conveyor's coroutines on a portal.

A portal is an event loop on a daemon thread of its own. ``Blocking(obj).method(...)``
runs ``obj.method(...)`` there and waits for its result, so scripts, Django views and
the CLI use the same async code paths as everything else.

At interpreter exit the objects used through the portal are closed on it (their
``close()`` coroutine, e.g. a PostgreSQL pool's), so a script need not call
``app.sync.close()`` and exits without "Task was destroyed but it is pending!".
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import inspect
import threading
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
# Objects whose methods ran on the portal: closed there at exit.
_users: weakref.WeakSet[Any] = weakref.WeakSet()
# How long closing at exit may take before the interpreter leaves anyway.
_CLOSE_AT_EXIT = 5.0


def _portal() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="conveyor-portal", daemon=True)
            thread.start()
            if _loop is None:
                atexit.register(_close_at_exit)
            _loop = loop
        return _loop


def portal_loop() -> asyncio.AbstractEventLoop | None:
    """The portal's event loop, if one was started (and is not closed)."""
    loop = _loop
    return None if loop is None or loop.is_closed() else loop


def _close_at_exit() -> None:
    """Close what was used through the portal, on the portal, then stop its loop."""
    loop = _loop
    if loop is None or loop.is_closed() or not loop.is_running():
        return
    for user in list(_users):
        close = getattr(user, "close", None)
        if close is None or not inspect.iscoroutinefunction(close):
            continue
        try:
            asyncio.run_coroutine_threadsafe(close(), loop).result(_CLOSE_AT_EXIT)
        except Exception:  # exiting anyway: a close that fails must not hide the real exit
            pass
    loop.call_soon_threadsafe(loop.stop)


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
        try:
            _users.add(target)
        except TypeError:  # not weakly referenceable: not closed at exit
            pass

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        @functools.wraps(attr)
        def call(*args: Any, **kwargs: Any) -> Any:
            return run(attr(*args, **kwargs))

        return call
