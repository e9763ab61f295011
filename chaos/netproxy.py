"""A fault-injecting TCP proxy on 127.0.0.1: the network between workers and PostgreSQL.

``tc netem`` needs privileges and kernel modules these machines lack, so the chaos suite
and the benchmark put this proxy between a worker and its database instead, and change
the network under the worker while it runs:

- **latency**: every chunk of bytes is held ``delay`` seconds in its direction before it
  is passed on, in order (``delay(upstream=0.01, downstream=0.01)`` adds 20 ms to every
  round trip), without limiting how many bytes are in flight;
- **stall**: bytes stop moving in both directions on every connection, new ones included;
  nothing is dropped, and everything held moves on at ``heal()``, as TCP retransmits
  once a path comes back;
- **blackhole** (a partition): as a stall, and new connections are not even opened
  towards the database until ``heal()``: a client connecting meanwhile gets no greeting
  and waits for its own connect timeout. The kernel still accepts the client's TCP
  connection and answers its keepalives, so only the application's own timeouts notice;
- **reset**: every open connection is closed with a TCP RST on both sides at once.

In the same process: ``proxy = await NetProxy(("127.0.0.1", 5432)).start()``, point the
client at ``proxy.port``, call the fault methods, ``await proxy.close()``.

In a process of its own (``python -m chaos.netproxy --target 127.0.0.1:5432``), so that
neither the proxy's timing nor the caller's suffers from the other's event loop: it prints
``listening <port>`` and then takes one command per line on stdin (``delay UP DOWN`` in
milliseconds, ``stall``, ``blackhole``, ``heal``, ``reset``, ``stats``), answering each
with one line starting ``ok``. :class:`ProxyProcess` drives it from asyncio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import struct
import sys
from collections import deque
from dataclasses import dataclass, field

READ_SIZE = 65536


@dataclass
class _Pipe:
    """One direction of one connection: chunks waiting for their time to be passed on."""

    chunks: deque[tuple[float, bytes]] = field(default_factory=deque)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    eof: bool = False


class _Connection:
    def __init__(self, proxy: NetProxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.proxy = proxy
        self.client_reader, self.client_writer = reader, writer
        self.server_writer: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []

    async def serve(self) -> None:
        up, down = _Pipe(), _Pipe()
        loop = asyncio.get_running_loop()
        # The client's bytes are read (and held) even before the database is connected:
        # a client in a partition sends into the void and waits, it is not refused.
        self.tasks.append(loop.create_task(self._read(self.client_reader, up, upstream=True)))
        try:
            await self.proxy._flowing_for_new.wait()
            if self.proxy.closing:
                raise ConnectionAbortedError("the proxy is closing")
            reader, self.server_writer = await asyncio.open_connection(*self.proxy.target)
        except OSError:
            self.abort()
            return
        self.tasks += [
            loop.create_task(self._write(up, self.server_writer)),
            loop.create_task(self._read(reader, down, upstream=False)),
            loop.create_task(self._write(down, self.client_writer)),
        ]
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.close()

    async def _read(self, reader: asyncio.StreamReader, pipe: _Pipe, *, upstream: bool) -> None:
        loop = asyncio.get_running_loop()
        try:
            while data := await reader.read(READ_SIZE):
                delay = self.proxy.upstream_delay if upstream else self.proxy.downstream_delay
                pipe.chunks.append((loop.time() + delay, data))
                pipe.arrived.set()
                self.proxy.bytes_seen += len(data)
                if upstream:
                    self.proxy.reads_upstream += 1
        except OSError:
            pass
        pipe.eof = True
        pipe.arrived.set()

    async def _write(self, pipe: _Pipe, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                while not pipe.chunks:
                    if pipe.eof:
                        writer.write_eof()
                        return
                    pipe.arrived.clear()
                    await pipe.arrived.wait()
                due, data = pipe.chunks[0]
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                await self.proxy._flowing.wait()
                pipe.chunks.popleft()
                writer.write(data)
                await writer.drain()
        except OSError:
            self.abort()

    def abort(self) -> None:
        """Close both sides with a TCP RST (SO_LINGER 0), not an orderly FIN."""
        for writer in (self.client_writer, self.server_writer):
            if writer is None:
                continue
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        for task in self.tasks:
            task.cancel()

    def close(self) -> None:
        for writer in (self.client_writer, self.server_writer):
            if writer is not None:
                writer.close()


class NetProxy:
    """Forwards TCP connections from 127.0.0.1:``port`` to ``target`` with injected faults."""

    def __init__(self, target: tuple[str, int], *, port: int = 0) -> None:
        self.target = target
        self.port = port
        self.upstream_delay = 0.0
        self.downstream_delay = 0.0
        self.bytes_seen = 0
        # Reads from clients: about one per round trip a client starts (a client that
        # pipelines several statements may send them in one read or in several).
        self.reads_upstream = 0
        self.mode = "flowing"
        self.closing = False
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._flowing_for_new = asyncio.Event()
        self._flowing_for_new.set()

    async def start(self) -> NetProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(self, reader, writer)
        self._connections.add(conn)
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            await conn.serve()
        finally:
            self._connections.discard(conn)
            if task is not None:
                self._handlers.discard(task)

    @property
    def connections(self) -> int:
        """How many client connections are open through the proxy now."""
        return len(self._connections)

    def delay(self, *, upstream: float = 0.0, downstream: float = 0.0) -> None:
        """Hold each chunk this many seconds towards the database / towards the client.

        Applies to bytes read from now on; bytes already held keep their time.
        """
        if upstream < 0 or downstream < 0:
            raise ValueError("a delay is a number of seconds, 0 or more")
        self.upstream_delay, self.downstream_delay = upstream, downstream

    def stall(self) -> None:
        """Stop every byte in both directions until :meth:`heal`; connections stay open."""
        self.mode = "stalled"
        self._flowing.clear()

    def blackhole(self) -> None:
        """A partition: nothing passes, and new connections reach nothing, until :meth:`heal`."""
        self.mode = "blackhole"
        self._flowing.clear()
        self._flowing_for_new.clear()

    def heal(self) -> None:
        """End a stall or a partition: what was held moves on, in order."""
        self.mode = "flowing"
        self._flowing.set()
        self._flowing_for_new.set()

    def reset(self) -> int:
        """Close every open connection with an RST on both sides; return how many."""
        conns = list(self._connections)
        for conn in conns:
            conn.abort()
        return len(conns)

    async def close(self) -> None:
        self.closing = True
        if self._server is not None:
            self._server.close()
        self.reset()
        self._flowing_for_new.set()  # connections waiting for a partition to end give up
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=5)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def command(self, line: str) -> str:
        """Carry out one control-channel command; return the answer line."""
        words = line.split()
        if not words:
            return "error: empty command"
        verb, args = words[0], words[1:]
        try:
            if verb == "delay":
                up, down = (float(a) / 1000 for a in (args + args)[:2])
                self.delay(upstream=up, downstream=down)
            elif verb in ("stall", "blackhole", "heal"):
                getattr(self, verb)()
            elif verb == "reset":
                return f"ok reset {self.reset()}"
            elif verb != "stats":
                return (
                    f"error: unknown command {verb!r} (delay, stall, blackhole, heal, reset, stats)"
                )
        except ValueError as exc:
            return f"error: {exc}"
        return (
            f"ok {self.mode} connections {self.connections} bytes {self.bytes_seen} "
            f"reads {self.reads_upstream} "
            f"delay {self.upstream_delay * 1000:g} {self.downstream_delay * 1000:g}"
        )


class ProxyProcess:
    """A :class:`NetProxy` in a process of its own, driven over its stdin/stdout."""

    def __init__(self, target: tuple[str, int], *, python: str = sys.executable) -> None:
        self.target = target
        self.python = python
        self.port = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> ProxyProcess:
        self._proc = await asyncio.create_subprocess_exec(
            self.python, "-m", "chaos.netproxy", "--target", f"{self.target[0]}:{self.target[1]}",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert self._proc.stdout is not None
        first = (await asyncio.wait_for(self._proc.stdout.readline(), 30)).decode().split()
        if first[:1] != ["listening"]:
            raise RuntimeError(f"the proxy did not start: {first}")
        self.port = int(first[1])
        return self

    async def command(self, line: str) -> str:
        """Send one command; return the proxy's answer, or raise if it is not ``ok``."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise RuntimeError("the proxy is not running")
        async with self._lock:
            proc.stdin.write(line.encode() + b"\n")
            await proc.stdin.drain()
            answer = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()
        if not answer.startswith("ok"):
            raise RuntimeError(f"proxy command {line!r}: {answer or 'no answer'}")
        return answer

    async def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def _serve(target: tuple[str, int], port: int, delay_ms: float) -> None:
    proxy = await NetProxy(target, port=port).start()
    proxy.delay(upstream=delay_ms / 2000, downstream=delay_ms / 2000)
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    print(f"listening {proxy.port}", flush=True)
    try:
        while line := await stdin.readline():
            print(proxy.command(line.decode()), flush=True)
    finally:
        await proxy.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m chaos.netproxy", description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True, help="HOST:PORT to forward to")
    p.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    p.add_argument("--rtt-ms", type=float, default=0.0, help="added round-trip time, split evenly")
    args = p.parse_args(argv)
    host, _, port = args.target.rpartition(":")
    if not host or not port.isdigit():
        p.error(f"--target {args.target!r}: write HOST:PORT, such as 127.0.0.1:5432")
    asyncio.run(_serve((host, int(port)), args.port, args.rtt_ms))


if __name__ == "__main__":
    main()
