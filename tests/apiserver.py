"""Serve a conveyor API over real HTTP for tests: uvicorn on a free loopback port, in a
thread with an event loop of its own."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI

from conveyor import Conveyor
from conveyor.web import ApiOptions, create_api

# A database deadline a loaded machine keeps within: the default 0.5 s for a token or
# health check can pass on a busy CI box, and a 503 is not what most tests are about.
LOADED_DB_TIMEOUT = 10.0


def api_for_tests(app: Conveyor, **options: Any) -> FastAPI:
    """The REST API of ``app`` with ``options``, and a generous database deadline unless
    ``db_timeout`` is given (the tests of the deadline itself give it)."""
    return create_api(app, options=ApiOptions(**{"db_timeout": LOADED_DB_TIMEOUT, **options}))


class ServerThread:
    """Runs ``api`` on 127.0.0.1 until :meth:`stop`; ``base_url`` is where it listens."""

    def __init__(self, app: Conveyor, api: FastAPI) -> None:
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(api, lifespan="off", log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._run, name="test-api-server", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        async def serve() -> None:
            try:
                await self.server.serve(sockets=[self.sock])
            finally:
                await self.app.close()  # the store this loop opened

        try:
            asyncio.run(serve())
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the test API server did not start: {self.error!r}")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()
        if self.error is not None:
            raise self.error


@contextmanager
def serving(app: Conveyor, api: FastAPI) -> Iterator[ServerThread]:
    server = ServerThread(app, api)
    server.start()
    try:
        yield server
    finally:
        server.stop()
