"""Real servers for the hardening tests: ``conveyor serve`` in a process of its own, and a
TCP relay to PostgreSQL that a test can cut, as a database that went away."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.apps.api:app"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    base: str
    port: int
    token: str  # the admin token serve created on loopback
    proc: subprocess.Popen[bytes]
    log: Path

    def rss_bytes(self) -> int:
        """The server process's resident set size, from /proc."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS in /proc status")


@contextmanager
def serving_process(db_url: str, tmp_path: Path, *options: str) -> Iterator[Served]:
    """``conveyor serve`` on a free loopback port with ``options``, until the block ends."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), CONVEYOR_DATABASE_URL=db_url)
    log = tmp_path / f"serve-{port}.err"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "conveyor", "serve", APP, "--port", str(port), *options],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
        )
    try:
        assert proc.stdout is not None
        token = proc.stdout.readline().decode().strip()
        assert token.startswith("cvt_"), log.read_text()
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/health/live").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield Served(base, port, token, proc, log)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


class Relay:
    """Forward connections from a loopback port to ``target`` until :meth:`cut`, which
    closes the port and every connection through it: the database is gone."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.open = True
        threading.Thread(target=self._accept, name="relay", daemon=True).start()

    def _accept(self) -> None:
        while self.open:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self.lock:
                if not self.open:
                    client.close()
                    upstream.close()
                    return
                self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        with self.lock:
            self.open = False
            self.listener.close()
            for s in self.sockets:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            self.sockets.clear()
