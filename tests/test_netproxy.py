"""The chaos suite's fault-injecting TCP proxy, on its own, in front of a real echo server
(and once in front of the real PostgreSQL server)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator

import psycopg
import pytest

from chaos.netproxy import NetProxy, ProxyProcess


class Echo:
    """An echo server that counts the connections and bytes it received."""

    def __init__(self) -> None:
        self.accepted = 0
        self.received = 0
        self.resets = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> Echo:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            while data := await reader.read(65536):
                self.received += len(data)
                writer.write(data)
                await writer.drain()
        except ConnectionResetError:
            self.resets += 1
        finally:
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


@pytest.fixture
async def echo() -> AsyncIterator[Echo]:
    server = await Echo().start()
    yield server
    await server.close()


@pytest.fixture
async def proxy(echo: Echo) -> AsyncIterator[NetProxy]:
    p = await NetProxy(("127.0.0.1", echo.port)).start()
    yield p
    await p.close()


async def until(predicate: object, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0.005)


async def roundtrip(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    await writer.drain()
    got = await reader.readexactly(len(payload))
    writer.close()
    return got


async def test_bytes_pass_both_ways_unchanged_and_in_order(proxy: NetProxy, echo: Echo) -> None:
    payload = os.urandom(3 * 1024 * 1024)
    assert await roundtrip(proxy.port, payload) == payload
    assert echo.received == len(payload)


async def test_delay_is_added_in_each_direction_without_reordering(proxy: NetProxy) -> None:
    proxy.delay(upstream=0.03, downstream=0.02)
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    started = time.monotonic()
    for i in range(5):
        writer.write(b"%d;" % i)
    await writer.drain()
    got = b""
    while len(got) < 10:
        got += await reader.read(100)
    # Held at least 30 ms towards the server and 20 ms back (a lower bound only).
    assert time.monotonic() - started >= 0.05
    assert got == b"0;1;2;3;4;"
    writer.close()


async def test_stall_holds_bytes_on_open_connections_until_healed(
    proxy: NetProxy, echo: Echo
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"hello")
    assert await reader.readexactly(5) == b"hello"
    proxy.stall()
    seen = proxy.bytes_seen
    writer.write(b"held")
    await writer.drain()
    await until(lambda: proxy.bytes_seen > seen)  # the proxy has the bytes...
    await asyncio.sleep(0)
    assert echo.received == 5  # ...and the server has not
    proxy.heal()
    assert await reader.readexactly(4) == b"held"
    writer.close()


async def test_blackhole_connects_nothing_until_healed(proxy: NetProxy, echo: Echo) -> None:
    proxy.blackhole()
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"anyone?")
    await writer.drain()
    await until(lambda: proxy.bytes_seen >= 7)
    assert proxy.connections == 1
    assert echo.accepted == 0  # the client is connected to the proxy, not to the server
    proxy.heal()
    assert await reader.readexactly(7) == b"anyone?"
    assert echo.accepted == 1
    writer.close()


async def test_reset_closes_connections_with_rst(proxy: NetProxy, echo: Echo) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"x")
    assert await reader.readexactly(1) == b"x"
    assert proxy.reset() == 1
    with pytest.raises(ConnectionResetError):
        await reader.readexactly(1)
    await until(lambda: echo.resets == 1)
    writer.close()
    # The proxy still serves new connections.
    assert await roundtrip(proxy.port, b"again") == b"again"


async def test_a_proxy_process_is_driven_over_its_control_channel(echo: Echo) -> None:
    proc = await ProxyProcess(("127.0.0.1", echo.port)).start()
    try:
        assert await roundtrip(proc.port, b"ping") == b"ping"
        answer = await proc.command("delay 10 10")
        assert "delay 10 10" in answer
        started = time.monotonic()
        assert await roundtrip(proc.port, b"slow") == b"slow"
        assert time.monotonic() - started >= 0.02
        assert (await proc.command("blackhole")).startswith("ok blackhole")
        assert (await proc.command("heal")).startswith("ok flowing")
        with pytest.raises(RuntimeError, match="unknown command 'sever'"):
            await proc.command("sever")
    finally:
        await proc.close()


async def test_postgres_through_the_proxy_hangs_in_a_partition_and_recovers(
    postgres_database: str,
) -> None:
    target = psycopg.conninfo.conninfo_to_dict(postgres_database)
    host, port = str(target.get("host") or "127.0.0.1"), int(target.get("port") or 5432)
    proxy = await NetProxy((host, port)).start()
    url = psycopg.conninfo.make_conninfo(postgres_database, host="127.0.0.1", port=proxy.port)
    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            assert await (await conn.execute("SELECT 1")).fetchone() == (1,)
            proxy.blackhole()
            query = asyncio.ensure_future(conn.execute("SELECT 2"))
            done, _ = await asyncio.wait({query}, timeout=0.3)
            assert not done  # no answer through a partition
            proxy.heal()
            assert await (await query).fetchone() == (2,)
            proxy.reset()
            with pytest.raises(psycopg.OperationalError):
                await conn.execute("SELECT 3")
    finally:
        await proxy.close()
